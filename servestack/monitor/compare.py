"""One monitoring run: the model package loaded, the baseline and the captured window read into tables, and
every column and prediction compared (servestack/monitor/drift.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from servestack.inference.service import ServedModel
from servestack.inference.settings import ServingSettings
from servestack.monitor import drift
from servestack.monitor.baseline import read_baseline, read_package_sample
from servestack.monitor.batch_runs import is_batch_output, read_batch_runs
from servestack.monitor.records import Captured, Window, capture_lines, read_capture
from servestack.monitor.table import CONFIDENCE, Table


class NotEnoughRows(ValueError):
    """Too few rows on one side for the statistics to say anything."""


@dataclass(frozen=True)
class Inputs:
    """What to compare: the package (a folder), its baseline (a file, else the package's sample), the capture
    location (a folder, a file or s3://bucket/prefix/) and the window. `source`: what the location holds, capture
    records or a batch deployment's runs (its output prefix, servestack/monitor/batch_runs.py); `auto`: runs
    where the location holds run manifests."""

    package_dir: Path
    baseline: Path | None
    capture: str
    window: Window
    thresholds: drift.Thresholds
    min_rows: int
    endpoint_url: str | None = None
    region: str | None = None
    source: Literal["auto", "capture", "batch"] = "auto"


def load_model(package_dir: Path) -> ServedModel:
    """The package verified and loaded as a server loads it, without warming up: only its decoder and one
    prediction per baseline chunk are needed."""
    return ServedModel.load(package_dir, ServingSettings(model_dir=package_dir.parent.parent, warmup=False))


def _read_current(inputs: Inputs, model: ServedModel, table: Table) -> Captured:
    where = {"endpoint_url": inputs.endpoint_url, "region": inputs.region}
    if inputs.source == "batch" or (inputs.source == "auto" and is_batch_output(inputs.capture, **where)):
        return read_batch_runs(inputs.capture, model, inputs.window, table, **where)
    return read_capture(capture_lines(inputs.capture, **where), model, inputs.window, table)


def compare_traffic(inputs: Inputs) -> drift.Comparison:
    model = load_model(inputs.package_dir)
    baseline, notes = Table.for_model(model.manifest)
    if inputs.baseline is not None:
        read_baseline(inputs.baseline, model, baseline)
        source = str(inputs.baseline)
    else:
        read_package_sample(inputs.package_dir, model, baseline)
        source = f"the sample of {model.manifest.key} (models push --sample)"
    current, _ = Table.for_model(model.manifest)
    captured = _read_current(inputs, model, current)
    for side, table, hint in (
        ("baseline", baseline, "pass --baseline FILE with the training rows"),
        ("captured window", current, "widen --since/--until, or wait for more traffic"),
    ):
        if table.rows < inputs.min_rows:
            skipped = f"; {'; '.join(captured.notes())}" if side != "baseline" and captured.skipped else ""
            raise NotEnoughRows(
                f"the {side} holds {table.rows} rows, fewer than --min-rows {inputs.min_rows}: too few for drift "
                f"statistics to mean anything; {hint}{skipped}"
            )
    limits = inputs.thresholds
    columns = [
        drift.compare(f.name, f.kind, baseline.input_values(f), current.input_values(f), limits)
        for f in baseline.features
    ]
    names = sorted(set(baseline.outputs) | set(current.outputs), key=lambda name: (name == CONFIDENCE, name))
    predictions = [
        drift.compare(
            name, baseline.output_kind(name), baseline.output_values(name), current.output_values(name), limits
        )
        for name in names
    ]
    # The window as given, else the times of the first and the last record read.
    since, until = inputs.window.since or captured.earliest, inputs.window.until or captured.latest
    return drift.Comparison(
        model=model.manifest.key,
        baseline_source=source,
        capture_source=inputs.capture,
        since=since.isoformat() if since else None,
        until=until.isoformat() if until else None,
        records=captured.records,
        baseline_rows=baseline.rows,
        current_rows=current.rows,
        thresholds=limits,
        columns=columns,
        predictions=predictions,
        notes=notes + captured.notes(),
    )
