"""Data capture's core (servestack/inference/capture.py): the sampler, exclusion, and the record format of
docs/monitoring.md, without a server."""

from __future__ import annotations

import json
import math
import random
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from servestack.inference.capture import (
    MAX_LINE_BYTES,
    CapturePolicy,
    Capturer,
    CaptureSetting,
    capture_record,
    input_columns,
    parse_setting,
    records_of,
)
from servestack.inference.errors import ConfigurationError
from servestack.inference.manifest import ColumnSpec
from servestack.spec import SpecError, load_spec

COLUMNS = (
    ColumnSpec("age", "float32", "numbers", index=0),
    ColumnSpec("income", "float32", "numbers", index=1),
    ColumnSpec("email", "string", "email"),
)
TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def setting(**fields: Any) -> CaptureSetting:
    return CaptureSetting(deployment="d", mode="serverless", **fields)


def arrays(rows: int = 2) -> dict[str, np.ndarray]:
    return {
        "numbers": np.arange(rows * 2, dtype=np.float32).reshape(rows, 2),
        "email": np.array([[f"u{i}@example.com"] for i in range(rows)], dtype=object),
    }


def emitted(capturer_setting: CaptureSetting, **fields: Any) -> list[dict[str, Any]]:
    lines: list[bytes] = []
    given = {"columns": COLUMNS, "arrays": arrays(), "output": b'{"predictions":[1,0]}'} | fields
    Capturer(capturer_setting, variant="primary", write=lines.append).emit(model="m", version="1", **given)
    assert all(line.endswith(b"\n") and line.count(b"\n") == 1 for line in lines)
    return records_of(lines)


def test_a_record_has_sagemakers_shape_and_the_servestack_block() -> None:
    (record,) = emitted(setting())

    assert record["eventVersion"] == "0"
    assert UUID.match(record["eventMetadata"]["eventId"])
    assert TIME.match(record["eventMetadata"]["inferenceTime"])
    inputs, output = record["captureData"]["endpointInput"], record["captureData"]["endpointOutput"]
    assert {k: v for k, v in inputs.items() if k != "data"} == {
        "observedContentType": "application/json",
        "mode": "INPUT",
        "encoding": "JSON",
    }
    # column by column, an [N, k] input split into its named columns: a body the request forms take again
    assert orjson.loads(inputs["data"]) == {
        "inputs": {"age": [0.0, 2.0], "income": [1.0, 3.0], "email": ["u0@example.com", "u1@example.com"]}
    }
    assert output == {
        "observedContentType": "application/json",
        "mode": "OUTPUT",
        "data": '{"predictions":[1,0]}',
        "encoding": "JSON",
    }
    assert record["servestack"] == {
        "deployment": "d",
        "mode": "serverless",
        "model": "m",
        "version": "1",
        "variant": "primary",
        "job_id": None,
    }


def test_what_leaves_out_the_other_half() -> None:
    (inputs_only,) = emitted(setting(what="inputs"))
    (outputs_only,) = emitted(setting(what="outputs"))

    assert list(inputs_only["captureData"]) == ["endpointInput"]
    assert list(outputs_only["captureData"]) == ["endpointOutput"]


def test_an_async_record_carries_its_job_id_and_a_csv_answer_stays_text() -> None:
    (record,) = emitted(setting(), job_id="job-1", output=b"prediction\n1\n0\n", output_type="text/csv")

    assert record["servestack"]["job_id"] == "job-1"
    assert record["captureData"]["endpointOutput"]["encoding"] == "CSV"
    assert record["captureData"]["endpointOutput"]["data"] == "prediction\n1\n0\n"


def test_a_binary_answer_is_base64() -> None:
    (record,) = emitted(setting(), output=b"\x93NUMPY\x01\x00", output_type="application/x-npy")

    assert record["captureData"]["endpointOutput"]["encoding"] == "BASE64"
    assert record["captureData"]["endpointOutput"]["data"] == "k05VTVBZAQA="


def test_a_record_past_a_log_events_limit_keeps_its_metadata_without_data() -> None:
    big = {"blob": np.array([["x" * 1000] for _ in range(300)], dtype=object)}
    (record,) = emitted(setting(), arrays=big, columns=())

    assert record["captureData"] == {}
    assert str(MAX_LINE_BYTES) in record["servestack"]["dropped"]


# Names as users write them, values JSON holds (floats finite or not: NaN and infinities are written as null).
names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)
cells = st.one_of(st.floats(width=32), st.text(max_size=20))


@given(
    table=st.dictionaries(names, st.lists(cells, min_size=1, max_size=4), min_size=1, max_size=6),
    data=st.data(),
)
def test_excluded_columns_never_reach_a_record(table: dict[str, list[Any]], data: st.DataObject) -> None:
    rows = min(len(values) for values in table.values())
    given_arrays = {name: _column(values[:rows]) for name, values in table.items()}
    excluded = data.draw(st.lists(st.sampled_from(sorted(table)), unique=True))
    lines: list[bytes] = []
    Capturer(setting(exclude_columns=tuple(excluded)), write=lines.append).emit(
        model="m", version="1", columns=(), arrays=given_arrays, output=b"{}"
    )

    (record,) = records_of(lines)
    captured = orjson.loads(record["captureData"]["endpointInput"]["data"])["inputs"]
    assert set(captured) == set(table) - set(excluded)
    for name in captured:  # what is kept is what the model saw, NaN and infinities as null
        written = orjson.dumps(given_arrays[name], option=orjson.OPT_SERIALIZE_NUMPY, default=lambda a: a.tolist())
        assert captured[name] == orjson.loads(written)


def _column(values: list[Any]) -> np.ndarray:
    text = any(isinstance(v, str) for v in values)
    return np.array([[str(v) if text else v] for v in values], dtype=object if text else np.float32)


def test_an_excluded_column_of_a_wide_input_or_a_whole_input_is_left_out() -> None:
    assert set(input_columns(arrays(), COLUMNS, ["income"])) == {"age", "email"}
    assert set(input_columns(arrays(), COLUMNS, ["numbers"])) == {"email"}  # the input: all its columns


def test_a_raw_body_is_kept_only_when_nothing_is_excluded() -> None:
    raw = {"payload": np.array([[b"\x00\x01"]], dtype=object)}
    (kept,) = emitted(setting(), arrays=raw, columns=(), body=b"\x00\x01")
    (dropped,) = emitted(setting(exclude_columns=("x",)), arrays=raw, columns=(), body=b"\x00\x01")

    assert kept["captureData"]["endpointInput"] == {
        "observedContentType": "application/octet-stream",
        "mode": "INPUT",
        "data": "AAE=",
        "encoding": "BASE64",
    }
    assert "endpointInput" not in dropped["captureData"]


@pytest.mark.parametrize("percent", [0.0, 100.0])
def test_the_sampler_takes_none_or_all(percent: float) -> None:
    policy = CapturePolicy(setting(sample_percent=percent), random.Random(1).random)  # noqa: S311 - a sampler, no secret
    assert {policy.sampled() for _ in range(1000)} == {percent == 100}


def test_ten_percent_over_2000_requests_is_within_binomial_bounds() -> None:
    """The sampler alone (in process: 2,000 requests through `local up` would take minutes); the e2e test checks
    the same sampler behind the real fronts at 100%. Bounds: 4.5 standard deviations of Binomial(2000, 0.1)
    (mean 200, sd 13.4), so a correct sampler fails one seed in ~150,000, a biased one (8% or 12%) nearly
    always; over 20 seeds, so the bound is met by each, not by luck of one."""
    n, p = 2000, 0.10
    sd = math.sqrt(n * p * (1 - p))
    for seed in range(20):
        policy = CapturePolicy(setting(sample_percent=10), random.Random(seed).random)  # noqa: S311 - a sampler, no secret
        taken = sum(policy.sampled() for _ in range(n))
        assert abs(taken - n * p) <= 4.5 * sd, (seed, taken)


def test_the_setting_is_one_json_variable_whose_errors_name_it() -> None:
    assert parse_setting("") is None
    assert parse_setting('{"deployment": "d", "mode": "async"}') == CaptureSetting(deployment="d", mode="async")
    with pytest.raises(ConfigurationError) as caught:
        parse_setting('{"deployment": "d", "mode": "async", "sample_percent": 150}')
    assert caught.value.field == "SERVESTACK_CAPTURE"


def test_records_of_reads_json_lines() -> None:
    native = capture_record(
        setting(),
        model="m",
        version="1",
        variant=None,
        inputs=b"{}",
        output=b"{}",
        now=datetime(2026, 1, 2, tzinfo=UTC),
    )
    lines = [orjson.dumps(native), b"", orjson.dumps(native)]

    assert records_of(lines) == [native, native]
    assert native["eventMetadata"]["inferenceTime"] == "2026-01-02T00:00:00.000Z"


def test_excluded_columns_must_be_the_models_inputs_or_columns(tmp_path: Path) -> None:
    package = tmp_path / "models" / "artifacts" / "people" / "1"
    package.mkdir(parents=True)
    manifest = {"name": "people", "inputs": [{"name": "numbers"}], "columns": [{"name": "age"}, {"name": "email"}]}
    (package / "manifest.json").write_text(json.dumps(manifest))
    (package / "model.onnx").write_bytes(b"a graph")  # only its presence is checked here
    spec = {
        "models": [{"name": "people", "version": 1}],
        "deployments": {"api": {"mode": "serverless", "model": "people", "capture": {"exclude_columns": []}}},
    }
    for columns in (["email"], ["numbers"]):
        spec["deployments"]["api"]["capture"]["exclude_columns"] = columns
        (tmp_path / "serving.yaml").write_text(yaml.safe_dump(spec))
        assert load_spec(tmp_path / "serving.yaml", bundled=False).deployments["api"].capture is not None

    spec["deployments"]["api"]["capture"]["exclude_columns"] = ["e-mail"]
    (tmp_path / "serving.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(SpecError) as caught:
        load_spec(tmp_path / "serving.yaml", bundled=False)

    assert caught.value.problems == [
        "deployments.api.capture.exclude_columns: 'e-mail' is not one of the models' inputs or columns "
        "(age, email, numbers)"
    ]
