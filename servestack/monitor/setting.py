"""What the scheduled drift check's function is told at synth (`SERVESTACK_MONITOR`, JSON) and the names it
publishes under: light, so that the constructs (servestack/cdk/monitoring.py) write it without numpy or
onnxruntime, and the function (servestack/monitor/scheduled.py) reads it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

SETTING_ENV = "SERVESTACK_MONITOR"
# The one namespace the function's role may put metric data to (its `cloudwatch:namespace` condition).
NAMESPACE = "servestack/Drift"
DRIFT_SCORE = "DriftScore"  # per column and prediction statistic: dimensions Deployment, Column
DRIFT_DETECTED = "DriftDetected"  # 1 drift past a threshold, 0 none: dimension Deployment; the alarm's metric
CAPTURED_ROWS = "CapturedRows"  # the window's rows: dimension Deployment
BASELINE_DIR = "monitor-baseline"  # where the function's code carries an explicit `baseline:` file
HANDLER = "servestack.monitor.scheduled.handler"  # the check's function (local mode knows its schedule by it)


@dataclass(frozen=True)
class MonitorSetting:
    """One deployment's check: where its capture is, which package and baseline, the window and thresholds
    (the keys of servestack/monitor/drift.py `Thresholds`). `source`: what `prefix` holds, capture records, or
    a batch deployment's runs (`prefix` is then its output prefix: servestack/monitor/batch_runs.py)."""

    deployment: str
    bucket: str
    prefix: str
    model: str
    version: str
    window_hours: int
    min_rows: int
    thresholds: dict[str, float] = field(default_factory=dict)
    baseline: str | None = None  # a file name under BASELINE_DIR; None: the package's own baseline
    source: Literal["capture", "batch"] = "capture"

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> MonitorSetting:
        data: dict[str, Any] = json.loads(text)
        return cls(**data)
