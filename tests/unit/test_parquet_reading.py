"""Parquet read in bounded batches (servestack/inference/tabular/parquet_reading.py) and cut into chunks bounded by
what their rows decode to (chunking.py): the batch job's side of issue 37's fourth finding, a 68 KB file of one
dictionary-encoded string over 300,000 rows that took the job to 1.7 GB. The memory of the whole job on that
file, capped, is tests/integration/test_batch_memory.py's."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from servestack.inference.service import ServedModel
from servestack.inference.tabular import parquet_reading
from servestack.inference.tabular.chunking import chunks
from servestack.inference.tabular.decode import decode_piece
from servestack.inference.tabular.parquet_reading import decoded_row_bytes, object_records
from servestack.inference.tabular.rows import Progress, Records, Refused, UnreadableFile
from servestack.inference.tabular.store import StoredObject
from tests.tabular_fixtures import site_package

LONG = "x" * 2000


class OneObject:
    """The methods of a store `object_records` calls: the object's bytes, into a file (a large object) or whole."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.calls: list[str] = []

    def download(self, key: str, path: Path) -> None:
        self.calls.append("download")
        path.write_bytes(self.body)

    def get(self, key: str) -> bytes:
        self.calls.append("get")
        return self.body


def parquet(table: pa.Table, **options: Any) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, **options)
    return sink.getvalue()


def read(body: bytes, batch_rows: int = 10_000) -> list[Records | Refused]:
    obj = StoredObject("in/a.parquet", len(body), "etag")
    return list(object_records(OneObject(body), obj, Progress(), batch_rows))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def hostile() -> bytes:
    """One dictionary-encoded 2,000-character string over 300,000 rows, in one row group: 68 KB."""
    body = parquet(pa.table({"site": pa.array([LONG] * 300_000)}), use_dictionary=True, row_group_size=300_000)
    assert len(body) < 70_000
    return body


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> ServedModel:
    return site_package(tmp_path_factory.mktemp("sites"))


def test_a_row_group_is_read_one_batch_at_a_time_with_strings_as_dictionaries(hostile: bytes) -> None:
    # WHEN the hostile file is read in batches of 10,000 rows
    pieces = read(hostile)
    # THEN it comes as 30 batches (never the row group whole), its strings a dictionary of one value
    assert [len(piece) for piece in pieces] == [10_000] * 30
    first = pieces[0]
    assert isinstance(first, Records)
    column = first.batch.column("site")
    assert pa.types.is_dictionary(column.type)
    assert len(column.dictionary) == 1
    assert first.batch.nbytes < 100_000  # the indices and the one string, not 20 MB of copies
    # AND each row is measured at its decoded size, the string's length and a reference
    assert first.row_bytes is not None
    assert set(first.row_bytes.tolist()) == {2008}
    assert np.concatenate([piece.lines for piece in pieces]).tolist() == list(range(1, 300_001))


def test_a_repeated_string_reaches_the_model_as_references_to_one_object(hostile: bytes, sites: ServedModel) -> None:
    # GIVEN a batch of the hostile file
    (piece, *_) = read(hostile, batch_rows=5000)
    assert isinstance(piece, Records)
    # WHEN it is decoded for the model (a string column: any text is a row it takes)
    decoded = decode_piece(sites, piece)
    # THEN every row is good, and the 5,000 values are one Python object, not 5,000 copies
    assert decoded.bad == []
    assert decoded.arrays is not None
    (values,) = decoded.arrays.values()
    assert values.shape == (5000, 1)
    assert len({id(value) for value in values.reshape(-1).tolist()}) == 1
    assert sites.predict(decoded.arrays)["score"].reshape(-1).tolist() == [0.0] * 5000


def test_strings_with_nulls_and_several_values_keep_their_values(sites: ServedModel) -> None:
    body = parquet(pa.table({"site": ["north", None, "east", "north", "moon"]}))
    (piece,) = read(body)
    assert isinstance(piece, Records)
    decoded = decode_piece(sites, piece)
    assert decoded.good.tolist() == [0, 2, 3, 4]
    assert [row for row, _ in decoded.bad] == [1]
    assert decoded.arrays is not None
    assert sites.predict(decoded.arrays)["score"].reshape(-1).tolist() == [1.0, 3.0, 1.0, 0.0]


def test_chunks_stop_before_their_rows_pass_the_byte_budget() -> None:
    # GIVEN rows of 20,008 decoded bytes each, 100 of them, in batches of 30
    body = parquet(pa.table({"site": pa.array(["y" * 20_000] * 100)}), use_dictionary=True)
    source = read(body, batch_rows=30)
    # WHEN cut into chunks of up to 50 rows and 100,000 decoded bytes
    cut = list(chunks(iter(source), chunk_rows=50, chunk_bytes=100_000))
    # THEN each chunk holds 4 rows (80,032 bytes; a fifth would pass the budget), every row once, in order
    sizes = [sum(len(piece) for piece in chunk) for chunk in cut]
    assert sizes == [4] * 25
    for chunk in cut:
        assert sum(int(piece.row_bytes.sum()) for piece in chunk if isinstance(piece, Records)) <= 100_000  # type: ignore[union-attr]
    lines = np.concatenate([piece.lines for chunk in cut for piece in chunk])
    assert lines.tolist() == list(range(1, 101))


def test_chunks_of_unmeasured_pieces_count_rows_only() -> None:
    batch = pa.record_batch({"x": list(range(25))})
    source: Iterator[Records] = iter([Records("a", batch, np.arange(1, 26)), Records("b", batch, np.arange(1, 26))])
    assert [sum(len(p) for p in chunk) for chunk in chunks(source, chunk_rows=20, chunk_bytes=1)] == [20, 20, 10]


def test_a_row_over_the_budget_is_an_error_row_and_its_neighbours_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a budget of 1 MiB and a file whose second row holds a 2 MiB string
    monkeypatch.setattr(parquet_reading, "MAX_CHUNK_DECODED_BYTES", 1024 * 1024)
    body = parquet(pa.table({"site": ["north", "z" * (2 * 1024 * 1024), "south"]}))
    # WHEN it is read
    pieces = read(body)
    # THEN the second row is a Refused row naming its size, the others are records
    assert [type(piece).__name__ for piece in pieces] == ["Records", "Refused", "Records"]
    refused = pieces[1]
    assert isinstance(refused, Refused)
    assert refused.lines.tolist() == [2]
    assert "decodes to 2097160 bytes" in refused.errors[0].message


def test_a_row_group_that_decodes_past_the_bound_fails_the_file_before_a_row_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN a row group of 1,000,000 int64 values held in a few hundred bytes (run-length encoded dictionary
    # indices), and a bound of 1 MiB decoded
    monkeypatch.setattr(parquet_reading, "MAX_ROW_GROUP_BYTES", 1024 * 1024)
    body = parquet(pa.table({"n": pa.array(np.zeros(1_000_000, dtype=np.int64))}), use_dictionary=True)
    assert len(body) < 10_000
    # WHEN it is read THEN the file is unreadable, saying what the row group decodes to
    with pytest.raises(UnreadableFile) as caught:
        read(body)
    assert "row group 0 decodes to 8000000 bytes" in caught.value.message


def test_a_run_length_encoded_column_is_read_in_batches_of_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN 1,000,000 int64 zeros (8 MB decoded) and a budget of 1 MiB
    monkeypatch.setattr(parquet_reading, "MAX_CHUNK_DECODED_BYTES", 1024 * 1024)
    body = parquet(pa.table({"n": pa.array(np.zeros(1_000_000, dtype=np.int64))}), use_dictionary=True)
    # WHEN read with up to 1,000,000 rows a batch THEN each batch holds at most 1 MiB of values
    pieces = read(body, batch_rows=1_000_000)
    assert max(len(piece) for piece in pieces) * 8 <= 1024 * 1024
    assert sum(len(piece) for piece in pieces) == 1_000_000


def test_a_small_object_is_read_from_memory_and_a_large_one_from_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a Parquet object of 1,000 rows, read once whole and once over a bound on what is read in memory
    body = parquet(pa.table({"n": pa.array(np.arange(1000, dtype=np.float32))}))
    obj = StoredObject("in/a.parquet", len(body), "etag")
    small = OneObject(body)
    in_memory = list(object_records(small, obj, Progress(), 300))  # type: ignore[arg-type]
    monkeypatch.setattr(parquet_reading, "MAX_IN_MEMORY_BYTES", len(body) - 1)
    large = OneObject(body)
    from_file = list(object_records(large, obj, Progress(), 300))  # type: ignore[arg-type]
    # WHEN both are read THEN the small one was fetched whole, the large one into a file, with the same rows
    assert (small.calls, large.calls) == (["get"], ["download"])
    assert [piece.lines.tolist() for piece in in_memory] == [piece.lines.tolist() for piece in from_file]
    assert all(isinstance(piece, Records) for piece in in_memory + from_file)


def test_decoded_row_bytes_counts_each_kind_of_column() -> None:
    batch = pa.record_batch(
        {
            "f": pa.array([1.0, 2.0, 3.0], pa.float32()),
            "s": pa.array(["a", None, "abc"]),
            "d": pa.array(["xy", "xy", "z"]).dictionary_encode(),
            "l": pa.array([[1.0, 2.0], None, []], pa.list_(pa.float64())),
            "t": pa.array([{"q": 1}, {"q": 2}, {"q": 3}], pa.struct([("q", pa.int16())])),
            "b": pa.array([True, False, None]),
        }
    )
    # f: 4; s: length + 8; d: length + 8; l: 8 per value; t: 2; b: 1
    assert decoded_row_bytes(batch).tolist() == [
        4 + 9 + 10 + 16 + 2 + 1,
        4 + 8 + 10 + 0 + 2 + 1,
        4 + 11 + 9 + 0 + 2 + 1,
    ]
    assert decoded_row_bytes(batch.slice(1, 2)).tolist() == [4 + 8 + 10 + 0 + 2 + 1, 4 + 11 + 9 + 0 + 2 + 1]
