"""serving.yaml's `monitor:` block (scheduled drift monitoring): its defaults are the monitor command's, it needs
capture of the inputs, batch mode takes it where the check can read the runs' objects (not a transform job's, not
Parquet), and `load_spec` checks that the check has a baseline to read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from servestack.cli.monitor import DEFAULT_MIN_ROWS
from servestack.monitor.drift import Thresholds
from servestack.spec import Monitor, SpecError, load_spec, parse_spec


def spec_of(**deployment: Any) -> dict[str, Any]:
    return {"models": [{"name": "wine", "version": 1}], "deployments": {"d": {"model": "wine", **deployment}}}


def problems_of(data: object) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    return info.value.problems


def test_the_defaults_are_the_monitor_commands() -> None:
    monitor = Monitor()
    thresholds = Thresholds()

    assert (monitor.max_psi, monitor.max_js, monitor.max_unseen, monitor.max_out_of_range) == (
        thresholds.psi,
        thresholds.js,
        thresholds.unseen,
        thresholds.out_of_range,
    )
    assert monitor.max_missing_increase == thresholds.missing
    assert monitor.min_rows == DEFAULT_MIN_ROWS
    assert (monitor.schedule, monitor.timezone, monitor.window_hours, monitor.baseline) == (
        "rate(1 day)",
        "UTC",
        24,
        None,
    )


@pytest.mark.parametrize("mode", ["realtime", "serverless", "async"])
def test_every_mode_that_writes_capture_records_takes_it(mode: str) -> None:
    extra = {"instance_type": "ml.c6i.xlarge"} if mode == "realtime" else {}
    monitor_block = {"schedule": "cron(0 6 * * ? *)", "window_hours": 6}
    spec = parse_spec(spec_of(mode=mode, capture={}, monitor=monitor_block, **extra))

    monitor = spec.deployments["d"].monitor
    assert monitor is not None
    assert (monitor.schedule, monitor.window_hours) == ("cron(0 6 * * ? *)", 6)


@pytest.mark.parametrize(
    "batch",
    [
        {},
        {"runner": "fargate"},  # any input format: a Parquet object among the inputs is left out, with a note
        {"runner": "fargate", "input_format": "csv", "id_column": "id"},
        {"input_format": "jsonl", "schedule": "rate(1 hour)"},
    ],
)
def test_a_batch_deployment_takes_it_where_the_check_reads_its_runs(batch: dict[str, Any]) -> None:
    # The runs' own input and output objects are the capture: capture: {} says so, as in the other modes
    spec = parse_spec(spec_of(mode="batch", capture={}, monitor={"window_hours": 26}, **batch))

    monitor = spec.deployments["d"].monitor
    assert monitor is not None
    assert monitor.window_hours == 26


@pytest.mark.parametrize(
    ("deployment", "expected"),
    [
        (
            {"mode": "serverless", "monitor": {}},
            "deployments.d.monitor: a monitor block is not allowed without capture: (the check reads the captured "
            "records); add a capture: block",
        ),
        (
            {"mode": "async", "capture": {"what": "outputs"}, "monitor": {}},
            "deployments.d.monitor: a monitor block is not allowed with capture.what: outputs",
        ),
        (
            {"mode": "batch", "runner": "transform", "capture": {}, "monitor": {}},
            "deployments.d.monitor: a monitor block is not usable with runner: transform yet (a transform job's "
            "answers hold no file and line",
        ),
        (
            {"mode": "batch", "runner": "fargate", "input_format": "parquet", "capture": {}, "monitor": {}},
            "deployments.d.monitor: a monitor block is not usable with input_format: parquet (the check's function "
            "reads the runs' objects without pyarrow",
        ),
        (
            {
                "mode": "batch",
                "runner": "fargate",
                "input_format": "csv",
                "output_format": "parquet",
                "capture": {},
                "monitor": {},
            },
            "deployments.d.monitor: a monitor block is not usable with output_format: parquet (",
        ),
        (
            {"mode": "batch", "monitor": {}},
            "deployments.d.monitor: a monitor block is not allowed without capture: (the check reads the captured",
        ),
        (
            {"mode": "serverless", "capture": {}, "monitor": {"schedule": "daily"}},
            "deployments.d.monitor.schedule: 'daily' is not 'cron(<6 fields>)' or 'rate(<n> minutes|hours|days)'",
        ),
        (
            {"mode": "serverless", "capture": {}, "monitor": {"max_js": 1.5}},
            "deployments.d.monitor.max_js: 1.5 is not in 0..1",
        ),
        (
            {"mode": "serverless", "capture": {}, "monitor": {"window_hours": 0}},
            "deployments.d.monitor.window_hours: 0 is not in 1..744",
        ),
        (
            {"mode": "serverless", "capture": {}, "monitor": {"baseline": "train.parquet"}},
            "deployments.d.monitor.baseline: 'train.parquet' is not a .csv, .jsonl, .ndjson, .json file",
        ),
        (
            {"mode": "serverless", "capture": {}, "monitor": {"every": "day"}},
            "deployments.d.monitor.every: unknown key is not one of",
        ),
    ],
)
def test_a_monitor_the_check_cannot_run_is_refused_naming_the_field(deployment: dict[str, Any], expected: str) -> None:
    (problem,) = problems_of(spec_of(**deployment))
    assert problem.startswith(expected), problem


def _project(root: Path, monitor: dict[str, Any], files: list[dict[str, str]]) -> Path:
    package = root / "models" / "artifacts" / "wine" / "1"
    package.mkdir(parents=True)
    (package / "model.onnx").write_bytes(b"stub")
    (package / "manifest.json").write_text(json.dumps({"name": "wine", "files": files}))
    for entry in files:
        (package / entry["name"]).write_text("alcohol\n13.0\n")
    (root / "serving.yaml").write_text(yaml.safe_dump(spec_of(mode="serverless", capture={}, monitor=monitor)))
    return root / "serving.yaml"


def test_load_spec_needs_a_baseline_the_function_can_read(tmp_path: Path) -> None:
    # GIVEN a package pushed without --sample (no baseline kept), one with a Parquet baseline, and a missing file
    cases = {
        "none": ({}, [], "missing is not allowed when the package"),
        "parquet": ({}, [{"name": "baseline.parquet", "sha256": "0"}], "the package's baseline is baseline.parquet"),
        "missing": ({"baseline": "data/train.csv"}, [], "'data/train.csv' is not a file of the project"),
    }
    for name, (monitor, files, expected) in cases.items():
        path = _project(tmp_path / name, monitor, files)
        # WHEN loaded THEN each names the field and what to do
        with pytest.raises(SpecError) as info:
            load_spec(path, bundled=False)
        (problem,) = info.value.problems
        assert problem.startswith("deployments.d.monitor.baseline: "), problem
        assert expected in problem, problem
    # AND a package that keeps a CSV baseline, or a project file, is taken
    kept = _project(tmp_path / "kept", {}, [{"name": "baseline.csv", "sha256": "0"}])
    assert load_spec(kept, bundled=False).deployments["d"].monitor is not None
    given = _project(tmp_path / "given", {"baseline": "train.csv"}, [])
    (given.parent / "train.csv").write_text("alcohol\n13.0\n")
    assert load_spec(given, bundled=False).deployments["d"].monitor is not None
