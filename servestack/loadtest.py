"""`servestack loadtest`: drive an endpoint at a fixed rate (open loop) or concurrency (closed loop).

Targets: `http://` and `https://` URLs (https signed with SigV4 from botocore's credential chain, service
`execute-api` by default), `sagemaker://ENDPOINT` (boto3 `sagemaker-runtime.invoke_endpoint`) and
`lambda://FUNCTION` (boto3 `lambda.invoke` with an API Gateway HTTP API event, as the function's HTTP API
would send it).

For URLs the generator is a minimal HTTP/1.1 keep-alive client (an asyncio Protocol per connection): a
general-purpose client spends more CPU per request than the server it measures, and would report its own
limits instead. boto3 targets run one thread per connection (boto3 is synchronous; each call costs the client
about a millisecond of CPU, so past a few hundred requests per second run several load generators).
Open-loop latency counts from each request's scheduled start, so a stalled server cannot hide its queueing
(no coordinated omission). Reports QPS, errors by status, p50/p90/p99/max, and what to provision.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import math
import re
import ssl
import sys
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from servestack.sizing import exact

DEFAULT_PORTS = {"http": 80, "https": 443}
SIGN_EVERY_SEC = 60.0  # a SigV4 signature is accepted for 5 minutes after its X-Amz-Date; re-sign well before


Signer = Callable[["Target"], dict[str, str]]


@dataclass(frozen=True)
class Target:
    """An http(s) URL to POST `body` to; `signer` (SigV4) adds fresh auth headers every SIGN_EVERY_SEC."""

    host: str
    port: int
    path: str
    body: bytes
    content_type: str
    headers: tuple[tuple[str, str], ...] = ()
    scheme: str = "http"
    signer: Signer | None = None

    @classmethod
    def from_url(
        cls,
        url: str,
        body: bytes,
        content_type: str,
        headers: dict[str, str] | None = None,
        signer: Signer | None = None,
    ) -> Target:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in DEFAULT_PORTS or not parsed.hostname:
            raise ValueError(
                f"url: {url!r} is not a target: use http(s)://host[:port]/path, sagemaker://ENDPOINT or "
                "lambda://FUNCTION"
            )
        path = (parsed.path or "/invocations") + (f"?{parsed.query}" if parsed.query else "")
        return cls(
            parsed.hostname,
            parsed.port or DEFAULT_PORTS[parsed.scheme],
            path,
            body,
            content_type,
            tuple((headers or {}).items()),
            parsed.scheme,
            signer,
        )

    @property
    def host_header(self) -> str:
        """As botocore signs it: the port only when it is not the scheme's default."""
        return self.host if self.port == DEFAULT_PORTS[self.scheme] else f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host_header}{self.path}"

    def request_bytes(self) -> bytes:
        signed = self.signer(self) if self.signer is not None else {}
        lines = [
            f"POST {self.path} HTTP/1.1",
            f"Host: {self.host_header}",
            f"Content-Type: {self.content_type}",
            f"Content-Length: {len(self.body)}",
            *(f"{name}: {value}" for name, value in self.headers),
            *(f"{name}: {value}" for name, value in signed.items() if name.lower() not in _WRITTEN),
        ]
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + self.body


_WRITTEN = {"host", "content-type", "content-length"}


class RequestBytes:
    """The request to send, re-signed when its signature gets old (unsigned: built once)."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.built = target.request_bytes()
        self.at = time.monotonic()

    def current(self) -> bytes:
        if self.target.signer is not None and time.monotonic() - self.at > SIGN_EVERY_SEC:
            self.built, self.at = self.target.request_bytes(), time.monotonic()
        return self.built


def sigv4_signer(service: str, region: str, session: Any = None) -> Signer:
    """SigV4 headers (Authorization, X-Amz-Date, X-Amz-Security-Token) from botocore's credential chain."""
    import botocore.session

    from servestack.failures import CommandError, ExitCode
    from servestack.signing import sigv4_headers

    chosen = session or botocore.session.get_session()
    credentials = chosen.get_credentials()
    if credentials is None:
        raise CommandError(
            "no AWS credentials to sign with: run `aws configure`, or set AWS_PROFILE or AWS_ACCESS_KEY_ID "
            "(--no-sign sends https requests unsigned)",
            ExitCode.AWS,
        )

    def sign(target: Target) -> dict[str, str]:
        keys = credentials.get_frozen_credentials()
        return sigv4_headers(
            "POST", target.url, target.body, {"Content-Type": target.content_type},
            access_key_id=keys.access_key, secret_access_key=keys.secret_key, session_token=keys.token,
            service=service, region=region,
        )  # fmt: skip

    return sign


@dataclass
class Sample:
    started: float
    latency_sec: float
    status: int  # 0 when the request failed without a status (timeout, connection error)
    retry_after: str | None = None


@dataclass
class Report:
    mode: str
    duration_sec: float
    requests: int
    qps: float
    ok_qps: float
    statuses: dict[str, int]
    errors: dict[str, int]
    latency_ms: dict[str, float]
    ok_latency_ms: dict[str, float]
    retry_after_seen: int
    provisioning: dict[str, float] = field(default_factory=dict)
    # The request sent: its size, and its rows when the body says (`servestack plan` scales from these).
    request_bytes: int = 0
    request_rows: int | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    def summary(self) -> str:
        lat, ok = self.latency_ms, self.ok_latency_ms
        lines = [
            f"{self.mode}: {self.requests} requests in {self.duration_sec:.1f}s = {self.qps:.0f} req/s "
            f"({self.ok_qps:.0f} req/s 2xx)",
            f"statuses {self.statuses}" + (f"  errors {self.errors}" if self.errors else ""),
            "latency ms (all)  " + "  ".join(f"{k} {v:.2f}" for k, v in lat.items()),
            "latency ms (2xx)  " + "  ".join(f"{k} {v:.2f}" for k, v in ok.items()),
        ]
        lines += capacity_lines(self.provisioning)
        return "\n".join(lines)


def capacity_lines(p: dict[str, float]) -> list[str]:
    """What the measurement says about capacity, and (with a target QPS) what to provision."""
    if not p:
        return ["capacity: no 2xx answers, so nothing to size from"]
    lines = [
        f"capacity: {p['per_instance_qps']:.0f} req/s 2xx per instance at {p['mean_latency_ms']:.1f} ms mean "
        f"(measured on {p['instances_measured']:.0f} instance(s); a capacity only if this load saturated the target); "
        f"one Lambda execution environment serves {p['lambda_qps_per_environment']:.0f} req/s at this latency"
    ]
    if "target_qps" not in p:
        lines.append("provision: pass --target-qps N (the QPS to serve) for an instance count and a concurrency")
        return lines
    lines.append(
        f"provision for {p['target_qps']:.0f} req/s with x{p['headroom']:g} headroom: "
        f"{p['instances']:.0f} instance(s); "
        f"concurrency {p['concurrency']:.0f} (target QPS x mean latency x headroom), "
        "e.g. Lambda reserved or provisioned concurrency"
    )
    return lines


class _Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection as an asyncio Protocol: each response is parsed from the bytes as they
    arrive, and the request waiting on it gets one future. asyncio streams cost a waiter future per
    `readuntil`/`readexactly` and a copy into the reader's buffer; at 512 connections retrying at once on one
    core, that made this client, not the server it measures, the limit."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._waiter: asyncio.Future[tuple[int, str | None]] | None = None
        # The waiting response's head once it is in: where its body starts, status, length, Retry-After, close.
        self._head: tuple[int, int, int, str | None, bool] | None = None
        self._lost: asyncio.Future[None] = loop.create_future()
        self._reset: Exception | None = None

    @classmethod
    async def open(cls, target: Target) -> _Connection:
        tls = ssl.create_default_context() if target.scheme == "https" else None
        _, connection = await asyncio.get_running_loop().create_connection(cls, target.host, target.port, ssl=tls)
        return connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        self._answer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._reset = exc or ConnectionResetError("server closed the connection")
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(self._reset)
        if not self._lost.done():
            self._lost.set_result(None)

    def _answer(self) -> None:
        """Resolve the waiting request once its whole response is in the buffer."""
        waiter, buffer = self._waiter, self._buffer
        if waiter is None:
            return
        if self._head is None:  # parsed once per response, however many chunks its body arrives in
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            try:
                self._head = (end + 4, *_response_head(bytes(buffer[:end])))
            except (ValueError, UnicodeDecodeError):
                self._waiter = None
                if not waiter.done():
                    waiter.set_exception(MalformedResponse(f"not an HTTP/1.1 response head: {bytes(buffer[:64])!r}"))
                assert self._transport is not None
                self._transport.abort()
                return
        body_at, status, length, retry_after, close = self._head
        if len(buffer) < body_at + length:
            return
        del buffer[: body_at + length]
        self._waiter, self._head = None, None
        if waiter.done():  # cancelled by the caller's timeout
            return
        if close:
            waiter.set_exception(ConnectionResetError("server closed the connection"))
        else:
            waiter.set_result((status, retry_after))

    async def exchange(self, request: bytes) -> tuple[int, str | None]:
        if self._reset is not None or self._transport is None:
            raise ConnectionResetError("server closed the connection")
        self._waiter = self._loop.create_future()
        self._transport.write(request)
        return await self._waiter

    async def close(self) -> None:
        """Close, and wait until asyncio has released the socket (else the loop may end first, leaving it to the
        garbage collector and a ResourceWarning)."""
        if self._transport is not None:
            self._transport.close()
            try:
                async with asyncio.timeout(1.0):  # a TLS peer that never answers the close_notify
                    await asyncio.shield(self._lost)
            except TimeoutError:
                self._transport.abort()


class MalformedResponse(ConnectionError):
    """An answer that is not HTTP/1.1: counted as an error of this name, and the connection dropped."""


def _response_head(head: bytes) -> tuple[int, int, str | None, bool]:
    """Status, Content-Length, Retry-After and whether the server closes, from a response head."""
    if not head.startswith(b"HTTP/1.") or len(head) < 12:
        raise ValueError(head[:64])
    status = int(head[9:12])
    length, retry_after, close = 0, None, False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        lowered = name.strip().lower()
        if lowered == b"content-length":
            length = int(value)
        elif lowered == b"retry-after":
            retry_after = value.strip().decode()
        elif lowered == b"connection" and value.strip().lower() == b"close":
            close = True
    return status, length, retry_after, close


async def _closed_loop(
    target: Target, concurrency: int, duration_sec: float, timeout_sec: float, honour_retry_after: bool
) -> list[Sample]:
    samples: list[Sample] = []
    request = RequestBytes(target)
    stop_at = time.perf_counter() + duration_sec

    async def worker() -> None:
        connection: _Connection | None = None
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            try:
                connection = connection or await _Connection.open(target)
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for wraps every call in a task of its own,
                # which made this client, not the server, the bottleneck at 512 connections on one core.
                async with asyncio.timeout(timeout_sec):
                    status, retry_after = await connection.exchange(request.current())
                samples.append(Sample(started, time.perf_counter() - started, status, retry_after))
            except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
                samples.append(Sample(started, time.perf_counter() - started, 0, type(exc).__name__))
                if connection is not None:
                    await connection.close()
                connection = None
                continue
            if honour_retry_after and status in (429, 503) and retry_after and retry_after.isdigit():
                # What a well-behaved client does (servestack.client does): wait as told before the next try.
                await asyncio.sleep(max(0.0, min(float(retry_after), stop_at - time.perf_counter())))
        if connection is not None:
            await connection.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return samples


async def _open_loop(
    target: Target, rate: float, duration_sec: float, timeout_sec: float, max_connections: int
) -> list[Sample]:
    samples: list[Sample] = []
    request = RequestBytes(target)
    idle: asyncio.Queue[_Connection] = asyncio.Queue()
    opened = 0
    start = time.perf_counter()

    async def one(scheduled: float) -> None:
        nonlocal opened
        connection: _Connection | None = None
        try:
            if idle.empty() and opened < max_connections:
                opened += 1
                connection = await _Connection.open(target)
            else:
                connection = await idle.get()
            async with asyncio.timeout(timeout_sec):
                status, retry_after = await connection.exchange(request.current())
            samples.append(Sample(scheduled, time.perf_counter() - scheduled, status, retry_after))
            idle.put_nowait(connection)
        except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
            samples.append(Sample(scheduled, time.perf_counter() - scheduled, 0, type(exc).__name__))
            if connection is not None:
                opened -= 1
                await connection.close()

    tasks: list[asyncio.Task[None]] = []
    total = int(rate * duration_sec)
    for index in range(total):
        scheduled = start + index / rate
        if (delay := scheduled - time.perf_counter()) > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(scheduled)))
    await asyncio.gather(*tasks)
    while not idle.empty():
        await idle.get_nowait().close()
    return samples


def _percentiles(latencies: np.ndarray) -> dict[str, float]:
    if latencies.size == 0:
        return {}
    values = np.percentile(latencies * 1000, [50, 90, 99])
    return {
        "p50": float(values[0]),
        "p90": float(values[1]),
        "p99": float(values[2]),
        "max": float(latencies.max() * 1000),
        "mean": float(latencies.mean() * 1000),
    }


def summarize(
    samples: list[Sample],
    mode: str,
    duration_sec: float,
    *,
    headroom: float = 1.5,
    target_qps: float | None = None,
    instances_measured: int = 1,
) -> Report:
    """The report. Capacity per instance is the 2xx rate over the instances that served it; instance and
    concurrency counts need the QPS to serve (`target_qps`): the measured rate says nothing about demand."""
    ok = np.array([s.latency_sec for s in samples if 200 <= s.status < 300])
    every = np.array([s.latency_sec for s in samples])
    statuses = Counter(str(s.status) for s in samples if s.status)
    errors = Counter(str(s.retry_after) for s in samples if not s.status)
    qps = len(samples) / duration_sec
    ok_qps = ok.size / duration_sec
    report = Report(
        mode,
        duration_sec,
        len(samples),
        qps,
        ok_qps,
        dict(statuses),
        dict(errors),
        _percentiles(every),
        _percentiles(ok),
        sum(1 for s in samples if s.status == 429 and s.retry_after),
    )
    if ok.size:
        mean_sec = float(ok.mean())
        per_instance = ok_qps / instances_measured
        report.provisioning = {
            "headroom": headroom,
            "mean_latency_ms": mean_sec * 1000,
            "instances_measured": instances_measured,
            "per_instance_qps": per_instance,
            # Each Lambda execution environment serves one request at a time.
            "lambda_qps_per_environment": 1 / mean_sec if mean_sec > 0 else math.inf,
        }
        if target_qps:
            # Exact arithmetic (sizing.py) on the mean as reported, to the microsecond: 100 req/s at a 0.2 s
            # mean needs 20 in flight, not the 21 that binary floats give.
            mean_exact = exact(round(mean_sec * 1000, 3)) / 1000
            concurrency = math.ceil(exact(target_qps) * mean_exact * exact(headroom))
            report.provisioning |= {
                "target_qps": target_qps,
                "concurrency": concurrency,
                "lambda_concurrency": concurrency,
                "instances": math.ceil(exact(target_qps) * exact(headroom) / exact(per_instance)),
            }
    return report


def rows_in(body: bytes, content_type: str) -> int | None:
    """Rows in a request body (JSON `instances` or `inputs`, CSV lines, `.npy` first dimension), if it says."""
    try:
        if content_type == "application/json":
            document = json.loads(body)
            if isinstance(document.get("instances"), list):
                return len(document["instances"])
            named = document.get("inputs")
            if isinstance(named, dict) and named:
                first = next(iter(named.values()))
                return len(first) if isinstance(first, list) else None
            return None
        if content_type == "text/csv":
            return sum(1 for line in body.decode().splitlines() if line.strip())
        if content_type == "application/x-npy":
            shape = np.load(io.BytesIO(body), allow_pickle=False).shape
            return int(shape[0]) if shape else None
    except (ValueError, AttributeError, UnicodeDecodeError, OSError):
        return None
    return None


# ------------------------------------------------------------------------------------------ boto3 targets


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

            raise CommandError(
                "no AWS credentials found: run `aws configure`, or set AWS_PROFILE or AWS_ACCESS_KEY_ID", ExitCode.AWS
            )
        service = "sagemaker-runtime" if self.service == "sagemaker" else "lambda"
        return session.client(service, region_name=self.region, endpoint_url=self.endpoint_url, config=config)

    def caller(self, client: Any) -> Callable[[], tuple[int, str | None]]:
        """One call -> (status, error name); status 0 when no HTTP answer came back."""
        from botocore.exceptions import BotoCoreError, ClientError

        if self.service == "sagemaker":

            def send() -> int:
                answer = client.invoke_endpoint(EndpointName=self.name, ContentType=self.content_type, Body=self.body)
                answer["Body"].read()
                return 200

        else:
            from servestack.local.lambda_runtime import http_api_event

            event = http_api_event(
                "POST", "/invocations", {"content-type": self.content_type}, self.body, "loadtest", "127.0.0.1"
            )
            payload = json.dumps(event).encode()

            def send() -> int:
                answer = client.invoke(FunctionName=self.name, Payload=payload)
                reply = json.loads(answer["Payload"].read() or b"null")
                if answer.get("FunctionError"):
                    return 500  # what API Gateway answers when the function fails
                status = reply.get("statusCode", 200) if isinstance(reply, dict) else 200
                return int(status)

        def call() -> tuple[int, str | None]:
            try:
                return send(), None
            except ClientError as error:
                status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
                return status, None if status else str(error.response.get("Error", {}).get("Code"))
            except (BotoCoreError, OSError) as error:
                return 0, type(error).__name__

        return call


def _sdk_closed_loop(target: SdkTarget, concurrency: int, duration_sec: float, timeout_sec: float) -> list[Sample]:
    call = target.caller(target.client(concurrency, timeout_sec))
    samples: list[Sample] = []
    stop_at = time.perf_counter() + duration_sec

    def worker() -> None:
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            status, error = call()
            samples.append(Sample(started, time.perf_counter() - started, status, error))  # list.append is atomic

    threads = [threading.Thread(target=worker, name=f"loadtest-{i}", daemon=True) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return samples


def _sdk_open_loop(
    target: SdkTarget, rate: float, duration_sec: float, timeout_sec: float, max_connections: int
) -> list[Sample]:
    workers = max(1, min(max_connections, math.ceil(rate * timeout_sec)))
    call = target.caller(target.client(workers, timeout_sec))
    samples: list[Sample] = []

    def one(scheduled: float) -> None:
        status, error = call()
        samples.append(Sample(scheduled, time.perf_counter() - scheduled, status, error))

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="loadtest") as pool:
        for index in range(int(rate * duration_sec)):
            scheduled = start + index / rate
            if (delay := scheduled - time.perf_counter()) > 0:
                time.sleep(delay)
            pool.submit(one, scheduled)
    return samples


# ------------------------------------------------------------------------------------------ running


def run(
    target: Target | SdkTarget,
    *,
    duration_sec: float,
    concurrency: int | None = None,
    rate: float | None = None,
    timeout_sec: float = 10.0,
    max_connections: int = 512,
    target_qps: float | None = None,
    honour_retry_after: bool = False,
    instances_measured: int = 1,
) -> tuple[Report, list[Sample]]:
    if (concurrency is None) == (rate is None):
        raise ValueError("give exactly one of concurrency (closed loop) or rate (open loop)")
    if isinstance(target, SdkTarget):
        if concurrency is not None:
            samples = _sdk_closed_loop(target, concurrency, duration_sec, timeout_sec)
            mode = f"closed loop, {concurrency} boto3 callers"
        else:
            assert rate is not None
            samples = _sdk_open_loop(target, rate, duration_sec, timeout_sec, max_connections)
            mode = f"open loop, {rate:g} req/s through boto3"
    else:
        samples, mode = _run_http(
            target, duration_sec, concurrency, rate, timeout_sec, max_connections, honour_retry_after
        )
    elapsed = max(
        duration_sec,
        max((s.started + s.latency_sec for s in samples), default=0) - min((s.started for s in samples), default=0),
    )
    report = summarize(samples, mode, elapsed, target_qps=target_qps, instances_measured=instances_measured)
    report.request_bytes = len(target.body)
    report.request_rows = rows_in(target.body, target.content_type)
    return report, samples


def _run_http(
    target: Target,
    duration_sec: float,
    concurrency: int | None,
    rate: float | None,
    timeout_sec: float,
    max_connections: int,
    honour_retry_after: bool,
) -> tuple[list[Sample], str]:
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:  # the generator works on the standard loop too, just slower
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        if concurrency is not None:
            samples = runner.run(_closed_loop(target, concurrency, duration_sec, timeout_sec, honour_retry_after))
            mode = f"closed loop, {concurrency} connections" + (", honouring Retry-After" if honour_retry_after else "")
        else:
            assert rate is not None
            samples = runner.run(_open_loop(target, rate, duration_sec, timeout_sec, max_connections))
            mode = f"open loop, {rate:g} req/s"
    return samples, mode


# ------------------------------------------------------------------------------------------ the command

CONTENT_TYPES = {".json": "application/json", ".csv": "text/csv", ".npy": "application/x-npy"}
_REGION_IN_HOST = re.compile(r"\.(?:execute-api|lambda-url)\.([a-z]{2}(?:-[a-z]+)+-\d)\.")


def region_of(explicit: str | None, url: str | None = None) -> str | None:
    """--region, else the region in an API Gateway / function URL host, else botocore's (AWS_REGION, profile)."""
    if explicit:
        return explicit
    found = _REGION_IN_HOST.search(urllib.parse.urlsplit(url).netloc) if url else None
    if found:
        return found.group(1)
    import botocore.session

    configured = botocore.session.get_session().get_config_variable("region")
    return str(configured) if configured else None


def target_of(args: argparse.Namespace, body: bytes, content_type: str) -> Target | SdkTarget:
    from servestack.failures import CommandError, ExitCode

    scheme = urllib.parse.urlsplit(args.target).scheme
    try:
        if scheme in ("sagemaker", "lambda"):
            region = region_of(args.region)
            if region is None:
                raise CommandError(f"{args.target}: no AWS region; pass --region (or set AWS_REGION)", ExitCode.AWS)
            return SdkTarget.from_url(args.target, body, content_type, region=region, endpoint_url=args.endpoint_url)
        signer = None
        if (scheme == "https" and not args.no_sign) or args.sigv4:
            region = region_of(args.region, args.target)
            if region is None:
                raise CommandError(
                    f"{args.target}: no AWS region to sign for; pass --region (or --no-sign)", ExitCode.AWS
                )
            signer = sigv4_signer(args.service, region)
        return Target.from_url(args.target, body, content_type, signer=signer)
    except ValueError as error:
        raise CommandError(str(error)) from None


def main(args: argparse.Namespace) -> int:
    """`servestack loadtest` (arguments: servestack/cli.py)."""
    from servestack.failures import CommandError
    from servestack.local.processes import REPO_ROOT

    data: Path = args.data or REPO_ROOT / "models" / "artifacts" / "digits" / "1" / "sample-request.json"
    content_type = args.content_type or CONTENT_TYPES.get(data.suffix.lower())
    if content_type is None:
        raise CommandError(
            f"--content-type: cannot tell from {data.name!r}; give one of {sorted(CONTENT_TYPES.values())}"
        )
    if not data.is_file():
        raise CommandError(f"--data {data}: no such file")
    target = target_of(args, data.read_bytes(), content_type)
    concurrency = args.concurrency if args.concurrency or args.rate else 64
    report, samples = run(
        target,
        duration_sec=args.duration,
        concurrency=concurrency,
        rate=args.rate,
        timeout_sec=args.timeout,
        target_qps=args.target_qps,
        honour_retry_after=args.honour_retry_after,
        instances_measured=args.instances,
    )
    print(report.summary())
    args.report.write_text(report.to_json())
    if samples:
        plot(samples, args.plot, f"{args.target} - {report.mode}")
    print(f"wrote {args.report}" + (f" and {args.plot}" if samples else ""))
    if not report.ok_qps:
        print("no 2xx answers: see the statuses and errors above", file=sys.stderr)
        return 1
    return 0


def plot(samples: list[Sample], path: Path, title: str) -> None:
    """Latency over time and a latency histogram, one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start = min(s.started for s in samples)
    figure, (over_time, histogram) = plt.subplots(1, 2, figsize=(12, 4.5))
    for label, keep, color in (
        ("2xx", lambda s: 200 <= s.status < 300, "tab:blue"),
        ("429", lambda s: s.status == 429, "tab:orange"),
        ("other", lambda s: not (200 <= s.status < 300 or s.status == 429), "tab:red"),
    ):
        chosen = [s for s in samples if keep(s)]
        if chosen:
            over_time.scatter(
                [s.started - start for s in chosen],
                [s.latency_sec * 1000 for s in chosen],
                s=2,
                alpha=0.4,
                label=f"{label} ({len(chosen)})",
                color=color,
            )
    over_time.set(xlabel="seconds", ylabel="latency ms", title="latency over time", yscale="log")
    over_time.legend(loc="upper right")
    ok = [s.latency_sec * 1000 for s in samples if 200 <= s.status < 300]
    if ok:
        histogram.hist(ok, bins=80, color="tab:blue")
        for name, value in zip(("p50", "p99"), np.percentile(ok, [50, 99]), strict=True):
            histogram.axvline(value, color="black", linestyle="--", linewidth=1)
            histogram.text(value, histogram.get_ylim()[1] * 0.9, f" {name} {value:.2f}", fontsize=8)
    histogram.set(xlabel="latency ms (2xx)", ylabel="requests", title="latency histogram")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
