"""The scheduled drift check (serving.yaml's `monitor:`): the comparison `servestack monitor` makes, run in a
Lambda function that EventBridge Scheduler invokes (servestack/cdk/monitoring.py), over the last `window_hours`
of the deployment's capture prefix against its baseline, published as CloudWatch metrics.

A batch deployment's check reads its runs instead: `prefix` is its output prefix, and the rows each run in the
window scored are read again from its input objects (servestack/monitor/batch_runs.py).

The function's setting is `SERVESTACK_MONITOR` (JSON, written at synth: servestack/monitor/setting.py). Its
package is the one its code carries (`SERVESTACK_MODEL_DIR/<model>/<version>`), and so is an explicit baseline
file (`BASELINE_DIR`), so that its role reads nothing from S3 but the capture prefix. The HTML report is not drawn:
a schedule has no one to show it to, and matplotlib is not in the Lambda bundle; the log line holds the summary.

Metrics, in the namespace `NAMESPACE` (the one its role may put data to, by the `cloudwatch:namespace`
condition), each with the dimension `Deployment`:
- `DriftScore` per column and per prediction statistic (dimension `Column` too): the statistic its threshold is
  compared with, PSI for a numeric column, the Jensen-Shannon distance for a categorical one;
- `DriftDetected`: 1 when any column or prediction statistic drifted past its threshold, else 0. The drift
  alarm watches it;
- `CapturedRows`: the rows of the window read.
A window or a baseline under `min_rows` publishes nothing (its log line says why): no verdict, so the drift
alarm, which ignores missing data, keeps its state until a check can say.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from servestack.monitor import drift
from servestack.monitor.compare import Inputs, NotEnoughRows, compare_traffic
from servestack.monitor.records import Window
from servestack.monitor.setting import (
    BASELINE_DIR,
    CAPTURED_ROWS,
    DRIFT_DETECTED,
    DRIFT_SCORE,
    NAMESPACE,
    SETTING_ENV,
    MonitorSetting,
)

SCORE = {"numeric": "psi", "categorical": "js"}  # the statistic of each kind that its threshold is compared with
_PUT_LIMIT = 1000  # metrics per PutMetricData call


def metric_data(comparison: drift.Comparison, deployment: str) -> list[dict[str, Any]]:
    """What one check publishes: a `DriftScore` per column and prediction statistic, and `DriftDetected`."""
    data = [
        {
            "MetricName": DRIFT_SCORE,
            "Dimensions": [{"Name": "Deployment", "Value": deployment}, {"Name": "Column", "Value": column.name}],
            "Value": float(column.statistics[SCORE[column.kind]]),
            "Unit": "None",
        }
        for column in [*comparison.columns, *comparison.predictions]
    ]
    data.append(_flag(DRIFT_DETECTED, 1.0 if comparison.drifted else 0.0, deployment))
    data.append(_flag(CAPTURED_ROWS, float(comparison.current_rows), deployment, unit="Count"))
    return data


def _flag(name: str, value: float, deployment: str, unit: str = "None") -> dict[str, Any]:
    return {
        "MetricName": name,
        "Dimensions": [{"Name": "Deployment", "Value": deployment}],
        "Value": value,
        "Unit": unit,
    }


def check(
    setting: MonitorSetting, task_root: Path, model_dir: Path, now: datetime
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The check over the window ending `now`: (the summary it logs and returns, the metric data to publish)."""
    baseline = task_root / BASELINE_DIR / setting.baseline if setting.baseline else None
    inputs = Inputs(
        package_dir=model_dir / setting.model / setting.version,
        baseline=baseline,
        capture=f"s3://{setting.bucket}/{setting.prefix}",
        window=Window(now - timedelta(hours=setting.window_hours), None),
        thresholds=drift.Thresholds(**setting.thresholds),
        min_rows=setting.min_rows,
        source=setting.source,
    )
    try:
        comparison = compare_traffic(inputs)
    except NotEnoughRows as error:
        return {"deployment": setting.deployment, "checked": False, "reason": str(error)}, []
    summary = {
        "deployment": setting.deployment,
        "checked": True,
        "drifted": comparison.drifted,
        "drifted_columns": comparison.drifted_columns,
        "drifted_predictions": comparison.drifted_predictions,
        "records": comparison.records,
        "rows": comparison.current_rows,
        "since": comparison.since,
        "flags": {c.name: c.flags for c in [*comparison.columns, *comparison.predictions] if c.flags},
        "notes": comparison.notes,
    }
    return summary, metric_data(comparison, setting.deployment)


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """The schedule's target: one check, its metrics put to CloudWatch with the function's role."""
    import boto3

    setting = MonitorSetting.from_json(os.environ[SETTING_ENV])
    task_root = Path(os.environ.get("LAMBDA_TASK_ROOT", "."))
    model_dir = Path(os.environ.get("SERVESTACK_MODEL_DIR", task_root / "models" / "artifacts"))
    summary, data = check(setting, task_root, model_dir, datetime.now(UTC))
    cloudwatch = boto3.client("cloudwatch")
    for start in range(0, len(data), _PUT_LIMIT):
        cloudwatch.put_metric_data(Namespace=NAMESPACE, MetricData=data[start : start + _PUT_LIMIT])
    print(json.dumps({"servestack_monitor": summary}), flush=True)
    return summary
