"""Overload metrics of the realtime container, written to stdout in CloudWatch's embedded metric format (EMF).

SageMaker sends a container's stdout to CloudWatch Logs (`/aws/sagemaker/Endpoints/<endpoint>`), and CloudWatch
Logs extracts metrics from every log event in EMF; neither an agent nor a special header is needed (CloudWatch
user guide, "Using the PutLogEvents API to send manually-created embedded metric format logs": the
`x-amzn-logs-format: json/emf` header is optional).

Each worker samples its micro-batchers once a second and writes one line every `metrics_interval_sec` (10 s in
the template), in namespace `servestack` with dimensions EndpointName and VariantName:
- `QueueDepth` (Count): requests waiting for a batch, one value per sample;
- `InFlight` (Count): admitted requests not yet answered, one value per sample;
- `Rejected` (Count): requests answered 429 since the previous line.
EMF carries the samples as a value array, so CloudWatch's Maximum, Average and percentiles see every second.
Nothing is done per request: the numbers are the counters admission control keeps anyway
(servestack/inference/batching.py).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Iterable
from typing import IO, Any

import orjson

from servestack.inference.batching import MicroBatcher

NAMESPACE = "servestack"
METRICS = (("QueueDepth", "Count"), ("InFlight", "Count"), ("Rejected", "Count"))
MAX_VALUES = 100  # EMF's limit of values in one metric's array


class OverloadMetrics:
    """Samples and writes one worker's overload metrics; `run()` is its background task."""

    def __init__(
        self,
        batchers: Callable[[], Iterable[MicroBatcher]],
        *,
        endpoint_name: str,
        variant_name: str,
        interval_sec: float,
        stream: IO[str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.batchers = batchers
        self.dimensions = {"EndpointName": endpoint_name or "local", "VariantName": variant_name or "primary"}
        self.interval_sec = interval_sec
        self.sample_sec = min(1.0, interval_sec)
        self.stream = stream or sys.stdout
        self.clock = clock
        self._depth: list[int] = []
        self._in_flight: list[int] = []
        self._rejected_seen: dict[int, int] = {}
        self._rejected = 0

    def sample(self) -> None:
        depth = in_flight = 0
        for batcher in self.batchers():
            depth += batcher.queued_requests
            in_flight += batcher.in_flight
            rejected = batcher.stats.rejected
            self._rejected += rejected - self._rejected_seen.get(id(batcher), 0)
            self._rejected_seen[id(batcher)] = rejected
        self._depth = [*self._depth, depth][-MAX_VALUES:]
        self._in_flight = [*self._in_flight, in_flight][-MAX_VALUES:]

    def line(self) -> dict[str, Any]:
        """The EMF document for the samples since the previous line (and resets them)."""
        document: dict[str, Any] = {
            "_aws": {
                "Timestamp": int(self.clock() * 1000),
                "CloudWatchMetrics": [
                    {
                        "Namespace": NAMESPACE,
                        "Dimensions": [list(self.dimensions)],
                        "Metrics": [{"Name": name, "Unit": unit} for name, unit in METRICS],
                    }
                ],
            },
            **self.dimensions,
            "QueueDepth": self._depth or [0],
            "InFlight": self._in_flight or [0],
            "Rejected": self._rejected,
        }
        self._depth, self._in_flight, self._rejected = [], [], 0
        return document

    def flush(self) -> None:
        self.stream.write(orjson.dumps(self.line()).decode() + "\n")
        self.stream.flush()

    async def run(self) -> None:
        next_flush = time.monotonic() + self.interval_sec
        try:
            while True:
                await asyncio.sleep(self.sample_sec)
                self.sample()
                if time.monotonic() >= next_flush:
                    self.flush()
                    next_flush += self.interval_sec
        except asyncio.CancelledError:
            self.sample()
            self.flush()  # the last partial interval: shutting down must not lose the 429s it counted
            raise
