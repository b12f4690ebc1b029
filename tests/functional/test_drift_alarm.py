"""A deployment's drift alarm (servestack/cdk/monitoring.py) as local mode plays it, on the emulator's CloudWatch:
evaluated from the metrics the scheduled check publishes (servestack/monitor/scheduled.py `metric_data`), and
keeping its state between two checks (`TreatMissingData: ignore`)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest

from servestack.local.cloudwatch import AlarmDef, ensure_alarm, evaluate_alarms
from servestack.local.cloudwatch.alarms import alarm_of
from servestack.local.emulator.moto_server import EmbeddedEmulator, client_as
from servestack.local.iam import DEVELOPER
from servestack.monitor import drift
from servestack.monitor.scheduled import metric_data
from servestack.monitor.setting import NAMESPACE

DEPLOYMENT = "wine-api"
# The drift alarm the construct gives a deployment with `monitor:`, resolved as local up resolves it.
DRIFT_ALARM: dict[str, Any] = {
    "AlarmName": f"servestack-{DEPLOYMENT}-drift",
    "ComparisonOperator": "GreaterThanOrEqualToThreshold",
    "Dimensions": [{"Name": "Deployment", "Value": DEPLOYMENT}],
    "EvaluationPeriods": 1,
    "MetricName": "DriftDetected",
    "Namespace": NAMESPACE,
    "Period": 3600,
    "Statistic": "Maximum",
    "Threshold": 1,
    "TreatMissingData": "ignore",
}


@pytest.fixture
def cloudwatch() -> Iterator[Any]:
    emulator = EmbeddedEmulator()
    try:
        yield client_as("cloudwatch", emulator.url, DEVELOPER, "us-east-1")
    finally:
        emulator.stop()


def comparison(shift: float) -> drift.Comparison:
    """One numeric and one categorical column compared, `alcohol` read `shift` high and, when shifted, a fifth of
    `shade` in a category the baseline never had."""
    rng = np.random.default_rng(3)
    alcohol = rng.normal(13, 0.8, 500)
    shade = np.array(["amber", "ruby", "pale"] * 100, dtype=object)
    current_shade = shade.copy()
    if shift:
        current_shade[::5] = "violet"
    limits = drift.Thresholds()
    columns = [
        drift.compare("alcohol", "numeric", alcohol, alcohol + shift, limits),
        drift.compare("shade", "categorical", shade, current_shade, limits),
    ]
    return drift.Comparison("wine@1", "train.csv", "s3://b/capture/", None, None, 100, 500, 500, limits, columns, [])


def test_the_checks_metrics_set_the_drift_alarm_which_keeps_its_state_between_checks(cloudwatch: Any) -> None:
    # GIVEN the deployment's drift alarm, created on the emulator as the stack creates it
    alarm = alarm_of(DRIFT_ALARM)
    assert alarm.evaluated_locally(set())  # its metrics are the check's own: local mode has them
    assert AlarmDef.from_dict(alarm.to_dict()) == alarm
    ensure_alarm(cloudwatch, alarm)
    # WHEN no check has run THEN it has nothing to say
    assert evaluate_alarms(cloudwatch, [alarm]) == {alarm.name: "INSUFFICIENT_DATA"}
    # WHEN a check of traffic like the baseline publishes THEN a score per column, the flag 0, and the alarm is OK
    quiet = metric_data(comparison(0.0), DEPLOYMENT)
    assert {(d["MetricName"], tuple(x["Value"] for x in d["Dimensions"])) for d in quiet} == {
        ("DriftScore", (DEPLOYMENT, "alcohol")),
        ("DriftScore", (DEPLOYMENT, "shade")),
        ("DriftDetected", (DEPLOYMENT,)),
        ("CapturedRows", (DEPLOYMENT,)),
    }
    cloudwatch.put_metric_data(Namespace=NAMESPACE, MetricData=quiet)
    assert evaluate_alarms(cloudwatch, [alarm]) == {alarm.name: "OK"}
    # WHEN a check of shifted traffic publishes THEN the scores are past their thresholds and the alarm is in ALARM
    shifted = metric_data(comparison(3.0), DEPLOYMENT)
    scores = {d["Dimensions"][1]["Value"]: d["Value"] for d in shifted if d["MetricName"] == "DriftScore"}
    assert scores["alcohol"] > 0.2  # PSI
    assert scores["shade"] > 0.1  # Jensen-Shannon distance
    cloudwatch.put_metric_data(Namespace=NAMESPACE, MetricData=shifted)
    assert evaluate_alarms(cloudwatch, [alarm]) == {alarm.name: "ALARM"}
    # AND hours later, with no check since, it is still in ALARM: missing data is ignored
    later = datetime.now(UTC) + timedelta(hours=5)
    assert evaluate_alarms(cloudwatch, [alarm], now=later) == {alarm.name: "ALARM"}
