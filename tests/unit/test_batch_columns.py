"""The batch job's columnar shortcuts (servestack/inference/tabular): each gives what the general path gives, or
refuses what it refuses. Class names by table lookup, Parquet float columns read straight into the input's dtype, a
Parquet
part checked from its `file` and `line` columns and its footer."""

from __future__ import annotations

import io

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sklearn.datasets import load_breast_cancer

from servestack.inference.service import ModelRepository, ServedModel
from servestack.inference.settings import ServingSettings
from servestack.inference.tabular.decode import decode_records
from servestack.inference.tabular.encode import (
    LabelColumn,
    batch_fields,
    located_lines,
    parquet_bytes,
    parquet_keys,
    parquet_table,
    per_row_fields,
)
from servestack.inference.tabular.rows import Records

ROWS = load_breast_cancer().data.astype(np.float32)[:64]


@pytest.fixture(scope="module")
def model() -> ServedModel:
    repository = ModelRepository(ServingSettings(warmup=False))
    repository.load_all()
    return repository.get("breast-cancer")


def records(table: pa.Table) -> Records:
    (batch,) = table.to_batches()
    return Records("a.parquet", batch, np.arange(1, table.num_rows + 1, dtype=np.int64))


def test_class_names_by_lookup_write_the_bytes_a_name_per_row_writes(model: ServedModel) -> None:
    # GIVEN the model's outputs for rows of both classes
    outputs = model.predict({"input": ROWS})
    rows = len(ROWS)
    # WHEN the batch fields (names as a LabelColumn) and the response's fields (a str per row) are written
    looked_up = batch_fields(model, outputs, rows)
    named = per_row_fields(model, model.respond(outputs), rows)
    # THEN the fields are the same, in the same order, and both formats write the same bytes
    assert isinstance(looked_up["label"], LabelColumn)
    assert list(looked_up) == list(named)
    assert looked_up["label"].tolist() == named["label"]
    assert len(set(named["label"])) == 2
    sources, lines = [orjson.dumps("a.jsonl")] * rows, np.arange(1, rows + 1)
    assert located_lines(sources, lines, looked_up) == located_lines(sources, lines, named)
    which = np.zeros(rows, dtype=np.int64)
    looked_up_table = parquet_table(["a.jsonl"], which, lines, looked_up)
    named_table = parquet_table(["a.jsonl"], which, lines, named)
    # AND in Parquet both are the same columns of the same types, the class names a dictionary column
    assert looked_up_table.schema == named_table.schema
    assert looked_up_table.schema.field("label").type == pa.dictionary(pa.int32(), pa.string())
    assert looked_up_table.to_pylist() == named_table.to_pylist()


def test_a_prediction_that_names_no_class_keeps_its_text(model: ServedModel) -> None:
    # GIVEN outputs whose predicted class is outside the manifest's labels
    outputs = dict(model.predict({"input": ROWS[:3]}))
    outputs["label"] = np.array([0, 7, 1], dtype=np.int64)
    # WHEN the batch fields are built / THEN the names are those a response gives: the number as text
    fields = batch_fields(model, outputs, 3)
    assert fields["label"] == ["malignant", "7", "benign"]


@pytest.mark.parametrize("arrow_type", [pa.float16(), pa.float32(), pa.float64()])
def test_float_columns_decode_to_the_values_of_the_float64_path(model: ServedModel, arrow_type: pa.DataType) -> None:
    # GIVEN the rows as 30 float columns of one width
    table = pa.table({f"f{i}": pa.array(ROWS[:, i]).cast(arrow_type) for i in range(ROWS.shape[1])})
    # WHEN they are decoded
    decoded = decode_records(model, records(table))
    # THEN every row is good, float32, with the values float64 -> float32 gives
    assert decoded.bad == []
    assert decoded.arrays is not None
    expected = np.stack([table.column(i).to_numpy().astype(np.float64) for i in range(30)], axis=1)
    assert decoded.arrays["input"].dtype == np.float32
    assert decoded.arrays["input"].tobytes() == expected.astype(np.float32).tobytes()


def test_a_float64_value_too_large_for_float32_is_named_not_read_as_infinity(model: ServedModel) -> None:
    # GIVEN float64 columns where row 3 holds a value float32 cannot hold, and float32 columns with an infinity
    wide = {f"f{i}": pa.array(ROWS[:, i].astype(np.float64)) for i in range(30)}
    values = ROWS[:, 5].astype(np.float64)
    values[2] = 1e300
    wide["f5"] = pa.array(values)
    narrow = {f"f{i}": pa.array(ROWS[:, i]) for i in range(30)}
    infinite = ROWS[:, 5].copy()
    infinite[2] = np.inf
    narrow["f5"] = pa.array(infinite)
    # WHEN both are decoded
    too_large = decode_records(model, records(pa.table(wide)))
    not_finite = decode_records(model, records(pa.table(narrow)))
    # THEN row 3 is an error saying why, and the others decode
    for decoded, says in ((too_large, "does not fit float32"), (not_finite, "NaN or infinity")):
        assert [row for row, _ in decoded.bad] == [2]
        assert says in decoded.bad[0][1].message
        assert decoded.arrays is not None
        assert len(decoded.arrays["input"]) == len(ROWS) - 1


def part(table: pa.Table, **options: object) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, **options)
    return sink.getvalue()


def test_a_parquet_part_is_read_back_from_file_and_line_and_a_null_anywhere_is_refused(model: ServedModel) -> None:
    # GIVEN a part the job writes for rows of two files
    fields = batch_fields(model, model.predict({"input": ROWS[:6]}), 6)
    which, lines = np.array([0, 0, 0, 1, 1, 1]), np.array([1, 2, 3, 1, 2, 3])
    table = parquet_table(["a.jsonl", "b.jsonl"], which, lines, fields)
    body = parquet_bytes([table])
    # WHEN its keys are read
    found_which, found_lines = parquet_keys(body, ["a.jsonl", "b.jsonl"])
    # THEN they are each row's file and line
    assert found_which.tolist() == which.tolist()
    assert found_lines.tolist() == lines.tolist()
    # AND a part with a null in a response field is refused, whether or not its footer counts nulls
    probabilities = table.column("probabilities").to_pylist()
    probabilities[4] = None
    holed = table.set_column(3, "probabilities", pa.array(probabilities, type=table.schema.field(3).type))
    for options in ({}, {"write_statistics": False}):
        with pytest.raises(ValueError, match="null"):
            parquet_keys(part(holed, **options), ["a.jsonl", "b.jsonl"])
    # AND a part naming a file that is not the chunk's is refused
    with pytest.raises(ValueError, match="not in this part"):
        parquet_keys(body, ["a.jsonl"])
