"""`sagemaker://ENDPOINT` and `lambda://FUNCTION` load: boto3 calls, one thread per connection (boto3 is
synchronous; each call costs the client about a millisecond of CPU, so past a few hundred requests per second
run several load generators). Also which credentials a missing-keys error points to."""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from servestack.loadtest.report import ErrorBodies, Sample

LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def is_local(url: str | None) -> bool:
    """Whether a URL points at this machine (local up's fronts and endpoints)."""
    return bool(url) and urllib.parse.urlsplit(url).hostname in LOCAL_HOSTS


def keys_hint(local: bool) -> str:
    """How to give credentials: local up's documented developer keys for a local target, else AWS's ways."""
    if local:
        return (
            "local up takes the developer keys local/local: export AWS_ACCESS_KEY_ID=local "
            "AWS_SECRET_ACCESS_KEY=local (or AWS_PROFILE naming a profile with those keys)"
        )
    return "run `aws configure`, or set AWS_PROFILE or AWS_ACCESS_KEY_ID (--no-sign sends https requests unsigned)"


@dataclass(frozen=True)
class SdkTarget:
    """`sagemaker://ENDPOINT` or `lambda://FUNCTION`, called through boto3 as an application would."""

    service: str  # "sagemaker" or "lambda"
    name: str
    body: bytes
    content_type: str
    region: str | None = None
    endpoint_url: str | None = None

    @classmethod
    def from_url(
        cls, url: str, body: bytes, content_type: str, *, region: str | None = None, endpoint_url: str | None = None
    ) -> SdkTarget:
        parsed = urllib.parse.urlsplit(url)
        name = parsed.netloc + parsed.path.rstrip("/")
        if parsed.scheme not in ("sagemaker", "lambda") or not name:
            raise ValueError(f"url: {url!r} is not sagemaker://ENDPOINT or lambda://FUNCTION")
        return cls(parsed.scheme, name, body, content_type, region, endpoint_url)

    def client(self, pool: int, timeout_sec: float) -> Any:
        import boto3
        from botocore.config import Config

        config = Config(
            max_pool_connections=pool,
            retries={"max_attempts": 1, "mode": "standard"},  # measure the service, not botocore's retries
            read_timeout=timeout_sec,
            connect_timeout=min(timeout_sec, 10),
        )
        session = boto3.session.Session()
        if session.get_credentials() is None:
            from servestack.failures import CommandError, ExitCode

            raise CommandError(f"no AWS credentials found: {keys_hint(is_local(self.endpoint_url))}", ExitCode.AWS)
        service = "sagemaker-runtime" if self.service == "sagemaker" else "lambda"
        return session.client(service, region_name=self.region, endpoint_url=self.endpoint_url, config=config)

    def caller(self, client: Any) -> Callable[[], tuple[int, str | None, bytes | None]]:
        """One call -> (status, error name, error body); status 0 when no HTTP answer came back, an error body
        for a non-2xx answer."""
        from botocore.exceptions import BotoCoreError, ClientError

        if self.service == "sagemaker":

            def send() -> tuple[int, bytes | None]:
                answer = client.invoke_endpoint(EndpointName=self.name, ContentType=self.content_type, Body=self.body)
                answer["Body"].read()
                return 200, None

        else:
            from servestack.local.lambda_.runtime import http_api_event

            event = http_api_event(
                "POST", "/invocations", {"content-type": self.content_type}, self.body, "loadtest", "127.0.0.1"
            )
            payload = json.dumps(event).encode()

            def send() -> tuple[int, bytes | None]:
                answer = client.invoke(FunctionName=self.name, Payload=payload)
                raw = answer["Payload"].read() or b"null"
                if answer.get("FunctionError"):
                    return 500, raw  # what API Gateway answers when the function fails
                reply = json.loads(raw)
                status = int(reply.get("statusCode", 200)) if isinstance(reply, dict) else 200
                if 200 <= status < 300:
                    return status, None
                return status, str(reply.get("body", "")).encode()

        def call() -> tuple[int, str | None, bytes | None]:
            try:
                status, said = send()
                return status, None, said
            except ClientError as error:
                status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
                code = str(error.response.get("Error", {}).get("Code"))
                return status, None if status else code, str(error).encode()
            except (BotoCoreError, OSError) as error:
                return 0, type(error).__name__, None

        return call


def sdk_closed_loop(
    target: SdkTarget, concurrency: int, duration_sec: float, timeout_sec: float, error_bodies: ErrorBodies
) -> list[Sample]:
    call = target.caller(target.client(concurrency, timeout_sec))
    samples: list[Sample] = []
    stop_at = time.perf_counter() + duration_sec
    said = threading.Lock()  # the callers are threads: one adds an error body at a time

    def worker() -> None:
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            status, error, body = call()
            samples.append(Sample(started, time.perf_counter() - started, status, error))  # list.append is atomic
            if body is not None:
                with said:
                    error_bodies.add(status, body)

    threads = [threading.Thread(target=worker, name=f"loadtest-{i}", daemon=True) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return samples


def sdk_open_loop(
    target: SdkTarget,
    rate: float,
    duration_sec: float,
    timeout_sec: float,
    max_connections: int,
    error_bodies: ErrorBodies,
) -> list[Sample]:
    workers = max(1, min(max_connections, math.ceil(rate * timeout_sec)))
    call = target.caller(target.client(workers, timeout_sec))
    samples: list[Sample] = []
    said = threading.Lock()

    def one(scheduled: float) -> None:
        status, error, body = call()
        samples.append(Sample(scheduled, time.perf_counter() - scheduled, status, error))
        if body is not None:
            with said:
                error_bodies.add(status, body)

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="loadtest") as pool:
        for index in range(int(rate * duration_sec)):
            scheduled = start + index / rate
            if (delay := scheduled - time.perf_counter()) > 0:
                time.sleep(delay)
            pool.submit(one, scheduled)
    return samples
