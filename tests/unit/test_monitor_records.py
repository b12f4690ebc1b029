"""Captured records as the monitor reads them (servestack/monitor/records.py), with the real flowers pipeline
(tests/pipeline_model.py) decoding them: every record form, a column left out, the time window, records it
leaves out and says why, and the same files read from S3 (moto's server over HTTP)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from servestack.inference.service import ServedModel
from servestack.inference.settings import ServingSettings
from servestack.monitor.records import CaptureError, Window, capture_lines, parse_time, read_capture
from servestack.monitor.table import CONFIDENCE, PREDICTION, Table
from tests.pipeline_model import COLUMNS, pipeline_model

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
ROWS = {
    "sepal_length": [5.1, 6.2],
    "sepal_width": [3.5, 2.9],
    "petal_length": [1.4, 4.3],
    "petal_width": [0.2, 1.3],
    "site": ["north", "east"],
}


@pytest.fixture(scope="module")
def flowers() -> ServedModel:
    package = pipeline_model().package
    return ServedModel.load(package, ServingSettings(model_dir=package.parent.parent, warmup=False))


def record(data: str, content_type: str, encoding: str, minute: int, about: dict[str, Any] | None = None) -> str:
    line: dict[str, Any] = {
        "captureData": {
            "endpointInput": {"observedContentType": content_type, "mode": "INPUT", "data": data, "encoding": encoding},
            "endpointOutput": {
                "observedContentType": "application/json",
                "mode": "OUTPUT",
                "data": json.dumps(
                    {"predictions": ["setosa", "versicolor"], "probabilities": [[0.9, 0.05, 0.05], [0.1, 0.8, 0.1]]}
                ),
                "encoding": "JSON",
            },
        },
        "eventMetadata": {"eventId": f"id-{minute}", "inferenceTime": f"2026-12-03T11:{minute:02d}:00.000Z"},
        "eventVersion": "0",
    }
    if about is not None:
        line["servestack"] = about
    return json.dumps(line)


def capture_text() -> str:
    core = {"deployment": "d", "mode": "serverless", "model": "flowers", "version": "1"}
    without_site = {name: values for name, values in ROWS.items() if name != "site"}
    rows = [list(row) for row in zip(*ROWS.values(), strict=True)]
    split = {"dataframe_split": {"columns": list(ROWS), "data": rows}}
    csv_body = ",".join(ROWS) + "\n" + "\n".join(",".join(map(str, row)) for row in rows) + "\n"
    lines = [
        record(json.dumps({"inputs": ROWS}), "application/json", "JSON", 1, core),
        record(json.dumps({"inputs": without_site}), "application/json", "JSON", 2, core),  # site kept out
        record(json.dumps(split), "application/json", "JSON", 3),
        record(base64.b64encode(json.dumps(split).encode()).decode(), "application/json", "BASE64", 4),
        record(csv_body, "text/csv", "CSV", 5),
        record(json.dumps({"inputs": ROWS}), "application/json", "JSON", 6, {**core, "model": "other"}),
        record(json.dumps({"inputs": {**ROWS, "site": [1, 2]}}), "application/json", "JSON", 7, core),
        "not json",
        record(json.dumps({"inputs": ROWS}), "application/json", "JSON", 59, core),  # outside the window below
    ]
    return "\n".join(lines) + "\n"


def read(lines: Iterator[tuple[str, str]], model: ServedModel, window: Window) -> tuple[Any, Table]:
    table, _ = Table.for_model(model.manifest)
    return read_capture(lines, model, window, table), table


def test_every_record_form_reads_as_the_server_read_it(flowers: ServedModel, tmp_path: Path) -> None:
    # GIVEN a capture folder (hourly subfolders, as SageMaker lays them out) of records in every form
    hour = tmp_path / "capture" / "2026" / "12" / "03" / "11"
    hour.mkdir(parents=True)
    (hour / "a.jsonl").write_text(capture_text())
    (tmp_path / "capture" / "README.txt").write_text("not a capture file")
    # WHEN it is read for 11:00 to 11:30
    window = Window(datetime(2026, 12, 3, 11, 0, tzinfo=UTC), datetime(2026, 12, 3, 11, 30, tzinfo=UTC))
    captured, table = read(capture_lines(str(tmp_path / "capture"), endpoint_url=None, region=None), flowers, window)
    # THEN the five readable records of the model count, 10 rows, and each column holds its typed values
    assert captured.records == 5
    assert table.rows == 10
    feature = {f.name: f for f in table.features}
    assert [f.name for f in table.features] == list(COLUMNS)
    assert table.input_values(feature["sepal_length"]).tolist() == pytest.approx([5.1, 6.2] * 5)
    # AND the column a core record left out is absent there, not filled in
    assert table.input_values(feature["site"]).tolist() == ["north", "east"] * 4
    # AND the predictions and the confidence come from the answers
    assert table.output_values(PREDICTION).tolist() == ["setosa", "versicolor"] * 5
    assert table.output_values(CONFIDENCE).tolist() == pytest.approx([0.9, 0.8] * 5)
    # AND the records left out are counted, each reason once, with where it was first met
    notes = captured.notes()
    assert len(notes) == 3
    assert any("a record of another model (other)" in note for note in notes)
    assert any("the model refuses its input" in note and "a.jsonl:7" in note for note in notes)
    assert any("not a capture record" in note and "a.jsonl:8" in note for note in notes)


def test_the_same_records_read_from_s3(flowers: ServedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3
    from moto.server import ThreadedMotoServer

    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(name, value)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        s3.create_bucket(Bucket="capture")
        s3.put_object(Bucket="capture", Key="wine/AllTraffic/2026/12/03/11/a.jsonl", Body=capture_text().encode())
        s3.put_object(Bucket="capture", Key="other/x.jsonl", Body=b"elsewhere")
        lines = capture_lines("s3://capture/wine/", endpoint_url=endpoint, region="us-east-1")
        captured, table = read(lines, flowers, Window(until=datetime(2026, 12, 3, 11, 30, tzinfo=UTC)))
    finally:
        server.stop()
    assert captured.records == 5
    assert table.rows == 10
    assert captured.first_seen[next(iter(captured.first_seen))].startswith("s3://capture/wine/AllTraffic/")


def test_times_are_iso_or_back_from_now() -> None:
    assert parse_time("24h", NOW) == datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
    assert parse_time("30m", NOW) == datetime(2026, 12, 3, 11, 30, tzinfo=UTC)
    assert parse_time("7d", NOW) == datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
    assert parse_time("2026-12-03T10:00:00Z", NOW) == datetime(2026, 12, 3, 10, 0, tzinfo=UTC)
    assert parse_time("2026-12-03T10:00:00", NOW) == datetime(2026, 12, 3, 10, 0, tzinfo=UTC)  # no zone: UTC
    with pytest.raises(CaptureError, match="'yesterday' is not a time"):
        parse_time("yesterday", NOW)


def test_a_missing_capture_location_is_named(tmp_path: Path) -> None:
    with pytest.raises(CaptureError, match="no such file or folder"):
        list(capture_lines(str(tmp_path / "nowhere"), endpoint_url=None, region=None))


def test_a_csv_answer_reads_its_predictions_and_confidence(flowers: ServedModel) -> None:
    table, _ = Table.for_model(flowers.manifest)
    assert table.add_csv_answer([["prediction", "proba_a", "proba_b"], ["setosa", "0.7", "0.3"]])
    assert table.output_values(PREDICTION).tolist() == ["setosa"]
    assert np.asarray(table.output_values(CONFIDENCE)).tolist() == [0.7]
