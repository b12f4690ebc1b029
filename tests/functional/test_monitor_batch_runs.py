"""A batch deployment's runs read as captured traffic (servestack/monitor/batch_runs.py): real runs of the batch job
(servestack/inference/tabular/) over the bundled breast-cancer model, on the emulator's S3, read back by
`servestack monitor`'s reader: each scored row from its input object, joined to its prediction by file and line;
an error row of the run left out; a run whose parts a later run replaced, or whose input changed, left out with a
note saying why; and the whole comparison taking the output prefix for the capture."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from servestack.adapters.batch import S3Store
from servestack.inference.service import ServedModel
from servestack.inference.tabular import BatchJob
from servestack.local.emulator.moto_server import EmbeddedEmulator, client_as
from servestack.local.iam import DEVELOPER
from servestack.monitor import drift
from servestack.monitor.batch_runs import is_batch_output, read_batch_runs
from servestack.monitor.compare import Inputs, compare_traffic, load_model
from servestack.monitor.records import Window
from servestack.monitor.table import CONFIDENCE, PREDICTION, Table

PACKAGE = Path(__file__).resolve().parents[2] / "models" / "artifacts" / "breast-cancer" / "1"
BUCKET = "scoring"
OUTPUT = "batch/cancer/output/"


@dataclass
class Runs:
    s3: Any
    endpoint_url: str
    model: ServedModel
    rows: np.ndarray  # the sample's rows, 30 features each

    def put(self, key: str, lines: list[str]) -> None:
        self.s3.put_object(Bucket=BUCKET, Key=key, Body=("\n".join(lines) + "\n").encode())

    def run(self, input_prefix: str) -> dict[str, Any]:
        job = BatchJob(store=S3Store(BUCKET, self.s3), model=self.model, input_prefix=input_prefix,
                       output_prefix=OUTPUT, deployment="cancer", chunk_rows=50)  # fmt: skip
        return job.run()

    def read(self, window: Window | None = None) -> tuple[Table, Any]:
        table, _ = Table.for_model(self.model.manifest)
        captured = read_batch_runs(f"s3://{BUCKET}/{OUTPUT}", self.model, window or Window(), table,
                                   endpoint_url=self.endpoint_url, region="us-east-1")  # fmt: skip
        return table, captured


@pytest.fixture(scope="module")
def runs() -> Iterator[Runs]:
    """The emulator, and the reader's credentials (it makes its own client, as the command does) the developer's."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AWS_ACCESS_KEY_ID", DEVELOPER.access_key_id)
        patch.setenv("AWS_SECRET_ACCESS_KEY", DEVELOPER.secret_access_key)
        patch.delenv("AWS_SESSION_TOKEN", raising=False)
        patch.delenv("AWS_PROFILE", raising=False)
        yield from _runs()


def _runs() -> Iterator[Runs]:
    emulator = EmbeddedEmulator()
    s3 = client_as("s3", emulator.url, DEVELOPER, "us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    model = load_model(PACKAGE)
    sample = np.asarray(json.loads((PACKAGE / "sample-request.json").read_text())["instances"], dtype=np.float64)
    rng = np.random.default_rng(5)
    rows = sample[rng.integers(0, len(sample), 160)] * rng.normal(1.0, 0.02, (160, sample.shape[1]))
    try:
        yield Runs(s3, emulator.url, model, rows)
    finally:
        emulator.stop()


def lines_of(rows: np.ndarray) -> list[str]:
    return [json.dumps(row.tolist()) for row in rows]


def scored(runs: Runs, manifest: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    """The run's output rows by (file, line), as its parts hold them."""
    found: dict[tuple[str, int], dict[str, Any]] = {}
    for part in manifest["parts"]:
        body = runs.s3.get_object(Bucket=BUCKET, Key=f"{OUTPUT}{part['key']}")["Body"].read()
        for line in body.splitlines():
            row = json.loads(line)
            found[(row["file"], row["line"])] = row
    return found


def test_the_rows_a_run_scored_are_read_again_from_its_inputs_with_their_predictions(runs: Runs) -> None:
    # GIVEN a run over two objects, JSON Lines (one of its lines not a row of 30 numbers) and CSV
    first, second = runs.rows[:100], runs.rows[100:]
    runs.put("batch/cancer/a/rows.jsonl", [*lines_of(first[:50]), "[1, 2]", *lines_of(first[50:])])
    runs.put("batch/cancer/a/more.csv", [",".join(map(str, row.tolist())) for row in second])
    manifest = runs.run("batch/cancer/a/")
    assert manifest["rows"] == {"total": 161, "succeeded": 160, "failed": 1}
    assert is_batch_output(f"s3://{BUCKET}/{OUTPUT}", endpoint_url=runs.endpoint_url, region="us-east-1")
    # WHEN its output prefix is read as captured traffic
    table, captured = runs.read()
    # THEN every scored row is there, once, and the error row is not: it had no prediction
    assert (table.rows, captured.records, captured.notes()) == (160, 160, [])
    # AND each row's values are its input's, and its prediction and confidence the run's for that file and line
    by_row = scored(runs, manifest)
    order = [("batch/cancer/a/more.csv", line) for line in range(1, 61)] + [
        ("batch/cancer/a/rows.jsonl", line) for line in [*range(1, 51), *range(52, 102)]
    ]
    assert sorted(by_row) == sorted(order)
    expected = np.concatenate([second, first]).astype(np.float32)  # inputs in key order: more.csv first
    (feature,) = [f for f in table.features if f.name == "input[0]"]
    assert np.array_equal(table.input_values(feature), expected[:, 0])
    labels = [by_row[key].get("label", by_row[key]["prediction"]) for key in order]
    assert table.output_values(PREDICTION).tolist() == labels
    confidence = [max(by_row[key]["probabilities"]) for key in order]
    assert np.allclose(table.output_values(CONFIDENCE), confidence)


def test_a_run_whose_parts_were_replaced_or_whose_input_changed_is_left_out_saying_why(runs: Runs) -> None:
    # GIVEN an earlier run, then a later one over other objects into the same output prefix (parts of fixed names)
    runs.put("batch/cancer/b/rows.jsonl", lines_of(runs.rows[:20]))
    runs.run("batch/cancer/b/")
    runs.put("batch/cancer/c/rows.jsonl", lines_of(runs.rows[20:50]))
    runs.run("batch/cancer/c/")
    # WHEN every run is read THEN the later one is read whole, and the earlier ones are left out: their parts
    # were replaced
    table, captured = runs.read()
    assert table.rows == 30
    notes = captured.notes()
    assert any("a run left out: its part parts/part-00000.jsonl was replaced by a later run's" in n for n in notes)
    # WHEN the later run's input changes after it ran THEN it is left out too: its rows are not what was scored
    runs.put("batch/cancer/c/rows.jsonl", lines_of(runs.rows[20:49]))
    table, captured = runs.read()
    assert table.rows == 0
    assert any("an input left out: it changed since the run (its ETag)" in n for n in captured.notes())
    # AND a window that ends before the runs reads none of them
    table, captured = runs.read(Window(until=datetime.now(UTC) - timedelta(hours=1)))
    assert (table.rows, captured.notes()) == (0, [])


def test_the_comparison_takes_a_batch_output_prefix_for_the_capture(runs: Runs, tmp_path: Path) -> None:
    # GIVEN a run over rows like the baseline's
    runs.put("batch/cancer/d/rows.jsonl", lines_of(runs.rows))
    runs.run("batch/cancer/d/")
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps({"instances": runs.rows[::-1].tolist()}))
    # WHEN `servestack monitor`'s comparison is given the output prefix as its capture
    comparison = compare_traffic(
        Inputs(package_dir=PACKAGE, baseline=baseline, capture=f"s3://{BUCKET}/{OUTPUT}", window=Window(),
               thresholds=drift.Thresholds(), min_rows=100, endpoint_url=runs.endpoint_url, region="us-east-1")
    )  # fmt: skip
    # THEN it compares the run's rows, every one, and finds them alike
    assert (comparison.current_rows, comparison.baseline_rows) == (160, 160)
    assert not comparison.drifted, comparison.to_json()
