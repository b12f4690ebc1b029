"""What `servestack plan` works from: the dated prices, the traffic profile and the capacity measured by
`servestack loadtest`, and the AWS limits each mode is held to."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

from servestack.sizing import Number, decimal_text, exact

Mode = Literal["realtime", "serverless", "async", "batch"]
MODES: tuple[Mode, ...] = ("realtime", "serverless", "async", "batch")
PRICES_FILE = Path(__file__).resolve().parent.parent / "data" / "prices.json"

MIB = 1024 * 1024
GIB = 1024 * MIB
# SageMaker real-time InvokeEndpoint and Lambda synchronous invocation both stop at 6 MB (the spec's bound).
SYNC_MAX_PAYLOAD = 6 * MIB
# servestack's async mode takes payloads up to 1 GB through a presigned S3 upload.
ASYNC_MAX_PAYLOAD = GIB
LAMBDA_TIMEOUT_SEC = 900
LAMBDA_MAX_MEMORY_MIB = 10_240
LAMBDA_DEFAULT_CONCURRENCY_QUOTA = 1000
HTTP_API_MAX_RATE = 10_000
MAX_INSTANCES = 100  # serving.yaml's bound on max_instances
SERVERLESS_MEMORY_MIB = 2048
SUBMIT_MEMORY_MIB = 512  # the async submit function (servestack/cdk/asynchronous.py)
# Not measured: the submit function only writes a job record and presigns a URL; 20 ms is a round figure.
SUBMIT_BILLED_MS = 20
ASYNC_BATCH_WINDOW_SEC = 1
ASYNC_RESULT_TTL_DAYS = 7
# A worker holds the payload's text, its parsed rows and the arrays at once: 6x the payload is an estimate.
ASYNC_MEMORY_PER_PAYLOAD = 6
BATCH_CHUNK_ROWS = 10_000
FARGATE_CPU_UNITS, FARGATE_MEMORY_MIB = 1024, 4096


def invalid_input(message: str, field: str, value: Any = None, allowed: str | None = None) -> Exception:
    from servestack.inference.errors import InvalidInput

    return InvalidInput(message, field=field, value=value, allowed=allowed)


# --------------------------------------------------------------------------------------------- prices


@dataclass(frozen=True)
class Price:
    key: str
    usd: Fraction
    per: str
    source: str
    rechecked: bool

    @property
    def per_unit(self) -> Fraction:
        """USD for one unit: `per: "1000000 requests"` divides by a million."""
        count, _, _unit = self.per.partition(" ")
        return self.usd / int(count) if count.isdigit() else self.usd


@dataclass(frozen=True)
class InstancePrice:
    instance_type: str
    usd_per_hour: Fraction
    vcpus: int
    gpus: int


@dataclass(frozen=True)
class Prices:
    path: Path
    region: str
    read_on: str
    hours_per_month: Fraction
    items: dict[str, Price]
    instances: dict[str, InstancePrice]
    instances_source: str
    instances_rechecked: bool

    @classmethod
    def load(cls, path: Path = PRICES_FILE) -> Prices:
        document = json.loads(path.read_text())
        items = {
            key: Price(key, exact(entry["usd"]), entry["per"], entry["source"], bool(entry["rechecked"]))
            for key, entry in document["prices"].items()
        }
        hosting = document["sagemaker_realtime"]
        instances = {
            name: InstancePrice(name, exact(entry["usd_per_hour"]), int(entry["vcpus"]), int(entry["gpus"]))
            for name, entry in hosting["instances"].items()
        }
        return cls(
            path,
            document["region"],
            document["read_on"],
            exact(document["hours_per_month"]),
            items,
            instances,
            hosting["source"],
            bool(hosting["rechecked"]),
        )

    def unit(self, key: str) -> Fraction:
        return self.items[key].per_unit

    @property
    def not_rechecked(self) -> list[str]:
        keys = [key for key, price in self.items.items() if not price.rechecked]
        return keys + ([] if self.instances_rechecked else ["sagemaker instance-hours"])

    def provenance(self) -> str:
        return (
            f"prices: {self.region}, read {self.read_on} ({self.path.name}); not re-checked that day: "
            f"{', '.join(self.not_rechecked) or 'none'}"
        )


# ----------------------------------------------------------------------------------------- the profile


@dataclass(frozen=True)
class Traffic:
    """One traffic profile, exact. Online traffic (QPS) and offline rows per day are planned separately."""

    peak_qps: Fraction
    average_qps: Fraction
    hours_per_day: Fraction
    payload_bytes: int
    p99_ms: Fraction
    rows_per_day: int = 0
    batch_window_hours: Fraction = Fraction(6)
    headroom: Fraction = Fraction(3, 2)

    @property
    def online(self) -> bool:
        return self.peak_qps > 0

    @property
    def burstiness(self) -> Fraction:
        return self.peak_qps / self.average_qps if self.average_qps else Fraction(0)

    def describe(self) -> str:
        if not self.online:
            return (
                f"offline: {self.rows_per_day:,} rows per day, done within "
                f"{decimal_text(self.batch_window_hours, 1)} h; "
                f"headroom {decimal_text(self.headroom, 2)}"
            )
        return (
            f"peak {decimal_text(self.peak_qps)} req/s, average {decimal_text(self.average_qps)} req/s "
            f"(burstiness {decimal_text(self.burstiness, 1)}) for {decimal_text(self.hours_per_day, 1)} h a day; "
            f"payload {size_text(self.payload_bytes)}; p99 SLO {decimal_text(self.p99_ms, 1)} ms; "
            f"headroom {decimal_text(self.headroom, 2)}"
        )


_SIZE_UNITS = {
    "": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "kib": 1024, "mib": MIB, "gib": GIB,
}  # fmt: skip


def parse_size(value: Number) -> int:
    """`2048`, `"1.4 KB"`, `"200MB"`, `"6 MiB"` -> bytes (KB/MB/GB are powers of 1000, KiB/MiB/GiB of 1024)."""
    text = str(value).strip().lower().replace(" ", "")
    number = text.rstrip("kmgib")
    unit = text[len(number) :]
    if unit not in _SIZE_UNITS or not number:
        raise invalid_input(
            f"payload: {value!r} is not a size",
            field="payload",
            value=value,
            allowed="bytes, or e.g. '1.4 KB', '200 MB'",
        )
    try:
        return math.ceil(exact(number) * _SIZE_UNITS[unit])
    except (ArithmeticError, ValueError):
        raise invalid_input(
            f"payload: {value!r} is not a size", field="payload", value=value, allowed="e.g. 200 MB"
        ) from None


def size_text(size: int) -> str:
    for unit, scale in (("GB", 1000**3), ("MB", 1000**2), ("KB", 1000)):
        if size >= scale:
            return f"{decimal_text(Fraction(size, scale), 1)} {unit}"
    return f"{size} B"


TRAFFIC_FIELDS = (
    "peak_qps", "average_qps", "burstiness", "hours_per_day", "payload", "p99_ms", "rows_per_day",
    "batch_window_hours", "headroom",
)  # fmt: skip


def bounded_number(
    name: str, value: Any, *, low: Fraction, high: Fraction | None = None, low_open: bool = False
) -> Fraction:
    allowed = f"a number {'>' if low_open else '>='} {decimal_text(low, 0)}" + (
        f" and <= {decimal_text(high, 0)}" if high is not None else ""
    )
    try:
        number = exact(value) if not isinstance(value, bool) else None
    except (ArithmeticError, ValueError, TypeError):
        number = None
    if number is None or number < low or (low_open and number == low) or (high is not None and number > high):
        raise invalid_input(f"{name}: {value!r} is not {allowed}", field=name, value=value, allowed=allowed)
    return number


def traffic_from(values: Mapping[str, Any]) -> Traffic:
    """A profile from plain values (YAML or flags); every problem names the field and what is allowed."""
    unknown = sorted(set(values) - set(TRAFFIC_FIELDS))
    if unknown:
        raise invalid_input(
            f"traffic: unknown keys {unknown}", field="traffic", value=unknown, allowed=", ".join(TRAFFIC_FIELDS)
        )
    rows_per_day = bounded_number("rows_per_day", values.get("rows_per_day", 0), low=Fraction(0))
    offline = rows_per_day > 0
    average = bounded_number("average_qps", values.get("average_qps", 0), low=Fraction(0))
    if values.get("peak_qps") is not None and values.get("burstiness") is not None:
        raise invalid_input(
            "give peak_qps or burstiness, not both", field="burstiness", allowed="peak_qps, or burstiness x average_qps"
        )
    if values.get("burstiness") is not None:
        peak = average * bounded_number("burstiness", values["burstiness"], low=Fraction(1))
    else:
        peak = bounded_number("peak_qps", values.get("peak_qps", average), low=Fraction(0))
    if offline and peak > 0:
        raise invalid_input(
            "a profile is either online traffic (QPS) or offline rows per day: plan them separately",
            field="rows_per_day",
            value=int(rows_per_day),
            allowed="0 when peak_qps/average_qps are given",
        )
    if not offline:
        if peak <= 0 or average <= 0:
            raise invalid_input(
                "traffic: give peak_qps and average_qps (> 0), or rows_per_day for offline work",
                field="average_qps",
                value=values.get("average_qps"),
                allowed="> 0",
            )
        if average > peak:
            raise invalid_input(
                f"average_qps: {decimal_text(average)} is over peak_qps {decimal_text(peak)}",
                field="average_qps",
                value=values.get("average_qps"),
                allowed=f"<= peak_qps ({decimal_text(peak)})",
            )
    if offline and "p99_ms" not in values:
        p99 = Fraction(0)
    else:
        p99 = bounded_number("p99_ms", values.get("p99_ms"), low=Fraction(0), low_open=True)
    return Traffic(
        peak_qps=peak,
        average_qps=average,
        hours_per_day=bounded_number(
            "hours_per_day", values.get("hours_per_day", 24), low=Fraction(0), high=Fraction(24), low_open=True
        ),
        payload_bytes=parse_size(values.get("payload", 0)) if not offline else 0,
        p99_ms=p99,
        rows_per_day=int(rows_per_day),
        batch_window_hours=bounded_number(
            "batch_window_hours", values.get("batch_window_hours", 6), low=Fraction(0), high=Fraction(24), low_open=True
        ),
        headroom=bounded_number("headroom", values.get("headroom", "1.5"), low=Fraction(1)),
    )


# ------------------------------------------------------------------------------------------ capacity


@dataclass(frozen=True)
class Measurement:
    """One `servestack loadtest` report: where it ran and what it sustained."""

    file: str
    where: str  # "local" or a SageMaker instance type
    vcpus: int  # cores the server used locally, or the instance type's vCPUs
    ok_qps: Fraction
    p99_ms: Fraction
    mean_ms: Fraction
    request_bytes: int
    request_rows: int | None

    @property
    def estimate(self) -> bool:
        return self.where == "local"

    @property
    def per_vcpu_qps(self) -> Fraction:
        return self.ok_qps / self.vcpus

    @property
    def cpu_seconds_per_request(self) -> Fraction:
        """One request's time on one core: the saturated rate's reciprocal, or the mean latency when the run was
        too light to saturate the server (an open loop at a low rate)."""
        return min(self.mean_ms / 1000, self.vcpus / self.ok_qps)

    def label(self) -> str:
        where = f"{self.vcpus} local core(s)" if self.estimate else self.where
        return (
            f"{self.file} on {where}: {decimal_text(self.ok_qps, 0)} req/s, p99 {decimal_text(self.p99_ms, 2)} ms, "
            f"mean {decimal_text(self.mean_ms, 3)} ms"
            + (
                f", {self.request_rows} row(s) and {size_text(self.request_bytes)} per request"
                if self.request_rows
                else ""
            )
        )


def load_measurement(path: Path, where: str, vcpus: int) -> Measurement:
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise invalid_input(f"{path}: not a loadtest report ({exc})", field="measured", value=str(path)) from None
    latency = report.get("ok_latency_ms") or {}
    if not isinstance(report, dict) or not report.get("ok_qps") or "p99" not in latency:
        raise invalid_input(
            f"{path}: has no successful requests to size from",
            field="measured",
            value=str(path),
            allowed="a `servestack loadtest` report with 2xx answers",
        )
    return Measurement(
        file=path.name,
        where=where,
        vcpus=vcpus,
        ok_qps=exact(report["ok_qps"]),
        p99_ms=exact(round(latency["p99"], 3)),
        mean_ms=exact(round(latency["mean"], 3)),
        request_bytes=int(report.get("request_bytes") or 0),
        request_rows=report.get("request_rows"),
    )


def measurement_from(spec: str, prices: Prices, local_cores: int, base: Path | None = None) -> Measurement:
    """`FILE` (measured locally) or `ml.c6i.xlarge=FILE`."""
    where, _, file = spec.rpartition("=")
    where = where or "local"
    path = Path(file) if base is None or Path(file).is_absolute() else base / file
    if where == "local":
        return load_measurement(path, "local", local_cores)
    if where not in prices.instances:
        raise invalid_input(
            f"measured: {where!r} is not an instance type in {prices.path.name}",
            field="measured",
            value=where,
            allowed=f"local, {', '.join(sorted(prices.instances))}",
        )
    return load_measurement(path, where, prices.instances[where].vcpus)
