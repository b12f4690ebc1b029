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

from servestack.plan.cli import arguments, from_args, render, run
from servestack.plan.modes import plan, plan_async, plan_batch, plan_realtime, plan_serverless
from servestack.plan.profile import PRICES_FILE, Measurement, Prices, Traffic, load_measurement, traffic_from
from servestack.plan.results import CostLine, Option, Plan

__all__ = [
    "PRICES_FILE",
    "CostLine",
    "Measurement",
    "Option",
    "Plan",
    "Prices",
    "Traffic",
    "arguments",
    "from_args",
    "load_measurement",
    "plan",
    "plan_async",
    "plan_batch",
    "plan_realtime",
    "plan_serverless",
    "render",
    "run",
    "traffic_from",
]
