"""Async acceptance run: N jobs with P poison payloads, the poller SIGKILLed mid-run and restarted.

    .venv/bin/python -m bench.async_jobs --jobs 1000 --poison 20

Real parts only: a moto server over HTTP (`moto_server` subprocess, or AWS_ENDPOINT_URL), the submit
handler called with HTTP API v2 events, and the poller as its own process (`servestack.local.runner
poller`) calling the worker handler with SQS batch events. Checks and prints: results written exactly
once (one S3 version per result key), failed jobs with reasons, DLQ messages = the poison jobs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from servestack.local.emulator import aws_environment, clients
from servestack.local.lambda_runtime import LambdaContext, http_api_event
from servestack.local.processes import REPO_ROOT, free_port, http_status
from servestack.spec import AsyncDeployment, parse_spec
from tests.integration.resources import ensure_async, environment, names


def start_moto() -> tuple[subprocess.Popen[bytes] | None, str]:
    if os.environ.get("AWS_ENDPOINT_URL"):
        return None, os.environ["AWS_ENDPOINT_URL"]
    port = free_port()
    moto = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        if http_status(f"{url}/moto-api/") is not None:
            break
        time.sleep(0.1)
    return moto, url


def depth(sqs: Any, url: str) -> int:
    names_ = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names_)["Attributes"]
    return sum(int(attributes[n]) for n in names_)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--poison", type=int, default=20)
    parser.add_argument("--kill-after", type=int, default=300, help="SIGKILL the poller after this many results")
    parser.add_argument("--visibility-timeout-sec", type=int, default=5)
    args = parser.parse_args()
    moto, url = start_moto()
    os.environ.update(aws_environment(url))
    name = f"bench{random.randrange(16**6):06x}"
    raw = {
        "models": [{"name": "breast-cancer", "version": 1}],
        "deployments": {name: {"mode": "async", "model": "breast-cancer", "batch_size": 10, "batch_window_sec": 0,
                               "max_receive_count": 3}},
    }  # fmt: skip
    spec = parse_spec(raw)
    d = spec.deployments[name]
    assert isinstance(d, AsyncDeployment)
    aws = clients(url)
    queue_url = ensure_async(aws, name, d, visibility_timeout=args.visibility_timeout_sec)
    n = names(name, d)
    dlq_url = aws["sqs"].get_queue_url(QueueName=n.dlq)["QueueUrl"]
    env = environment(spec, name, queue_url=queue_url)
    os.environ.update(env)
    spec_file = Path(tempfile.mkdtemp()) / "serving.yaml"
    spec_file.write_text(yaml.safe_dump(raw))
    from sklearn.datasets import load_breast_cancer

    from handlers.asynchronous import submit_handler

    rows = load_breast_cancer().data.astype(np.float32)
    poison_at = set(random.sample(range(args.jobs), args.poison))
    good: set[str] = set()
    poison: set[str] = set()
    started = time.perf_counter()
    for i in range(args.jobs):
        row = rows[i % len(rows)].tolist()
        body = json.dumps({"instances": [row[:29] if i in poison_at else row]}).encode()
        event = http_api_event("POST", "/jobs", {"content-type": "application/json"}, body, "bench", "127.0.0.1")
        response = submit_handler(event, LambdaContext("submit", 15, 512))
        job_id = json.loads(response["body"])["job_id"]
        (poison if i in poison_at else good).add(job_id)
    submitted = time.perf_counter() - started
    print(f"submitted {args.jobs} jobs ({args.poison} poison) in {submitted:.1f}s")

    def poller() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "servestack.local.runner", "poller", name, "--spec", str(spec_file)],
            cwd=REPO_ROOT, env={**os.environ}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def results() -> int:
        pages = aws["s3"].get_paginator("list_objects_v2").paginate(Bucket=n.bucket, Prefix=n.result_prefix)
        return sum(len(page.get("Contents", [])) for page in pages)

    started = time.perf_counter()
    first = poller()
    while results() < args.kill_after:
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait()
    at_kill = results()
    print(f"SIGKILLed the poller with {at_kill} results written; restarting it")
    second = poller()
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and (
        depth(aws["sqs"], queue_url) > 0 or depth(aws["sqs"], dlq_url) < args.poison
    ):
        time.sleep(0.5)
    elapsed = time.perf_counter() - started
    second.send_signal(signal.SIGTERM)
    second.wait(timeout=30)

    table = aws["dynamodb"]
    statuses: dict[str, str] = {}
    reasons: dict[str, str] = {}
    for page in table.get_paginator("scan").paginate(TableName=n.table):
        for item in page["Items"]:
            statuses[item["job_id"]["S"]] = item["status"]["S"]
            if "error" in item:
                reasons[item["job_id"]["S"]] = item["error"]["M"]["message"]["S"]
    versions: dict[str, int] = {}
    for page in aws["s3"].get_paginator("list_object_versions").paginate(Bucket=n.bucket, Prefix=n.result_prefix):
        for v in page.get("Versions", []):
            versions[v["Key"]] = versions.get(v["Key"], 0) + 1
    dead: list[str] = []
    while True:
        got = aws["sqs"].receive_message(QueueUrl=dlq_url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
        if not got.get("Messages"):
            break
        for m in got["Messages"]:
            dead.append(json.loads(m["Body"])["job_id"])
            aws["sqs"].delete_message(QueueUrl=dlq_url, ReceiptHandle=m["ReceiptHandle"])
    checks = {
        "succeeded jobs": sum(1 for j in good if statuses.get(j) == "succeeded"),
        "result objects": len(versions),
        "result keys with more than one version": sum(1 for c in versions.values() if c > 1),
        "failed jobs (poison) with a reason": sum(1 for j in poison if statuses.get(j) == "failed" and reasons.get(j)),
        "DLQ messages": len(dead),
        "DLQ messages that are poison jobs": len(set(dead) & poison),
    }
    for label, value in checks.items():
        print(f"{label:>40}: {value}")
    print(f"{'example reason':>40}: {next(iter(reasons.values()), '')[:100]}")
    print(f"{'processing time (with kill + restart)':>40}: {elapsed:.1f}s ({len(good) / elapsed:.0f} jobs/s)")
    ok = (
        checks["succeeded jobs"] == len(good) == checks["result objects"]
        and checks["result keys with more than one version"] == 0
        and checks["failed jobs (poison) with a reason"] == len(poison) == checks["DLQ messages"]
        and checks["DLQ messages that are poison jobs"] == len(poison)
    )
    print("PASS" if ok else "FAIL")
    if moto is not None:
        moto.terminate()
        moto.wait()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
