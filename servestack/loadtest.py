"""`servestack loadtest`: drive an endpoint at a fixed rate (open loop) or concurrency (closed loop).

The generator is a minimal HTTP/1.1 keep-alive client on asyncio streams: a general-purpose client spends
more CPU per request than the server it measures, and would report its own limits instead. Open-loop
latency counts from each request's scheduled start, so a stalled server cannot hide its queueing
(no coordinated omission). Reports QPS, errors by status, p50/p90/p99/max, and what to provision.
"""

from __future__ import annotations

import asyncio
import io
import json
import math
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from servestack.sizing import exact


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    path: str
    body: bytes
    content_type: str
    headers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_url(cls, url: str, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> Target:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme != "http" or not parsed.hostname:
            raise ValueError(f"url: {url!r} must be http://host:port/path (the load generator speaks plain HTTP)")
        return cls(
            parsed.hostname,
            parsed.port or 80,
            parsed.path or "/invocations",
            body,
            content_type,
            tuple((headers or {}).items()),
        )

    def request_bytes(self) -> bytes:
        lines = [
            f"POST {self.path} HTTP/1.1",
            f"Host: {self.host}:{self.port}",
            f"Content-Type: {self.content_type}",
            f"Content-Length: {len(self.body)}",
            *(f"{name}: {value}" for name, value in self.headers),
        ]
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + self.body


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
        if self.provisioning:
            p = self.provisioning
            lines.append(
                f"provision: concurrency {p['concurrency']:.0f} (QPS x mean latency x {p['headroom']:g}); "
                f"Lambda reserved concurrency {p['lambda_concurrency']:.0f}; "
                f"instances {p['instances']:.0f} at {p['per_instance_qps']:.0f} req/s each "
                f"for {p['target_qps']:.0f} req/s"
            )
        return "\n".join(lines)


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, target: Target) -> _Connection:
        reader, writer = await asyncio.open_connection(target.host, target.port)
        return cls(reader, writer)

    async def exchange(self, request: bytes) -> tuple[int, str | None]:
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
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
        if length:
            await self.reader.readexactly(length)
        if close:
            raise ConnectionResetError("server closed the connection")
        return status, retry_after

    def close(self) -> None:
        self.writer.close()


async def _closed_loop(
    target: Target, concurrency: int, duration_sec: float, timeout_sec: float, honour_retry_after: bool
) -> list[Sample]:
    samples: list[Sample] = []
    request = target.request_bytes()
    stop_at = time.perf_counter() + duration_sec

    async def worker() -> None:
        connection: _Connection | None = None
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            try:
                connection = connection or await _Connection.open(target)
                status, retry_after = await asyncio.wait_for(connection.exchange(request), timeout_sec)
                samples.append(Sample(started, time.perf_counter() - started, status, retry_after))
            except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
                samples.append(Sample(started, time.perf_counter() - started, 0, type(exc).__name__))
                if connection is not None:
                    connection.close()
                connection = None
                continue
            if honour_retry_after and status in (429, 503) and retry_after and retry_after.isdigit():
                # What a well-behaved client does (servestack.client does): wait as told before the next try.
                await asyncio.sleep(max(0.0, min(float(retry_after), stop_at - time.perf_counter())))
        if connection is not None:
            connection.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return samples


async def _open_loop(
    target: Target, rate: float, duration_sec: float, timeout_sec: float, max_connections: int
) -> list[Sample]:
    samples: list[Sample] = []
    request = target.request_bytes()
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
            status, retry_after = await asyncio.wait_for(connection.exchange(request), timeout_sec)
            samples.append(Sample(scheduled, time.perf_counter() - scheduled, status, retry_after))
            idle.put_nowait(connection)
        except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
            samples.append(Sample(scheduled, time.perf_counter() - scheduled, 0, type(exc).__name__))
            if connection is not None:
                connection.close()
                opened -= 1

    tasks: list[asyncio.Task[None]] = []
    total = int(rate * duration_sec)
    for index in range(total):
        scheduled = start + index / rate
        if (delay := scheduled - time.perf_counter()) > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(scheduled)))
    await asyncio.gather(*tasks)
    while not idle.empty():
        idle.get_nowait().close()
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
    samples: list[Sample], mode: str, duration_sec: float, *, headroom: float = 1.5, target_qps: float | None = None
) -> Report:
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
        # The mean to the microsecond, as reported: the sizing below is exact (sizing.py), so 100 req/s at a
        # 0.2 s mean needs 20 in flight, not the 21 that binary floats give.
        mean_sec = exact(round(report.ok_latency_ms["mean"], 3)) / 1000
        wanted = target_qps or ok_qps
        in_flight = math.ceil(exact(wanted) * mean_sec * exact(headroom))
        report.provisioning = {
            "target_qps": wanted,
            "headroom": headroom,
            "concurrency": in_flight,
            # Each Lambda execution environment serves one request at a time.
            "lambda_concurrency": in_flight,
            "per_instance_qps": ok_qps,
            "instances": math.ceil(exact(wanted) * exact(headroom) / exact(ok_qps)),
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


def run(
    target: Target,
    *,
    duration_sec: float,
    concurrency: int | None = None,
    rate: float | None = None,
    timeout_sec: float = 10.0,
    max_connections: int = 512,
    target_qps: float | None = None,
    honour_retry_after: bool = False,
) -> tuple[Report, list[Sample]]:
    if (concurrency is None) == (rate is None):
        raise ValueError("give exactly one of concurrency (closed loop) or rate (open loop)")
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
    elapsed = max(
        duration_sec,
        max((s.started + s.latency_sec for s in samples), default=0) - min((s.started for s in samples), default=0),
    )
    report = summarize(samples, mode, elapsed, target_qps=target_qps)
    report.request_bytes = len(target.body)
    report.request_rows = rows_in(target.body, target.content_type)
    return report, samples


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
