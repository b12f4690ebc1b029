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
(no coordinated omission). Reports QPS, errors by status (and the first distinct non-2xx bodies),
p50/p90/p99/max, and what to provision.

Here: the http(s) generator and `run`. Beside it: loadtest_report.py (samples, summary), loadtest_sdk.py (the
boto3 targets) and loadtest_command.py (`servestack loadtest`: the request, the target, the plot).
"""

from __future__ import annotations

import asyncio
import ssl
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import httptools

from servestack.loadtest.report import ERROR_BODY_BYTES, ErrorBodies, Report, Sample, rows_in, summarize
from servestack.loadtest.sdk import SdkTarget, keys_hint, sdk_closed_loop, sdk_open_loop

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


def sigv4_signer(service: str, region: str, session: Any = None, *, local: bool = False) -> Signer:
    """SigV4 headers (Authorization, X-Amz-Date, X-Amz-Security-Token) from botocore's credential chain; `local`:
    the target is local up's, whose keys a missing-credentials error names."""
    import botocore.session

    from servestack.failures import CommandError, ExitCode
    from servestack.signing import sigv4_headers

    chosen = session or botocore.session.get_session()
    credentials = chosen.get_credentials()
    if credentials is None:
        raise CommandError(f"no AWS credentials to sign with: {keys_hint(local)}", ExitCode.AWS)

    def sign(target: Target) -> dict[str, str]:
        keys = credentials.get_frozen_credentials()
        return sigv4_headers(
            "POST", target.url, target.body, {"Content-Type": target.content_type},
            access_key_id=keys.access_key, secret_access_key=keys.secret_key, session_token=keys.token,
            service=service, region=region,
        )  # fmt: skip

    return sign


class _Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection as an asyncio Protocol: httptools (llhttp, the parser of Node.js and
    uvicorn) reads each response from the bytes as they arrive, Content-Length or chunked, and the request
    waiting on it gets one future. asyncio streams cost a waiter future per `readuntil`/`readexactly` and a copy
    into the reader's buffer; at 512 connections retrying at once on one core, that made this client, not the
    server it measures, the limit. The parser calls back only for the head's end, each header (Retry-After)
    and, of a non-2xx answer, the body (the error shown in the summary)."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[Answer] | None = None
        self._retry_after: str | None = None
        self._error_body: bytearray | None = None  # collected only while a non-2xx answer's body arrives
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
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as error:
            waiter, self._waiter = self._waiter, None
            if waiter is not None and not waiter.done():
                waiter.set_exception(MalformedResponse(f"not an HTTP/1.1 response ({error}): {data[:64]!r}"))
            assert self._transport is not None
            self._transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._reset = exc or ConnectionResetError("server closed the connection")
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(self._reset)
        if not self._lost.done():
            self._lost.set_result(None)

    # httptools' callbacks, in the order a response calls them

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) == 11 and name.lower() == b"retry-after":
            self._retry_after = value.strip().decode("latin-1")

    def on_headers_complete(self) -> None:
        if not 200 <= self._parser.get_status_code() < 300:
            self._error_body = bytearray()

    def on_body(self, body: bytes) -> None:
        kept = self._error_body
        if kept is not None and len(kept) < ERROR_BODY_BYTES:
            kept += body[: ERROR_BODY_BYTES - len(kept)]

    def on_message_complete(self) -> None:
        """Resolve the waiting request with its status, Retry-After and (non-2xx) body."""
        waiter, self._waiter = self._waiter, None
        answer = Answer(
            self._parser.get_status_code(),
            self._retry_after,
            bytes(self._error_body) if self._error_body is not None else None,
        )
        self._retry_after, self._error_body = None, None
        if waiter is None or waiter.done():  # cancelled by the caller's timeout
            return
        if not self._parser.should_keep_alive():
            waiter.set_exception(ConnectionResetError("server closed the connection"))
        else:
            waiter.set_result(answer)

    async def exchange(self, request: bytes) -> Answer:
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


class Answer(NamedTuple):
    """What the load generator keeps of one HTTP answer."""

    status: int
    retry_after: str | None
    error_body: bytes | None  # the first ERROR_BODY_BYTES of a non-2xx answer's body


class MalformedResponse(ConnectionError):
    """An answer that is not HTTP/1.1: counted as an error of this name, and the connection dropped."""


async def _closed_loop(
    target: Target,
    concurrency: int,
    duration_sec: float,
    timeout_sec: float,
    honour_retry_after: bool,
    error_bodies: ErrorBodies | None = None,
) -> list[Sample]:
    samples: list[Sample] = []
    said = error_bodies if error_bodies is not None else ErrorBodies()
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
                    status, retry_after, error_body = await connection.exchange(request.current())
                samples.append(Sample(started, time.perf_counter() - started, status, retry_after))
                if error_body is not None:
                    said.add(status, error_body)
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
    target: Target,
    rate: float,
    duration_sec: float,
    timeout_sec: float,
    max_connections: int,
    error_bodies: ErrorBodies | None = None,
) -> list[Sample]:
    samples: list[Sample] = []
    said = error_bodies if error_bodies is not None else ErrorBodies()
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
                status, retry_after, error_body = await connection.exchange(request.current())
            samples.append(Sample(scheduled, time.perf_counter() - scheduled, status, retry_after))
            if error_body is not None:
                said.add(status, error_body)
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
    error_bodies = ErrorBodies()
    if isinstance(target, SdkTarget):
        if concurrency is not None:
            samples = sdk_closed_loop(target, concurrency, duration_sec, timeout_sec, error_bodies)
            mode = f"closed loop, {concurrency} boto3 callers"
        else:
            assert rate is not None
            samples = sdk_open_loop(target, rate, duration_sec, timeout_sec, max_connections, error_bodies)
            mode = f"open loop, {rate:g} req/s through boto3"
    else:
        samples, mode = _run_http(
            target, duration_sec, concurrency, rate, timeout_sec, max_connections, honour_retry_after, error_bodies
        )
    elapsed = max(
        duration_sec,
        max((s.started + s.latency_sec for s in samples), default=0) - min((s.started for s in samples), default=0),
    )
    report = summarize(samples, mode, elapsed, target_qps=target_qps, instances_measured=instances_measured)
    report.request_bytes = len(target.body)
    report.request_rows = rows_in(target.body, target.content_type)
    report.error_bodies = error_bodies.first
    return report, samples


def _run_http(
    target: Target,
    duration_sec: float,
    concurrency: int | None,
    rate: float | None,
    timeout_sec: float,
    max_connections: int,
    honour_retry_after: bool,
    error_bodies: ErrorBodies,
) -> tuple[list[Sample], str]:
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:  # the generator works on the standard loop too, just slower
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        if concurrency is not None:
            samples = runner.run(
                _closed_loop(target, concurrency, duration_sec, timeout_sec, honour_retry_after, error_bodies)
            )
            mode = f"closed loop, {concurrency} connections" + (", honouring Retry-After" if honour_retry_after else "")
        else:
            assert rate is not None
            samples = runner.run(_open_loop(target, rate, duration_sec, timeout_sec, max_connections, error_bodies))
            mode = f"open loop, {rate:g} req/s"
    return samples, mode


# The load tester's interface, in one place (the report and the boto3 targets live in modules of their own).
__all__ = [
    "MalformedResponse",
    "Report",
    "RequestBytes",
    "Sample",
    "SdkTarget",
    "Target",
    "rows_in",
    "run",
    "sigv4_signer",
    "summarize",
]
