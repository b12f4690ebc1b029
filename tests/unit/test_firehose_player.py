"""The Firehose player's pure parts (servestack/local/firehose/): which lines a subscription's pattern selects,
and Firehose's timestamp prefixes. The player end to end (log group -> stream -> S3 as the stream's role) is in
tests/e2e/test_capture_modes.py."""

from __future__ import annotations

from datetime import UTC, datetime

from servestack.local.firehose import DeliveryDef, FirehosePlayer
from servestack.local.firehose.delivery import evaluate_prefix

DELIVERY = DeliveryDef(
    logical_id="Stream",
    name="servestack-d-capture",
    bucket="b",
    prefix="capture/d/!{timestamp:yyyy/MM/dd/HH}/",
    extension=".jsonl",
    role="Role",
    groups=("/aws/lambda/d",),
    path=("servestack", "deployment"),
    value="d",
)


def test_the_pattern_selects_capture_lines_only() -> None:
    player = FirehosePlayer(DELIVERY, s3=None, report=print)

    assert player.selects('{"captureData": {}, "eventVersion": "0", "servestack": {"deployment": "d"}}')
    assert not player.selects('{"captureData": {}, "servestack": {"deployment": "other"}}')
    assert not player.selects('{"level": "INFO", "message": "servestack deployment d"}')
    assert not player.selects('{"_aws": {"CloudWatchMetrics": []}, "QueueDepth": 0}')
    assert not player.selects("START RequestId: 1 Version: $LATEST")
    assert not player.selects('["servestack"]')


def test_a_timestamp_prefix_is_evaluated_in_utc() -> None:
    when = datetime(2026, 12, 3, 7, 5, 9, tzinfo=UTC)

    assert evaluate_prefix(DELIVERY.prefix, when) == "capture/d/2026/12/03/07/"
    assert evaluate_prefix("plain/", when) == "plain/"
