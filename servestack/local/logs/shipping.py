"""A child's output lines to the emulator's CloudWatch Logs, written with its role's keys, as Lambda and
SageMaker write a function's or a container's output: the log group the template names (a function's
`LoggingConfig.LogGroup`, else `/aws/lambda/<name>`; `/aws/sagemaker/Endpoints/<endpoint>`), a stream per
process, `logs:CreateLogStream` then `logs:PutLogEvents` signed as the execution role. So a role without its
`logs:` grant is refused here as it is in AWS, where its lines are lost: the refusal is reported once, and
the child keeps running (its lines still reach local up's output).

Metrics in CloudWatch's embedded metric format (EMF, servestack/adapters/metrics.py) travel the same way: in AWS the
role only writes the log event, and CloudWatch Logs extracts the metrics from an event it accepted (no
`cloudwatch:PutMetricData` by the role). Here, each EMF line the role's PutLogEvents delivered is turned into
a PutMetricData call by the shipper, as the CloudWatch Logs service; an EMF line whose write was refused
yields no metric.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

MAX_BATCH_EVENTS = 1000  # PutLogEvents' limit of events per call
MAX_QUEUED = 10_000  # lines waiting past this are dropped (and counted), never blocking the child's output
FLUSH_SEC = 0.5


def lambda_stream_name(now: datetime | None = None) -> str:
    """Lambda's stream name for an execution environment: `YYYY/MM/DD/[$LATEST]<32 hex>`."""
    day = (now or datetime.now(UTC)).strftime("%Y/%m/%d")
    return f"{day}/[$LATEST]{uuid.uuid4().hex}"


def ensure_log_group(logs: Any, group: str) -> None:
    """The log group, as CloudFormation creates the template's `AWS::Logs::LogGroup` (by the deploying identity)."""
    try:
        logs.create_log_group(logGroupName=group)
    except Exception as error:
        if _code(error) != "ResourceAlreadyExistsException":
            raise


def _code(error: Exception) -> str:
    return str(getattr(error, "response", {}).get("Error", {}).get("Code", type(error).__name__))


def _message(error: Exception) -> str:
    return str(getattr(error, "response", {}).get("Error", {}).get("Message", error))


def emf_metric_data(line: str) -> tuple[str, list[dict[str, Any]]] | None:
    """(namespace, PutMetricData MetricData) of an EMF document, or None for any other line."""
    if not line.startswith("{") or '"_aws"' not in line:
        return None
    try:
        document = json.loads(line)
        directives = document["_aws"]["CloudWatchMetrics"]
        timestamp = datetime.fromtimestamp(int(document["_aws"]["Timestamp"]) / 1000, UTC)
    except (ValueError, KeyError, TypeError):
        return None
    for directive in directives[:1]:  # servestack writes one directive per line
        dimensions = [
            {"Name": name, "Value": str(document[name])}
            for names in directive.get("Dimensions", [])[:1]
            for name in names
            if name in document
        ]
        data = []
        for metric in directive.get("Metrics", []):
            value = document.get(metric["Name"])
            values = value if isinstance(value, list) else [value]
            numbers = [float(v) for v in values if isinstance(v, int | float)]
            if numbers:
                data.append({
                    "MetricName": metric["Name"], "Dimensions": dimensions, "Timestamp": timestamp,
                    "Values": numbers, "Unit": metric.get("Unit", "None"),
                })  # fmt: skip
        return str(directive["Namespace"]), data
    return None


class LogShipper:
    """Ships one child's lines: call it with each line; `close()` flushes what is queued."""

    def __init__(
        self,
        *,
        name: str,
        logs: Any,
        group: str,
        stream: str,
        role: str,
        report: Callable[[str], None],
        metrics: Any | None = None,
        subscribers: list[Callable[[list[str]], None]] | None = None,
    ) -> None:
        self.name = name
        self.logs = logs  # a CloudWatch Logs client signing as the child's role
        self.group = group
        self.stream = stream
        self.role = role
        self.report = report
        self.metrics = metrics  # a CloudWatch client as the service (EMF extraction)
        # The group's subscription filters' destinations (servestack/local/firehose/): given the lines the group
        # accepted, as CloudWatch Logs hands a subscription only what PutLogEvents took.
        self.subscribers = subscribers or []
        self.lines: queue.Queue[tuple[int, str] | None] = queue.Queue()
        self.dropped = 0
        self.refused: str | None = None  # the first refusal, reported once
        self.stream_created = False
        self._thread = threading.Thread(target=self._run, name=f"logs-{name}", daemon=True)
        self._thread.start()

    def __call__(self, line: str) -> None:
        if self.lines.qsize() >= MAX_QUEUED:
            self.dropped += 1
            return
        self.lines.put((int(time.time() * 1000), line))

    def close(self, timeout_sec: float = 5.0) -> None:
        self.lines.put(None)
        self._thread.join(timeout=timeout_sec)

    def _run(self) -> None:
        done = False
        while not done:
            batch: list[tuple[int, str]] = []
            deadline = time.monotonic() + FLUSH_SEC
            while len(batch) < MAX_BATCH_EVENTS:
                try:
                    item = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if item is None:
                    done = True
                    break
                batch.append(item)
            if batch:
                self._ship(batch)

    def _ship(self, batch: list[tuple[int, str]]) -> None:
        try:
            if not self.stream_created:
                try:
                    self.logs.create_log_stream(logGroupName=self.group, logStreamName=self.stream)
                except Exception as error:
                    if _code(error) != "ResourceAlreadyExistsException":
                        raise
                self.stream_created = True
            events = [{"timestamp": stamp, "message": line or " "} for stamp, line in batch]
            self.logs.put_log_events(logGroupName=self.group, logStreamName=self.stream, logEvents=events)
        except Exception as error:
            if self.refused is None:
                self.refused = f"{_code(error)}: {_message(error)}"
                self.report(
                    f"{self.name} cannot write its logs to {self.group} as {self.role}: {self.refused} "
                    "(its lines still go to this output; in AWS they would be lost)"
                )
            return
        if self.metrics is not None:
            self._extract_metrics(self.metrics, [line for _, line in batch])
        for subscriber in self.subscribers:
            subscriber([line for _, line in batch])

    def _extract_metrics(self, metrics: Any, lines: list[str]) -> None:
        for line in lines:
            found = emf_metric_data(line)
            if found is None or not found[1]:
                continue
            namespace, data = found
            try:
                metrics.put_metric_data(Namespace=namespace, MetricData=data)
            except Exception as error:  # the service's own call: a failure is local mode's, said once
                if self.refused is None:
                    self.refused = f"{_code(error)}: {_message(error)}"
                    self.report(f"{self.name}: metrics from its EMF lines not recorded: {self.refused}")


# How local mode plays each of CloudWatch Logs' resource types (`local up --explain`).
LOGS_TYPES: dict[str, str] = {
    "AWS::Logs::LogGroup": "on the emulator: each child's output written with its role, and to local up's output",
}
