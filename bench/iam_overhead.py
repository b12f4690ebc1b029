"""What IAM enforcement adds to a call on the local emulator: S3 GetObject of a 1 KiB object.

    .venv/bin/python -m bench.iam_overhead --requests 2000 --runs 3

1. End to end: one boto3 client (a role allowed `s3:GetObject` on the bucket) reads the same key in a loop
   from moto's `ThreadedMotoServer` and from `EnforcedMotoServer` (the same app behind `IamEnforcer.wsgi`);
   both in this process on free ports, each run alternating the two. Prints the median wall and CPU time per
   request of each, and the difference.
2. The engine alone: `IamEnforcer.evaluate_request` on the captured GetObject request (SigV4 verification,
   operation lookup, policy evaluation), timed with `timeit` in CPU time; and `evaluate` alone, the policy
   decision.
It prints figures and never passes or fails on time.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
import timeit
import uuid
from collections.abc import Callable
from typing import Any

import boto3
from botocore.config import Config

from servestack.local.iam import IamEnforcer, IdentityStore, ResourcePolicies
from servestack.local.iam.conditions import normalise_context
from servestack.local.iam.policy import evaluate
from servestack.local.iam.server import EnforcedMotoServer
from servestack.local.iam.wire import HttpRequest


def serve_bare() -> tuple[str, Callable[[], None]]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return f"http://{host}:{port}", server.stop


def client(url: str, key: str, secret: str, token: str | None) -> Any:
    session = boto3.Session(
        aws_access_key_id=key, aws_secret_access_key=secret, aws_session_token=token, region_name="us-east-1"
    )
    return session.client(
        "s3", endpoint_url=url, config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1})
    )


def per_request_ms(s3: Any, bucket: str, requests: int) -> tuple[float, float]:
    """(wall, CPU) milliseconds per request. Client and server share this process, so its CPU time covers
    both sides and, unlike wall time, hardly moves with what else the machine runs."""
    s3.get_object(Bucket=bucket, Key="object")["Body"].read()  # warm the connection
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(requests):
        s3.get_object(Bucket=bucket, Key="object")["Body"].read()
    return (time.perf_counter() - wall) / requests * 1000, (time.process_time() - cpu) / requests * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    store = IdentityStore()
    developer = store.developer()
    reader = store.role(
        "BenchReader",
        {
            "Policy": {
                "Version": "2012-10-17",
                "Statement": [
                    {
                        "Effect": "Allow",
                        "Action": ["s3:GetObject", "s3:ListBucket"],
                        "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"],
                    },
                    {
                        "Effect": "Allow",
                        "Action": "sqs:SendMessage",
                        "Resource": "arn:aws:sqs:us-east-1:123456789012:other",
                    },
                    {"Effect": "Deny", "Action": "s3:DeleteObject", "Resource": "*"},
                ],
            }
        },
        session_name="bench",
    )
    enforcer = IamEnforcer(store, ResourcePolicies(), log=lambda line: None)
    bare_url, stop_bare = serve_bare()
    enforced_server = EnforcedMotoServer(enforcer).start()
    enforced_url, stop_enforced = enforced_server.url, enforced_server.stop
    try:
        setup = client(bare_url, developer.access_key_id, developer.secret_access_key, None)
        setup.create_bucket(Bucket=bucket)
        setup.put_object(Bucket=bucket, Key="object", Body=b"x" * 1024)
        bare = client(bare_url, reader.access_key_id, reader.secret_access_key, reader.session_token)
        enforced = client(enforced_url, reader.access_key_id, reader.secret_access_key, reader.session_token)
        bare_ms: list[tuple[float, float]] = []
        enforced_ms: list[tuple[float, float]] = []
        for _ in range(args.runs):
            bare_ms.append(per_request_ms(bare, bucket, args.requests))
            enforced_ms.append(per_request_ms(enforced, bucket, args.requests))
        captured: list[Any] = []
        enforced.meta.events.register("before-send", lambda request, **_: captured.append(request))
        enforced.get_object(Bucket=bucket, Key="object")["Body"].read()
    finally:
        stop_bare()
        stop_enforced()

    sent = captured[-1]
    split = sent.url.split("?", 1)
    headers = {
        name.lower(): value.decode() if isinstance(value, bytes) else value for name, value in sent.headers.items()
    }
    headers["host"] = enforced_url.removeprefix("http://")
    request = HttpRequest("GET", split[0].removeprefix(enforced_url), split[1] if len(split) > 1 else "", headers, b"")
    verdict = enforcer.evaluate_request(request)
    assert verdict.reply is None, "the captured request should be allowed"
    loops = 5000
    engine_us = (
        min(timeit.repeat(lambda: enforcer.evaluate_request(request), number=loops, repeat=3, timer=time.process_time))
        / loops
        * 1e6
    )
    context = normalise_context({"aws:SecureTransport": "true"})
    decision_us = (
        min(
            timeit.repeat(
                lambda: evaluate(
                    reader.caller,
                    "s3:GetObject",
                    f"arn:aws:s3:::{bucket}/object",
                    context,
                    identity_policies=reader.compiled,
                    resource_policy=None,
                ),
                number=loops * 10,
                repeat=3,
                timer=time.process_time,
            )
        )
        / (loops * 10)
        * 1e6
    )
    print(f"S3 GetObject (1 KiB), {args.requests} sequential requests x {args.runs} runs, median per request:")
    for label, index in (("wall", 0), ("CPU ", 1)):
        bare_median = statistics.median(run[index] for run in bare_ms)
        enforced_median = statistics.median(run[index] for run in enforced_ms)
        extra_ms, extra_share = enforced_median - bare_median, enforced_median / bare_median - 1
        print(
            f"  {label}: moto {bare_median:7.3f} ms, moto + IAM {enforced_median:7.3f} ms"
            f"  ({extra_ms:+.3f} ms, {extra_share:+.1%})"
        )
    print(f"engine alone: evaluate_request {engine_us:7.1f} us/request (SigV4 + describe + policy check)")
    print(f"              evaluate         {decision_us:7.2f} us/decision")


if __name__ == "__main__":
    main()
