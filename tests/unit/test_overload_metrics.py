"""Overload metrics in CloudWatch's embedded metric format, from real micro-batchers' admission counters."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from servestack.adapters.metrics import OverloadMetrics
from servestack.inference.batching import BatchingConfig, MicroBatcher
from servestack.inference.errors import Overloaded


def identity(arrays: object) -> dict[str, np.ndarray]:
    return dict(arrays)  # type: ignore[call-overload]


def test_a_line_is_emf_with_the_samples_and_the_429s_since_the_last_line() -> None:
    # GIVEN a worker whose batcher admits one request, holds one, and refused two
    batcher = MicroBatcher(identity, BatchingConfig(max_queue_requests=1))
    batcher.acquire()
    for _ in range(2):
        with pytest.raises(Overloaded):
            batcher.acquire()
    stream = io.StringIO()
    metrics = OverloadMetrics(
        lambda: [batcher], endpoint_name="e", variant_name="v", interval_sec=10, stream=stream, clock=lambda: 1234.5
    )

    # WHEN it samples twice and writes a line
    metrics.sample()
    metrics.sample()
    metrics.flush()

    # THEN the line is one EMF document: namespace, dimensions, units, and the values
    document = json.loads(stream.getvalue())
    assert document["_aws"] == {
        "Timestamp": 1234500,
        "CloudWatchMetrics": [
            {
                "Namespace": "servestack",
                "Dimensions": [["EndpointName", "VariantName"]],
                "Metrics": [
                    {"Name": "QueueDepth", "Unit": "Count"},
                    {"Name": "InFlight", "Unit": "Count"},
                    {"Name": "Rejected", "Unit": "Count"},
                ],
            }
        ],
    }
    assert (document["EndpointName"], document["VariantName"]) == ("e", "v")
    assert document["InFlight"] == [1, 1]
    assert document["QueueDepth"] == [0, 0]
    assert document["Rejected"] == 2
    # AND the next line counts only what happened after it
    batcher.release()
    metrics.sample()
    metrics.flush()
    following = json.loads(stream.getvalue().splitlines()[1])
    assert following["Rejected"] == 0
    assert following["InFlight"] == [0]
    batcher.close()


def test_429s_of_several_batchers_add_up() -> None:
    batchers = [MicroBatcher(identity, BatchingConfig(max_queue_requests=1)) for _ in range(3)]
    for batcher in batchers:
        batcher.acquire()
        with pytest.raises(Overloaded):
            batcher.acquire()
    metrics = OverloadMetrics(lambda: batchers, endpoint_name="", variant_name="", interval_sec=1, stream=io.StringIO())

    metrics.sample()
    line = metrics.line()

    assert line["Rejected"] == 3
    assert line["InFlight"] == [3]
    assert (line["EndpointName"], line["VariantName"]) == ("local", "primary")
