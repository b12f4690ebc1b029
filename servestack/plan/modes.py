"""The model of each mode (the package's docstring says each assumption): from a traffic profile, the measured
capacity and the prices, the configuration and the monthly cost of realtime, serverless, async and batch."""

from __future__ import annotations

import math
from collections.abc import Iterable
from fractions import Fraction
from typing import Any

from servestack.architectures import Architecture, describe, instance_architecture
from servestack.plan.profile import (
    ASYNC_BATCH_WINDOW_SEC,
    ASYNC_MAX_PAYLOAD,
    ASYNC_MEMORY_PER_PAYLOAD,
    ASYNC_RESULT_TTL_DAYS,
    BATCH_CHUNK_ROWS,
    FARGATE_CPU_UNITS,
    FARGATE_MEMORY_MIB,
    GIB,
    HTTP_API_MAX_RATE,
    LAMBDA_DEFAULT_CONCURRENCY_QUOTA,
    LAMBDA_MAX_MEMORY_MIB,
    LAMBDA_TIMEOUT_SEC,
    MAX_INSTANCES,
    MIB,
    SERVERLESS_MEMORY_MIB,
    SUBMIT_BILLED_MS,
    SUBMIT_MEMORY_MIB,
    SYNC_MAX_PAYLOAD,
    InstancePrice,
    Measurement,
    Prices,
    Traffic,
    size_text,
)
from servestack.plan.results import CostLine, Option, Plan
from servestack.sizing import concurrency, decimal_text

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
        elif best_local is not None and instance.gpus == 0 and _architecture(instance) == LOCAL_ARCHITECTURE:
            # A local core's rate stands for a vCPU of the same architecture only: onnxruntime's kernels, and
            # what a vCPU is (a Graviton vCPU is a core, an x86 one a hyperthread), differ across them.
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
    by_cost = sorted(
        candidates, key=lambda o: (o.monthly_usd, order.index(o.deployment["instance_type"] if o.deployment else ""))
    )
    chosen = by_cost[0]
    if chosen.details["gpus"] == 0:
        chosen.beside = _other_architecture(chosen, by_cost, prices)
    return chosen


# What `servestack loadtest` reports measured on "local" cores are taken to be (servestack/architectures.py).
LOCAL_ARCHITECTURE: Architecture = "x86_64"


def _architecture(instance: InstancePrice) -> Architecture:
    return instance_architecture(instance.instance_type)


def _other_architecture(chosen: Option, by_cost: list[Option], prices: Prices) -> list[str]:
    """The cheapest CPU option of the other architecture, priced beside the chosen one (Graviton beside x86 and
    the reverse), or what to measure to price it."""
    assert chosen.deployment is not None
    mine = instance_architecture(chosen.deployment["instance_type"])
    other: Architecture = "arm64" if mine == "x86_64" else "x86_64"
    for option in by_cost:
        assert option.deployment is not None
        itype = option.deployment["instance_type"]
        if option.details["gpus"] == 0 and instance_architecture(itype) == other:
            assert option.monthly_usd is not None
            how = "estimated from local cores" if option.estimate else "measured"
            lo, hi = option.deployment["min_instances"], option.deployment["max_instances"]
            return [
                f"{describe(other)}: {itype} x {lo}..{hi} ${decimal_text(option.monthly_usd, 2)}/month "
                f"({decimal_text(Fraction(option.details['capacity_qps']), 0)} req/s per instance, {how})"
            ]
    vcpus = prices.instances[chosen.deployment["instance_type"]].vcpus
    same_size = [i for i in prices.instances.values() if i.gpus == 0 and _architecture(i) == other and i.vcpus == vcpus]
    if not same_size:
        return []
    cheapest = min(same_size, key=lambda i: i.usd_per_hour)
    return [
        f"{describe(other)}: not priced for this traffic: no load test on an {other} instance type (a local core's "
        f"rate stands for {LOCAL_ARCHITECTURE} vCPUs only); {cheapest.instance_type} costs "
        f"${decimal_text(cheapest.usd_per_hour, 4)}/h: load-test one and pass --measured {cheapest.instance_type}=FILE"
    ]


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
            "gpus": instance.gpus,
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


def lambda_package_note(package_bytes: int | None) -> str | None:
    """How a Lambda deployment of the model ships (a zip bundle, or a container image past Lambda's zip limit),
    when the model's package is known; the same rule the constructs apply (`lambda_package: auto`)."""
    if package_bytes is None:
        return None
    from servestack.cdk.sources import RUNTIME_BUNDLE_BYTES, ZIP_LIMIT_BYTES

    total = package_bytes + RUNTIME_BUNDLE_BYTES
    if total > ZIP_LIMIT_BYTES:
        return (
            f"ships as a Lambda container image: the model package ({size_text(package_bytes)}) and servestack's "
            f"runtime pass the {ZIP_LIMIT_BYTES // 2**20} MiB zip limit (same price; a slower cold start)"
        )
    return f"ships as a zip bundle (~{size_text(total)} of Lambda's {ZIP_LIMIT_BYTES // 2**20} MiB unzipped limit)"


def plan(
    traffic: Traffic,
    measurements: list[Measurement],
    prices: Prices,
    *,
    model: str = "my-model",
    version: str | None = None,
    batch_rows_per_sec: Fraction | None = None,
    package_bytes: int | None = None,
) -> Plan:
    options = [
        plan_realtime(traffic, measurements, prices),
        plan_serverless(traffic, measurements, prices),
        plan_async(traffic, measurements, prices),
        plan_batch(traffic, measurements, prices, batch_rows_per_sec),
    ]
    note = lambda_package_note(package_bytes)
    for option in options:
        if note is not None and option.feasible and option.mode in ("serverless", "async"):
            option.notes.append(note)
    return Plan(traffic, prices, measurements, options, model, version)
