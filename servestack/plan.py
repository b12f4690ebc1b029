"""`servestack plan`: which mode, which configuration and what monthly cost, for one traffic profile.

Input: a traffic profile (peak and average QPS, hours of traffic per day, payload size, p99 latency SLO, and
rows per day for offline work) from flags or a YAML file, and capacity measured by `servestack loadtest`
(its JSON reports), per SageMaker instance type where the user has run one there, else per local core
(marked as an estimate: per-vCPU throughput x the instance's vCPUs).

For each mode it reports the configuration and the monthly cost, or why the mode is ruled out; it recommends
the cheapest mode that meets the SLO and the payload limits and prints its `serving.yaml` fragment. With
four profiles this reproduces SageMaker's decision table: steady traffic -> realtime, spiky low traffic ->
serverless, large payloads -> async, offline rows -> batch (tests/unit/test_plan.py).

Prices come from one dated file, `servestack/data/prices.json` (source page per figure, and whether it was
re-checked on the date read); the output states the date. All arithmetic is exact (`Fraction`): concurrency
= QPS x latency, and counts are rounded up only at the end (servestack/sizing.py).

The model of each mode, and where its limits come from:
- realtime (SageMaker endpoint on instances): payload <= 6 MiB and 60 s per invocation (SageMaker real-time
  inference limits). Instances = ceil(QPS x headroom / measured req/s per instance); autoscaling keeps
  `min_instances` (the average's count when traffic runs 24 h a day, else 1) and scales to the peak's count;
  cost = instance-hours (active hours at the average's count, the rest at `min_instances`) x hourly price.
- serverless (Lambda behind an HTTP API): payload <= 6 MiB (Lambda synchronous invocation), HTTP API
  throttle <= 10,000 req/s (the spec's bound; API Gateway's default account rate). Memory 2,048 MB: from
  1,769 MB a function has one full vCPU (Lambda documentation), so a request takes the measured CPU time of
  one request on one core, billed per started millisecond. Concurrency at peak = peak QPS x that time.
- async (HTTP API -> S3 + SQS -> worker Lambda, DynamoDB job table): payload <= 1 GB (presigned upload),
  worker time <= 900 s (Lambda's timeout). A job's time = payload bytes / measured bytes per second per core;
  its latency adds the 1 s SQS batching window. Per job: 2 HTTP API calls and 2 submit invocations (upload
  URL, status), 2 S3 PUTs and 2 GETs (payload and result), 3 SQS requests (send, receive, delete), 3 DynamoDB
  writes (create, claim, result) and 1 read (status), 1 worker invocation; payloads are kept
  `result_ttl_days` (7) in S3.
- batch (scheduled job on Lambda or Fargate): answers once per run, so only for rows per day. One process
  on one vCPU scores rows at the measured rate; Lambda when the run fits its 900 s timeout with headroom,
  else Fargate (1 vCPU, 4 GB); one S3 PUT per part of 10,000 rows; one run a day.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

from servestack.sizing import Number, concurrency, decimal_text, exact

Mode = Literal["realtime", "serverless", "async", "batch"]
MODES: tuple[Mode, ...] = ("realtime", "serverless", "async", "batch")
PRICES_FILE = Path(__file__).resolve().parent / "data" / "prices.json"

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
SUBMIT_MEMORY_MIB = 512  # the async submit function (stacks/asynchronous.py)
# Not measured: the submit function only writes a job record and presigns a URL; 20 ms is a round figure.
SUBMIT_BILLED_MS = 20
ASYNC_BATCH_WINDOW_SEC = 1
ASYNC_RESULT_TTL_DAYS = 7
# A worker holds the payload's text, its parsed rows and the arrays at once: 6x the payload is an estimate.
ASYNC_MEMORY_PER_PAYLOAD = 6
BATCH_CHUNK_ROWS = 10_000
FARGATE_CPU_UNITS, FARGATE_MEMORY_MIB = 1024, 4096


def _invalid(message: str, field: str, value: Any = None, allowed: str | None = None) -> Exception:
    from models.errors import InvalidInput

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
        raise _invalid(
            f"payload: {value!r} is not a size",
            field="payload",
            value=value,
            allowed="bytes, or e.g. '1.4 KB', '200 MB'",
        )
    try:
        return math.ceil(exact(number) * _SIZE_UNITS[unit])
    except (ArithmeticError, ValueError):
        raise _invalid(
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


def _number(name: str, value: Any, *, low: Fraction, high: Fraction | None = None, low_open: bool = False) -> Fraction:
    allowed = f"a number {'>' if low_open else '>='} {decimal_text(low, 0)}" + (
        f" and <= {decimal_text(high, 0)}" if high is not None else ""
    )
    try:
        number = exact(value) if not isinstance(value, bool) else None
    except (ArithmeticError, ValueError, TypeError):
        number = None
    if number is None or number < low or (low_open and number == low) or (high is not None and number > high):
        raise _invalid(f"{name}: {value!r} is not {allowed}", field=name, value=value, allowed=allowed)
    return number


def traffic_from(values: Mapping[str, Any]) -> Traffic:
    """A profile from plain values (YAML or flags); every problem names the field and what is allowed."""
    unknown = sorted(set(values) - set(TRAFFIC_FIELDS))
    if unknown:
        raise _invalid(
            f"traffic: unknown keys {unknown}", field="traffic", value=unknown, allowed=", ".join(TRAFFIC_FIELDS)
        )
    rows_per_day = _number("rows_per_day", values.get("rows_per_day", 0), low=Fraction(0))
    offline = rows_per_day > 0
    average = _number("average_qps", values.get("average_qps", 0), low=Fraction(0))
    if values.get("peak_qps") is not None and values.get("burstiness") is not None:
        raise _invalid(
            "give peak_qps or burstiness, not both", field="burstiness", allowed="peak_qps, or burstiness x average_qps"
        )
    if values.get("burstiness") is not None:
        peak = average * _number("burstiness", values["burstiness"], low=Fraction(1))
    else:
        peak = _number("peak_qps", values.get("peak_qps", average), low=Fraction(0))
    if offline and peak > 0:
        raise _invalid(
            "a profile is either online traffic (QPS) or offline rows per day: plan them separately",
            field="rows_per_day",
            value=int(rows_per_day),
            allowed="0 when peak_qps/average_qps are given",
        )
    if not offline:
        if peak <= 0 or average <= 0:
            raise _invalid(
                "traffic: give peak_qps and average_qps (> 0), or rows_per_day for offline work",
                field="average_qps",
                value=values.get("average_qps"),
                allowed="> 0",
            )
        if average > peak:
            raise _invalid(
                f"average_qps: {decimal_text(average)} is over peak_qps {decimal_text(peak)}",
                field="average_qps",
                value=values.get("average_qps"),
                allowed=f"<= peak_qps ({decimal_text(peak)})",
            )
    if offline and "p99_ms" not in values:
        p99 = Fraction(0)
    else:
        p99 = _number("p99_ms", values.get("p99_ms"), low=Fraction(0), low_open=True)
    return Traffic(
        peak_qps=peak,
        average_qps=average,
        hours_per_day=_number(
            "hours_per_day", values.get("hours_per_day", 24), low=Fraction(0), high=Fraction(24), low_open=True
        ),
        payload_bytes=parse_size(values.get("payload", 0)) if not offline else 0,
        p99_ms=p99,
        rows_per_day=int(rows_per_day),
        batch_window_hours=_number(
            "batch_window_hours", values.get("batch_window_hours", 6), low=Fraction(0), high=Fraction(24), low_open=True
        ),
        headroom=_number("headroom", values.get("headroom", "1.5"), low=Fraction(1)),
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
        raise _invalid(f"{path}: not a loadtest report ({exc})", field="measured", value=str(path)) from None
    latency = report.get("ok_latency_ms") or {}
    if not isinstance(report, dict) or not report.get("ok_qps") or "p99" not in latency:
        raise _invalid(
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
        raise _invalid(
            f"measured: {where!r} is not an instance type in {prices.path.name}",
            field="measured",
            value=where,
            allowed=f"local, {', '.join(sorted(prices.instances))}",
        )
    return load_measurement(path, where, prices.instances[where].vcpus)


# --------------------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class CostLine:
    """quantity x the unit price of `price_key` = usd; the test checks each against the price file."""

    what: str
    quantity: Fraction
    price_key: str
    unit_usd: Fraction

    @property
    def usd(self) -> Fraction:
        return self.quantity * self.unit_usd


@dataclass
class Option:
    mode: Mode
    feasible: bool
    reason: str = ""
    configuration: str = ""
    lines: list[CostLine] = field(default_factory=list)
    deployment: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    estimate: bool = False
    # Figures behind the configuration (instances, concurrency, seconds per job...), exact.
    details: dict[str, Fraction | int] = field(default_factory=dict)

    @property
    def monthly_usd(self) -> Fraction | None:
        return sum((line.usd for line in self.lines), Fraction(0)) if self.feasible else None

    @classmethod
    def ruled_out(cls, mode: Mode, reason: str) -> Option:
        return cls(mode, False, reason)


@dataclass
class Plan:
    traffic: Traffic
    prices: Prices
    measurements: list[Measurement]
    options: list[Option]
    model: str
    version: str | None

    @property
    def recommended(self) -> Option | None:
        feasible = [o for o in self.options if o.feasible]
        if not feasible:
            return None
        return min(feasible, key=lambda o: (o.monthly_usd, MODES.index(o.mode)))

    def fragment(self) -> dict[str, Any] | None:
        chosen = self.recommended
        if chosen is None or chosen.deployment is None:
            return None
        block: dict[str, Any] = {"mode": chosen.mode, "model": self.model}
        if self.version:
            block["version"] = self.version
        block.update(chosen.deployment)
        return {"deployments": {f"{self.model}-{chosen.mode}": block}}

    def to_dict(self) -> dict[str, Any]:
        chosen = self.recommended
        return {
            "prices": {
                "file": self.prices.path.name,
                "read_on": self.prices.read_on,
                "region": self.prices.region,
                "not_rechecked": self.prices.not_rechecked,
            },
            "traffic": self.traffic.describe(),
            "measurements": [m.label() for m in self.measurements],
            "options": [
                {
                    "mode": o.mode,
                    "feasible": o.feasible,
                    "reason": o.reason,
                    "configuration": o.configuration,
                    "estimate": o.estimate,
                    "monthly_usd": None if o.monthly_usd is None else decimal_text(o.monthly_usd, 2, grouping=False),
                    "lines": [
                        {
                            "what": line.what,
                            "quantity": str(line.quantity),
                            "price": line.price_key,
                            "usd": decimal_text(line.usd, 4, grouping=False),
                        }
                        for line in o.lines
                    ],
                    "notes": o.notes,
                }
                for o in self.options
            ],
            "recommended": chosen.mode if chosen else None,
            "fragment": self.fragment(),
        }


# ---------------------------------------------------------------------------------------------- modes


def _active_seconds(traffic: Traffic, prices: Prices) -> Fraction:
    """Seconds of traffic a month: hours per day x days per month (the price file's hours per month / 24)."""
    return traffic.hours_per_day * 3600 * prices.hours_per_month / 24


def _meets_slo(runs: Iterable[Measurement], traffic: Traffic) -> list[Measurement]:
    return [m for m in runs if m.p99_ms <= traffic.p99_ms]


def _slo_miss(runs: list[Measurement], traffic: Traffic) -> str:
    best = min(runs, key=lambda m: m.p99_ms)
    return (
        f"the lowest measured p99 is {decimal_text(best.p99_ms, 2)} ms ({best.file}), over the "
        f"{decimal_text(traffic.p99_ms, 1)} ms SLO; load-test at lower rates (`servestack loadtest --rate`)"
    )


def plan_realtime(traffic: Traffic, runs: list[Measurement], prices: Prices) -> Option:
    if not traffic.online:
        return Option.ruled_out("realtime", "the profile has no online requests: offline rows go to batch")
    if traffic.payload_bytes > SYNC_MAX_PAYLOAD:
        return Option.ruled_out(
            "realtime", f"payload {size_text(traffic.payload_bytes)} is over SageMaker real-time's 6 MB request limit"
        )
    if not runs:
        return Option.ruled_out("realtime", "no measurements: pass --measured with `servestack loadtest` reports")
    usable = _meets_slo(runs, traffic)
    if not usable:
        return Option.ruled_out("realtime", _slo_miss(runs, traffic))
    local = [m for m in usable if m.estimate]
    best_local = max(local, key=lambda m: m.per_vcpu_qps) if local else None
    candidates: list[Option] = []
    skipped: list[str] = []
    order = list(prices.instances)  # ties go to the type listed first (the price file lists newer ones first)
    for instance in prices.instances.values():
        measured = [m for m in usable if m.where == instance.instance_type]
        if measured:
            source = max(measured, key=lambda m: m.ok_qps)
            capacity, estimate = source.ok_qps, False
        elif best_local is not None and instance.gpus == 0:
            source = best_local
            capacity, estimate = best_local.per_vcpu_qps * instance.vcpus, True
        else:
            continue
        option = _realtime_on(instance, capacity, estimate, source, traffic, prices)
        if option.feasible:
            candidates.append(option)
        else:
            skipped.append(option.reason)
    if not candidates:
        return Option.ruled_out("realtime", "; ".join(skipped) or "no instance type has a measurement or an estimate")
    return min(
        candidates, key=lambda o: (o.monthly_usd, order.index(o.deployment["instance_type"] if o.deployment else ""))
    )


def _realtime_on(
    instance: InstancePrice, capacity: Fraction, estimate: bool, source: Measurement, traffic: Traffic, prices: Prices
) -> Option:
    usable = capacity / traffic.headroom  # req/s each instance takes, keeping the headroom
    for_peak = max(1, math.ceil(traffic.peak_qps / usable))
    for_average = max(1, math.ceil(traffic.average_qps / usable))
    always_on = traffic.hours_per_day == 24
    min_instances = for_average if always_on else 1
    max_instances = max(min_instances, for_peak)
    if max_instances > MAX_INSTANCES:
        return Option.ruled_out(
            "realtime", f"{instance.instance_type} needs {max_instances} instances; serving.yaml allows {MAX_INSTANCES}"
        )
    days = prices.hours_per_month / 24
    active = max(min_instances, for_average)
    instance_hours = days * (traffic.hours_per_day * active + (24 - traffic.hours_per_day) * min_instances)
    per_minute = max(1, min(1_000_000, math.floor(usable * 60)))
    how = (
        f"estimated from {source.file} ({decimal_text(source.per_vcpu_qps, 0)} req/s per local core "
        f"x {instance.vcpus} vCPUs)"
        if estimate
        else f"measured ({source.file})"
    )
    option = Option(
        "realtime",
        True,
        configuration=(
            f"{instance.instance_type} x {min_instances}..{max_instances} (autoscaling at {per_minute:,} invocations "
            f"per instance per minute); {decimal_text(capacity, 0)} req/s per instance {how}, p99 "
            f"{decimal_text(source.p99_ms, 2)} ms"
        ),
        lines=[
            CostLine(
                f"{decimal_text(instance_hours, 2)} {instance.instance_type} instance-hours "
                f"({decimal_text(traffic.hours_per_day, 1)} h/day x {active} + the rest x {min_instances})",
                instance_hours,
                f"sagemaker:{instance.instance_type}",
                instance.usd_per_hour,
            )
        ],
        deployment={
            "instance_type": instance.instance_type,
            "min_instances": min_instances,
            "max_instances": max_instances,
            "target_invocations_per_instance": per_minute,
        },
        estimate=estimate,
        details={
            "capacity_qps": capacity,
            "instances_for_peak": for_peak,
            "instances_for_average": for_average,
            "instance_hours": instance_hours,
        },
    )
    if min_instances == 1:
        option.notes.append("one instance is one Availability Zone: min_instances: 2 survives an instance failing")
    if max_instances > min_instances:
        option.notes.append(
            f"bursts above {decimal_text(usable * min_instances, 0)} req/s wait for scale-out (minutes); "
            f"min_instances: {max_instances} holds the peak for "
            f"${decimal_text(days * 24 * (max_instances - min_instances) * instance.usd_per_hour, 2)}/month more"
        )
    if instance.gpus == 0 and estimate:
        option.notes.append("an estimate from local cores: load-test one instance and pass --measured TYPE=FILE")
    return option


def plan_serverless(traffic: Traffic, runs: list[Measurement], prices: Prices) -> Option:
    if not traffic.online:
        return Option.ruled_out("serverless", "the profile has no online requests: offline rows go to batch")
    if traffic.payload_bytes > SYNC_MAX_PAYLOAD:
        return Option.ruled_out(
            "serverless", f"payload {size_text(traffic.payload_bytes)} is over Lambda's 6 MB synchronous payload limit"
        )
    if traffic.peak_qps * traffic.headroom > HTTP_API_MAX_RATE:
        return Option.ruled_out(
            "serverless",
            f"peak {decimal_text(traffic.peak_qps, 0)} req/s x headroom is over the HTTP API's {HTTP_API_MAX_RATE:,} "
            f"req/s account throttle (serving.yaml's bound on throttle_rate_per_sec)",
        )
    cpu_runs = [m for m in runs if m.estimate or prices.instances[m.where].gpus == 0]
    if not cpu_runs:
        return Option.ruled_out("serverless", "no CPU measurement (local or a CPU instance type) to size Lambda from")
    usable = _meets_slo(cpu_runs, traffic)
    if not usable:
        return Option.ruled_out("serverless", _slo_miss(cpu_runs, traffic))
    source = min(usable, key=lambda m: m.cpu_seconds_per_request)
    seconds = source.cpu_seconds_per_request
    billed_ms = max(1, math.ceil(seconds * 1000))  # Lambda bills each started millisecond
    memory_gb = Fraction(SERVERLESS_MEMORY_MIB, 1024)
    requests = traffic.average_qps * _active_seconds(traffic, prices)
    at_peak = concurrency(traffic.peak_qps, seconds)
    rate = min(HTTP_API_MAX_RATE, max(100, math.ceil(traffic.peak_qps * traffic.headroom)))
    option = Option(
        "serverless",
        True,
        configuration=(
            f"Lambda {SERVERLESS_MEMORY_MIB} MB x86_64, {decimal_text(seconds * 1000, 3)} ms per request "
            f"(billed {billed_ms} ms) from {source.file}; concurrency at peak {at_peak} "
            f"({decimal_text(traffic.peak_qps)} req/s x {decimal_text(seconds, 6)} s); no provisioned concurrency"
        ),
        lines=[
            CostLine(
                f"{decimal_text(requests, 0)} Lambda requests",
                requests,
                "lambda.request",
                prices.unit("lambda.request"),
            ),
            CostLine(
                f"{decimal_text(requests * billed_ms / 1000 * memory_gb, 1)} GB-s of Lambda duration",
                requests * billed_ms / 1000 * memory_gb,
                "lambda.duration.x86_64",
                prices.unit("lambda.duration.x86_64"),
            ),
            CostLine(
                f"{decimal_text(requests, 0)} HTTP API requests",
                requests,
                "apigateway.http_request",
                prices.unit("apigateway.http_request"),
            ),
        ],
        deployment={
            "memory_mib": SERVERLESS_MEMORY_MIB,
            "throttle_rate_per_sec": rate,
            "throttle_burst": min(5000, max(200, rate)),
        },
        estimate=source.estimate,
        details={
            "seconds_per_request": seconds,
            "billed_ms": billed_ms,
            "concurrency_at_peak": at_peak,
            "requests": requests,
        },
    )
    warm = memory_gb * prices.hours_per_month * 3600 * prices.unit("lambda.provisioned")
    option.notes.append(
        f"new execution environments start cold (import + model load); provisioned_concurrency_min: N keeps N warm "
        f"for ${decimal_text(warm, 2)}/month each"
    )
    if at_peak > LAMBDA_DEFAULT_CONCURRENCY_QUOTA:
        option.notes.append(
            f"concurrency at peak {at_peak} is over Lambda's default quota of {LAMBDA_DEFAULT_CONCURRENCY_QUOTA} "
            f"per region: ask AWS for more"
        )
    return option


def plan_async(traffic: Traffic, runs: list[Measurement], prices: Prices) -> Option:
    if not traffic.online:
        return Option.ruled_out("async", "the profile has no online requests: offline rows go to batch")
    if traffic.payload_bytes > ASYNC_MAX_PAYLOAD:
        return Option.ruled_out(
            "async", f"payload {size_text(traffic.payload_bytes)} is over the 1 GB async upload limit"
        )
    cpu_runs = [m for m in runs if m.estimate or prices.instances[m.where].gpus == 0]
    if not cpu_runs:
        return Option.ruled_out("async", "no CPU measurement (local or a CPU instance type) to size the worker from")
    sized = [m for m in cpu_runs if m.request_bytes]
    if sized and traffic.payload_bytes:
        source = max(sized, key=lambda m: m.request_bytes * m.per_vcpu_qps)
        bytes_per_sec = source.request_bytes * source.per_vcpu_qps
        seconds = Fraction(traffic.payload_bytes) / bytes_per_sec
        how = f"{size_text(traffic.payload_bytes)} at {size_text(math.floor(bytes_per_sec))}/s per core ({source.file})"
    else:
        source = min(cpu_runs, key=lambda m: m.cpu_seconds_per_request)
        seconds = source.cpu_seconds_per_request
        how = f"one measured request's time ({source.file}; the report does not say its size)"
    if seconds > LAMBDA_TIMEOUT_SEC:
        return Option.ruled_out(
            "async",
            f"a job takes ~{decimal_text(seconds, 0)} s ({how}); Lambda stops at {LAMBDA_TIMEOUT_SEC} s: "
            f"use `backend: sagemaker` (1 hour per job)",
        )
    memory_mib = max(2048, 64 * math.ceil(Fraction(ASYNC_MEMORY_PER_PAYLOAD * traffic.payload_bytes, MIB) / 64))
    if memory_mib > LAMBDA_MAX_MEMORY_MIB:
        return Option.ruled_out(
            "async",
            f"a {size_text(traffic.payload_bytes)} payload needs ~{memory_mib} MB of worker memory; Lambda has 10,240",
        )
    latency_ms = (seconds + ASYNC_BATCH_WINDOW_SEC) * 1000
    if latency_ms > traffic.p99_ms:
        return Option.ruled_out(
            "async",
            f"a job's answer takes ~{decimal_text(latency_ms, 0)} ms ({ASYNC_BATCH_WINDOW_SEC} s SQS batching window + "
            f"{decimal_text(seconds * 1000, 1)} ms of work), over the {decimal_text(traffic.p99_ms, 1)} ms SLO",
        )
    jobs = traffic.average_qps * _active_seconds(traffic, prices)
    billed_ms = max(1, math.ceil(seconds * 1000))
    days = prices.hours_per_month / 24
    stored = jobs * traffic.payload_bytes * ASYNC_RESULT_TTL_DAYS / days / GIB
    timeout = min(LAMBDA_TIMEOUT_SEC, max(120, math.ceil(3 * seconds)))
    in_flight = max(2, min(1000, concurrency(traffic.peak_qps, seconds)))
    unit = prices.unit
    option = Option(
        "async",
        True,
        configuration=(
            f"worker Lambda {memory_mib} MB, ~{decimal_text(seconds, 3)} s per job ({how}), timeout {timeout} s, "
            f"up to {in_flight} at once; answers in ~{decimal_text(latency_ms / 1000, 1)} s"
        ),
        lines=[
            CostLine(
                f"{decimal_text(2 * jobs, 0)} HTTP API calls (upload URL + status)",
                2 * jobs,
                "apigateway.http_request",
                unit("apigateway.http_request"),
            ),
            CostLine(
                f"{decimal_text(2 * jobs + jobs, 0)} Lambda requests (2 submit + 1 worker per job)",
                3 * jobs,
                "lambda.request",
                unit("lambda.request"),
            ),
            CostLine(
                "submit Lambda duration GB-s",
                2 * jobs * Fraction(SUBMIT_BILLED_MS, 1000) * Fraction(SUBMIT_MEMORY_MIB, 1024),
                "lambda.duration.x86_64",
                unit("lambda.duration.x86_64"),
            ),
            CostLine(
                "worker Lambda duration GB-s",
                jobs * Fraction(billed_ms, 1000) * Fraction(memory_mib, 1024),
                "lambda.duration.x86_64",
                unit("lambda.duration.x86_64"),
            ),
            CostLine(f"{decimal_text(2 * jobs, 0)} S3 PUTs (payload, result)", 2 * jobs, "s3.put", unit("s3.put")),
            CostLine(f"{decimal_text(2 * jobs, 0)} S3 GETs (payload, result)", 2 * jobs, "s3.get", unit("s3.get")),
            CostLine(
                f"{decimal_text(stored, 1)} GB-month of payloads kept {ASYNC_RESULT_TTL_DAYS} days",
                stored,
                "s3.storage",
                unit("s3.storage"),
            ),
            CostLine(
                f"{decimal_text(3 * jobs, 0)} SQS requests (send, receive, delete)",
                3 * jobs,
                "sqs.request",
                unit("sqs.request"),
            ),
            CostLine(
                f"{decimal_text(3 * jobs, 0)} DynamoDB writes (create, claim, result)",
                3 * jobs,
                "dynamodb.write",
                unit("dynamodb.write"),
            ),
            CostLine(f"{decimal_text(jobs, 0)} DynamoDB reads (status)", jobs, "dynamodb.read", unit("dynamodb.read")),
        ],
        deployment={
            "memory_mib": memory_mib,
            "timeout_sec": timeout,
            "batch_size": 1 if traffic.payload_bytes > SYNC_MAX_PAYLOAD else 10,
            "max_concurrency": in_flight,
        },
        estimate=source.estimate,
        details={"seconds_per_job": seconds, "jobs": jobs, "memory_mib": memory_mib},
    )
    option.notes.append(
        f"worker memory is {ASYNC_MEMORY_PER_PAYLOAD}x the payload, an estimate: run one job and adjust memory_mib"
    )
    option.notes.append(
        f"the data bucket has no expiry rule: the cost assumes payloads are deleted after {ASYNC_RESULT_TTL_DAYS} days"
    )
    return option


def plan_batch(traffic: Traffic, runs: list[Measurement], prices: Prices, rows_per_sec: Fraction | None) -> Option:
    if traffic.online:
        return Option.ruled_out(
            "batch",
            f"a scheduled run answers hours after a request, not within the "
            f"{decimal_text(traffic.p99_ms, 1)} ms p99 SLO",
        )
    estimate = False
    if rows_per_sec is not None:
        rate, how = rows_per_sec, f"{decimal_text(rows_per_sec, 0)} rows/s per core (--batch-rows-per-sec)"
    else:
        rowed = [m for m in runs if m.request_rows and (m.estimate or prices.instances[m.where].gpus == 0)]
        if not rowed:
            return Option.ruled_out(
                "batch",
                "no batch throughput: pass --batch-rows-per-sec (rows/s of `servestack local run-batch`) or a "
                "loadtest report of a request with rows",
            )
        source = max(rowed, key=lambda m: m.per_vcpu_qps * (m.request_rows or 0))
        rate = source.per_vcpu_qps * (source.request_rows or 0)
        how = f"{decimal_text(rate, 0)} rows/s per core from {source.file} (HTTP requests: batch files go faster)"
        estimate = True
    seconds = Fraction(traffic.rows_per_day) / rate
    if seconds > traffic.batch_window_hours * 3600:
        return Option.ruled_out(
            "batch",
            f"one run takes ~{decimal_text(seconds / 3600, 1)} h at {how}, over the "
            f"{decimal_text(traffic.batch_window_hours, 1)} h window (a batch deployment is one process: split the "
            f"input over several deployments)",
        )
    runs_per_month = prices.hours_per_month / 24
    parts = math.ceil(Fraction(traffic.rows_per_day, BATCH_CHUNK_ROWS)) + 1  # + the run manifest
    unit = prices.unit
    lines = [
        CostLine(
            f"{decimal_text(parts * runs_per_month, 0)} S3 PUTs ({parts:,} per run)",
            parts * runs_per_month,
            "s3.put",
            unit("s3.put"),
        )
    ]
    if seconds * traffic.headroom <= LAMBDA_TIMEOUT_SEC:
        billed_ms = max(1, math.ceil(seconds * 1000))
        timeout = min(LAMBDA_TIMEOUT_SEC, max(60, math.ceil(seconds * traffic.headroom)))
        deployment: dict[str, Any] = {"runner": "lambda", "memory_mib": 2048, "timeout_sec": timeout}
        configuration = f"Lambda 2048 MB, ~{decimal_text(seconds, 0)} s per run ({how}), timeout {timeout} s"
        lines += [
            CostLine("Lambda requests", runs_per_month, "lambda.request", unit("lambda.request")),
            CostLine(
                "Lambda duration GB-s",
                runs_per_month * Fraction(billed_ms, 1000) * 2,
                "lambda.duration.x86_64",
                unit("lambda.duration.x86_64"),
            ),
        ]
    else:
        hours = max(Fraction(1, 60), Fraction(math.ceil(seconds), 3600))  # per second, one minute minimum
        deployment = {"runner": "fargate", "fargate_cpu": FARGATE_CPU_UNITS, "fargate_memory_mib": FARGATE_MEMORY_MIB}
        configuration = (
            f"Fargate 1 vCPU / 4 GB, ~{decimal_text(seconds / 3600, 2)} h per run ({how}); over Lambda's "
            f"{LAMBDA_TIMEOUT_SEC} s timeout with headroom"
        )
        lines += [
            CostLine(
                f"{decimal_text(hours * runs_per_month, 1)} Fargate vCPU-hours",
                hours * runs_per_month,
                "fargate.vcpu",
                unit("fargate.vcpu"),
            ),
            CostLine(
                f"{decimal_text(4 * hours * runs_per_month, 1)} Fargate GB-hours",
                4 * hours * runs_per_month,
                "fargate.memory",
                unit("fargate.memory"),
            ),
            CostLine("public IPv4 hours", hours * runs_per_month, "vpc.public_ipv4", unit("vpc.public_ipv4")),
        ]
    deployment["schedule"] = "cron(0 2 * * ? *)"
    option = Option(
        "batch",
        True,
        configuration=configuration,
        lines=lines,
        deployment=deployment,
        estimate=estimate,
        details={"seconds_per_run": seconds, "runs": runs_per_month, "parts_per_run": parts},
    )
    option.notes.append("S3 GETs of the input files are not counted (one per input object per run)")
    return option


def plan(
    traffic: Traffic,
    measurements: list[Measurement],
    prices: Prices,
    *,
    model: str = "my-model",
    version: str | None = None,
    batch_rows_per_sec: Fraction | None = None,
) -> Plan:
    options = [
        plan_realtime(traffic, measurements, prices),
        plan_serverless(traffic, measurements, prices),
        plan_async(traffic, measurements, prices),
        plan_batch(traffic, measurements, prices, batch_rows_per_sec),
    ]
    return Plan(traffic, prices, measurements, options, model, version)


# ------------------------------------------------------------------------------------------------ CLI


def render(result: Plan) -> str:
    import yaml

    lines = [
        f"servestack plan ({result.prices.provenance()})",
        f"traffic: {result.traffic.describe()}",
        *(
            f"measured: {m.label()}" + ("  [per local core: estimates]" if m.estimate else "")
            for m in result.measurements
        ),
        "",
    ]
    for option in result.options:
        if option.feasible:
            assert option.monthly_usd is not None
            marker = " (estimate)" if option.estimate else ""
            lines.append(
                f"{option.mode:<10} ${decimal_text(option.monthly_usd, 2)}/month{marker}: {option.configuration}"
            )
            lines.extend(f"{'':<12}{line.what}: ${decimal_text(line.usd, 2)}" for line in option.lines)
            lines.extend(f"{'':<12}note: {note}" for note in option.notes)
        else:
            lines.append(f"{option.mode:<10} ruled out: {option.reason}")
    chosen = result.recommended
    lines.append("")
    if chosen is None:
        lines.append("no mode meets this profile")
        return "\n".join(lines)
    assert chosen.monthly_usd is not None
    lines.append(
        f"recommended: {chosen.mode}, ${decimal_text(chosen.monthly_usd, 2)}/month (the cheapest mode that meets the "
        f"SLO and payload limits)"
    )
    fragment = result.fragment()
    if fragment is not None:
        lines.append("serving.yaml fragment:")
        lines.append(yaml.safe_dump(fragment, sort_keys=False).rstrip())
    return "\n".join(lines)


def arguments(parser: argparse.ArgumentParser) -> None:
    """`servestack plan`'s arguments."""
    parser.add_argument(
        "--profile", type=Path, default=None, help="YAML: traffic:, measured:, model:, batch_rows_per_sec:"
    )
    parser.add_argument("--peak-qps", default=None, help="peak requests per second")
    parser.add_argument("--average-qps", default=None, help="average requests per second while traffic runs")
    parser.add_argument("--burstiness", default=None, help="peak / average (instead of --peak-qps)")
    parser.add_argument("--hours-per-day", default=None, help="hours of traffic a day (default 24)")
    parser.add_argument("--payload", default=None, help="request size, e.g. 1.4KB or 200MB")
    parser.add_argument("--p99-ms", default=None, help="p99 latency SLO in milliseconds")
    parser.add_argument("--rows-per-day", default=None, help="offline rows a day (batch)")
    parser.add_argument("--batch-window-hours", default=None, help="hours a batch run may take (default 6)")
    parser.add_argument("--headroom", default=None, help="capacity over the load (default 1.5)")
    parser.add_argument(
        "--measured",
        action="append",
        default=[],
        metavar="[TYPE=]FILE",
        help="a `servestack loadtest` report; TYPE is the SageMaker instance type it ran on (default: local)",
    )
    parser.add_argument("--local-cores", type=int, default=None, help="cores the local server used (default 1)")
    parser.add_argument("--batch-rows-per-sec", default=None, help="measured batch rows/s per core")
    parser.add_argument("--model", default=None, help="NAME[@VERSION] for the fragment (default my-model)")
    parser.add_argument("--prices", type=Path, default=PRICES_FILE, help="price file (default: the bundled one)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")


FLAG_FIELDS = {
    "peak_qps": "peak_qps", "average_qps": "average_qps", "burstiness": "burstiness", "hours_per_day": "hours_per_day",
    "payload": "payload", "p99_ms": "p99_ms", "rows_per_day": "rows_per_day",
    "batch_window_hours": "batch_window_hours", "headroom": "headroom",
}  # fmt: skip


def from_args(args: argparse.Namespace) -> Plan:
    """The profile file, then the flags over it."""
    import yaml

    document: dict[str, Any] = {}
    base: Path | None = None
    if args.profile is not None:
        try:
            loaded = yaml.safe_load(args.profile.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise _invalid(f"{args.profile}: {exc}", field="--profile", value=str(args.profile)) from None
        if not isinstance(loaded, dict):
            raise _invalid(f"{args.profile}: not a mapping", field="--profile", allowed="traffic:, measured:, ...")
        unknown = sorted(set(loaded) - {"traffic", "measured", "local_cores", "model", "batch_rows_per_sec"})
        if unknown:
            raise _invalid(
                f"{args.profile}: unknown keys {unknown}",
                field="--profile",
                value=unknown,
                allowed="traffic, measured, local_cores, model, batch_rows_per_sec",
            )
        document, base = loaded, args.profile.parent
    values = dict(document.get("traffic") or {})
    values.update({key: getattr(args, flag) for flag, key in FLAG_FIELDS.items() if getattr(args, flag) is not None})
    if args.burstiness is not None:
        values.pop("peak_qps", None)
    if args.peak_qps is not None:
        values.pop("burstiness", None)
    traffic = traffic_from(values)
    prices = Prices.load(args.prices)
    local_cores = args.local_cores or int(document.get("local_cores") or 1)
    specs = [(str(s), base) for s in document.get("measured") or []] + [(s, None) for s in args.measured]
    measurements = [measurement_from(spec, prices, local_cores, where) for spec, where in specs]
    rows_per_sec = args.batch_rows_per_sec or document.get("batch_rows_per_sec")
    model = str(args.model or document.get("model") or "my-model")
    name, _, version = model.partition("@")
    return plan(
        traffic,
        measurements,
        prices,
        model=name,
        version=version or None,
        batch_rows_per_sec=_number("batch_rows_per_sec", rows_per_sec, low=Fraction(0), low_open=True)
        if rows_per_sec is not None
        else None,
    )


def run(args: argparse.Namespace) -> int:
    """0: a mode is recommended; 1: none meets the profile. A bad profile raises a ServingError, which the
    CLI prints in one line (exit 2)."""
    result = from_args(args)
    print(json.dumps(result.to_dict(), indent=2) if args.json else render(result))
    return 0 if result.recommended is not None else 1
