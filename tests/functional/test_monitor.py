"""`servestack monitor` as a user runs it, over capture files of a real model's traffic: the zoo's wine pipeline
(scaled number columns, a one-hot `shade` text column that ignores unknown categories), pushed to a registry
folder, its training rows as the baseline. Traffic drawn from the training rows reports no drift (exit 0);
traffic with `alcohol` shifted past its training range and an unseen `shade` flags exactly those two columns
(exit 1). The HTML report is parsed: its sections, one plot per column, nothing fetched from a network."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from servestack.failures import ExitCode
from tests.capture_records import LEFT_OUT, write_capture

pytestmark = pytest.mark.slow
SERVESTACK = str(Path(sys.executable).parent / "servestack")
SEED = 7
TRAFFIC_ROWS = 900
START = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Setup:
    work: Path
    registry: Path
    baseline: Path
    columns: list[str]
    normal: Path  # capture folder of traffic drawn from the training rows
    drifted: Path  # ...with alcohol shifted by +4 and 20% of shade "violet"


@pytest.fixture(scope="module")
def wine(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    from servestack.conversion import sample_columns, to_onnx
    from servestack.inference.registry import DirectoryStore, ModelRegistry
    from servestack.inference.service import ServedModel
    from servestack.inference.settings import ServingSettings
    from tests.zoo import wine_pipeline

    estimator, table = wine_pipeline()
    work = tmp_path_factory.mktemp("monitor")
    onnx_file = work / "wine.onnx"
    onnx_file.write_bytes(to_onnx(estimator, sample_columns(table)))
    registry = work / "registry"
    ModelRegistry(DirectoryStore(registry)).push(onnx_file, name="wine", version="1")
    columns = list(table.column_names)
    data = {name: table[name].to_pylist() for name in columns}
    baseline = work / "train.csv"  # the training rows, with their label: a column the model does not take
    labels = estimator.predict(table).tolist()
    with baseline.open("w", newline="") as stream:
        writer = csv.writer(stream)
        writer.writerow([*columns, "cultivar"])
        writer.writerows(zip(*data.values(), labels, strict=True))
    model = ServedModel.load(registry / "wine" / "1", ServingSettings(model_dir=registry, warmup=False))
    rng = np.random.default_rng(SEED)
    picked = rng.integers(0, len(labels), TRAFFIC_ROWS)
    traffic = {name: np.asarray(values, dtype=object)[picked] for name, values in data.items()}
    normal = work / "capture-normal"
    write_capture(normal, model, traffic, start=START)
    shifted = dict(traffic)
    shifted["alcohol"] = np.asarray(traffic["alcohol"], dtype=float) + 4.0
    shifted["shade"] = np.where(rng.random(TRAFFIC_ROWS) < 0.2, "violet", traffic["shade"]).astype(object)
    drifted = work / "capture-drifted"
    write_capture(drifted, model, shifted, start=START)
    return Setup(work, registry, baseline, columns, normal, drifted)


def servestack(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SERVESTACK_", "AWS_"))}
    return subprocess.run([SERVESTACK, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=240)


def monitor(setup: Setup, capture: Path, name: str, *extra: str) -> tuple[subprocess.CompletedProcess[str], Any]:
    done = servestack(
        "monitor",
        "--capture",
        str(capture),
        "--model",
        "wine@1",
        "--registry",
        str(setup.registry),
        "--baseline",
        str(setup.baseline),
        "--report",
        f"{name}.html",
        "--json",
        f"{name}.json",
        *extra,
        cwd=setup.work,
    )
    summary = json.loads((setup.work / f"{name}.json").read_text()) if (setup.work / f"{name}.json").is_file() else None
    return done, summary


def test_traffic_from_the_training_distribution_reports_no_drift(wine: Setup) -> None:
    # GIVEN 900 rows drawn from the training rows, captured in the four record forms
    # WHEN the user runs `servestack monitor` against the training rows
    done, summary = monitor(wine, wine.normal, "normal")
    # THEN it exits 0, flags no column and no prediction, and read every record
    assert done.returncode == ExitCode.OK, done.stdout + done.stderr
    assert summary["drifted"] is False
    assert summary["drifted_columns"] == []
    assert summary["drifted_predictions"] == []
    assert [column["name"] for column in summary["columns"]] == wine.columns
    assert summary["current"]["rows"] == TRAFFIC_ROWS
    assert summary["baseline"]["rows"] == 178
    assert summary["notes"] == []
    # AND with no --since/--until the window is the first and the last record's time (150 records a minute apart)
    assert (summary["current"]["since"], summary["current"]["until"]) == (
        "2026-12-03T09:00:00+00:00",
        "2026-12-03T11:29:00+00:00",
    )
    # AND a column left out of some core records is counted only where it was sent, and not as missing
    proline = next(column for column in summary["columns"] if column["name"] == LEFT_OUT)
    assert 0 < proline["current_rows"] < TRAFFIC_ROWS
    assert proline["current_missing"] == 0
    assert "no drift" in done.stdout


def test_a_shifted_column_and_an_unseen_category_are_flagged_and_exit_1(wine: Setup) -> None:
    # GIVEN the same traffic with alcohol shifted past its training range and 20% of shade "violet"
    done, summary = monitor(wine, wine.drifted, "drifted")
    # THEN exactly those two columns are flagged, each for its reason, and the command exits 1
    assert done.returncode == ExitCode.FAILED, done.stdout + done.stderr
    assert summary["drifted"] is True
    assert summary["drifted_columns"] == ["alcohol", "shade"]
    by_name = {column["name"]: column for column in summary["columns"]}
    assert by_name["alcohol"]["statistics"]["psi"] > 0.2
    assert by_name["alcohol"]["statistics"]["out_of_range"] > 0.5
    assert list(by_name["shade"]["unseen"]) == ["violet"]
    assert 0.15 < by_name["shade"]["statistics"]["unseen"] < 0.25
    assert "drift  alcohol" in done.stdout
    assert "drift  shade" in done.stdout
    # AND the thresholds are the user's: raised past what this traffic shows, nothing is flagged
    lenient = ("--max-psi", "100", "--max-out-of-range", "1", "--max-js", "1", "--max-unseen", "1")
    done, summary = monitor(wine, wine.drifted, "lenient", *lenient, "--max-missing-increase", "1")
    assert done.returncode == ExitCode.OK, done.stdout + done.stderr
    assert summary["drifted_columns"] == []


class ReportParser(HTMLParser):
    """The report's sections, its figures (by role and column) and every URL it would load."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: list[str] = []
        self.figures: list[tuple[str, str]] = []
        self.images: list[str] = []
        self.urls: list[str] = []
        self.scripts = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "section":
            self.sections.append(found.get("id") or "")
        if tag == "figure":
            self.figures.append((found.get("class") or "", found.get("data-column") or ""))
        if tag == "img":
            self.images.append(found.get("src") or "")
        if tag == "script":
            self.scripts += 1
        for key in ("href", "src"):
            value = found.get(key)
            if value and not value.startswith("data:"):
                self.urls.append(value)


def test_the_html_report_has_its_sections_and_one_plot_per_column(wine: Setup) -> None:
    # GIVEN the report of the drifted traffic
    done, _ = monitor(wine, wine.drifted, "report")
    assert done.returncode == ExitCode.FAILED, done.stderr
    parser = ReportParser()
    parser.feed((wine.work / "report.html").read_text(encoding="utf-8"))
    # THEN it has the summary, the column table, the distributions and the predictions, in that order
    assert parser.sections == ["summary", "columns", "distributions", "predictions", "method"]
    # AND one plot per column, and one per prediction statistic (the class balance and the confidence)
    columns = [name for role, name in parser.figures if role.split()[:2] == ["plot", "column"]]
    predictions = [name for role, name in parser.figures if role.split()[:2] == ["plot", "prediction"]]
    assert columns == wine.columns
    assert predictions == ["prediction", "confidence"]
    drifted = sorted(name for role, name in parser.figures if "drifted" in role.split() and name in wine.columns)
    assert drifted == ["alcohol", "shade"]
    # AND every plot is an inline PNG, and nothing else is loaded: no script, stylesheet, font or URL
    assert len(parser.images) == len(parser.figures)
    assert all(src.startswith("data:image/png;base64,iVBORw0KGgo") for src in parser.images)
    assert parser.urls == []
    assert parser.scripts == 0


def test_a_window_holds_the_records_of_its_time_only(wine: Setup) -> None:
    # GIVEN records one minute apart from 09:00 WHEN the window is 09:30 to 10:00 (30 records of 6 rows)
    done, summary = monitor(
        wine, wine.normal, "window", "--since", "2026-12-03T09:30:00Z", "--until", "2026-12-03T10:00:00Z"
    )
    # THEN only those are read
    assert done.returncode == ExitCode.OK, done.stdout + done.stderr
    assert summary["current"]["records"] == 30
    assert summary["current"]["rows"] == 180
    assert (summary["current"]["since"], summary["current"]["until"]) == (
        "2026-12-03T09:30:00+00:00",
        "2026-12-03T10:00:00+00:00",
    )
    # AND a window too small for statistics is refused with exit 2, saying so and what to do; the model given as
    # a package folder (models/artifacts/NAME/VERSION) rather than through the registry
    small = ("--since", "2026-12-03T09:58:00Z", "--until", "2026-12-03T10:00:00Z")
    package = str(wine.registry / "wine" / "1")
    baseline = ("--baseline", str(wine.baseline))
    done = servestack("monitor", "--capture", str(wine.normal), "--model", package, *baseline, *small, cwd=wine.work)
    assert done.returncode == ExitCode.USAGE
    assert "the captured window holds 12 rows, fewer than --min-rows 100" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_the_package_sample_as_baseline_is_refused_below_min_rows(wine: Setup) -> None:
    # GIVEN no --baseline: the package's sample request (at most 5 rows)
    done = servestack(
        "monitor", "--capture", str(wine.normal), "--model", "wine", "--registry", str(wine.registry), cwd=wine.work
    )
    # THEN the command says the sample is too small and how to give a baseline, exit 2
    assert done.returncode == ExitCode.USAGE, done.stdout + done.stderr
    assert "the baseline holds 2 rows, fewer than --min-rows 100" in done.stderr
    assert "--baseline FILE" in done.stderr


def test_a_model_path_without_a_package_is_named(wine: Setup) -> None:
    done = servestack("monitor", "--capture", str(wine.normal), "--model", "models/artifacts/nope/1", cwd=wine.work)
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert "--model models/artifacts/nope/1: no manifest.json there" in done.stderr


def test_the_sample_given_at_push_is_the_baseline(wine: Setup) -> None:
    # GIVEN the model pushed with its training rows as --sample (the package keeps them whole as its baseline)
    features = wine.work / "features.csv"
    with wine.baseline.open(newline="") as source, features.open("w", newline="") as target:
        csv.writer(target).writerows(row[:-1] for row in csv.reader(source))  # the label left out
    pushed = servestack(
        "models", "push", str(wine.work / "wine.onnx"), "--name", "wine", "--version", "2",
        "--sample", str(features), "--registry", str(wine.registry), cwd=wine.work,
    )  # fmt: skip
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    package = wine.registry / "wine" / "2"
    assert (package / "baseline.csv").read_bytes() == features.read_bytes()
    # WHEN monitor runs without --baseline
    done = servestack(
        "monitor", "--capture", str(wine.normal), "--model", "wine@2", "--registry", str(wine.registry),
        "--json", "from-push.json", cwd=wine.work,
    )  # fmt: skip
    # THEN the whole sample is the baseline, and traffic like it shows no drift
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((wine.work / "from-push.json").read_text())
    assert summary["baseline"]["rows"] == 178
