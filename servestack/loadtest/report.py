"""What `servestack loadtest` keeps of a run and reports: the samples, the first distinct error bodies, and the
summary (QPS, statuses, latency percentiles, capacity and what to provision)."""

from __future__ import annotations

import io
import json
import math
from collections import Counter
from dataclasses import asdict, dataclass, field

import numpy as np

from servestack.latency import percentiles_ms
from servestack.sizing import exact

ERROR_BODY_BYTES = 300  # of each non-2xx answer's body, kept to show what the server said


class ErrorBodies:
    """The first few distinct bodies of non-2xx answers, truncated: what the server said was wrong (a 400 for a
    request the model does not take says which field and why). Only non-2xx answers reach it."""

    def __init__(self, keep: int = 3) -> None:
        self.keep = keep
        self.first: list[tuple[int, str]] = []

    def add(self, status: int, body: bytes) -> None:
        if len(self.first) >= self.keep:
            return
        text = body[:ERROR_BODY_BYTES].decode("utf-8", errors="replace")
        if (status, text) not in self.first:
            self.first.append((status, text))


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
    # The first distinct bodies of non-2xx answers (status, body truncated to ERROR_BODY_BYTES).
    error_bodies: list[tuple[int, str]] = field(default_factory=list)

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
        if self.error_bodies:
            lines.append(f"what the server said (the first {len(self.error_bodies)} distinct non-2xx bodies):")
            lines += [f"  {status}: {body}" for status, body in self.error_bodies]
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
        percentiles_ms(every * 1000),
        percentiles_ms(ok * 1000),
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
