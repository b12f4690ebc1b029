"""Input objects as rows, in chunks: lines of JSON Lines and CSV objects, record batches of Parquet objects.

A row of a line format is one line, stripped as `bytes.strip()` strips it; blank lines are not rows, a byte
order mark before the first line is dropped, and a first CSV line none of whose cells is a number names the
columns. Lines end at `\n` only (a `\r` before it is stripped; one elsewhere stays in the line, which then
holds no valid row), so no line can shift another's number. Lines are found with numpy over whole blocks of
the object and kept as offsets into the block, never as one Python object per row.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from models import codecs
from models.errors import InvalidInput
from models.tabular.store import Store, StoredObject

PARQUET = "application/vnd.apache.parquet"
FORMATS = {
    ".jsonl": codecs.JSON,
    ".ndjson": codecs.JSON,
    ".json": codecs.JSON,
    ".csv": codecs.CSV,
    ".parquet": PARQUET,
}
BOM = b"\xef\xbb\xbf"
# What bytes.strip() strips: space, \t, \n, \v, \f, \r.
_WHITESPACE = np.zeros(256, dtype=bool)
_WHITESPACE[[9, 10, 11, 12, 13, 32]] = True
# Vectorized stripping peels one byte per round off every line; lines with longer runs are finished one by one.
_STRIP_ROUNDS = 4


@dataclass
class Progress:
    rows: int = 0
    errors: int = 0
    bytes_read: int = 0
    total_bytes: int = 0
    parts_done: int = 0
    parts_skipped: int = 0
    started: float = field(default_factory=time.perf_counter)

    @property
    def rows_per_sec(self) -> float:
        return self.rows / max(time.perf_counter() - self.started, 1e-9)


def suffix(key: str) -> str:
    dot = key.rfind(".")
    return key[dot:].lower() if dot > key.rfind("/") else ""


@dataclass(frozen=True)
class Lines:
    """Rows of one line-format object within one block: row i is `data[starts[i]:ends[i]]`, line `lines[i]`."""

    source: str
    media_type: str
    data: bytes
    starts: np.ndarray
    ends: np.ndarray
    lines: np.ndarray

    def __len__(self) -> int:
        return len(self.lines)

    def cut(self, start: int, stop: int) -> Lines:
        return Lines(
            self.source, self.media_type, self.data, self.starts[start:stop], self.ends[start:stop],
            self.lines[start:stop],
        )  # fmt: skip

    def raw(self, index: int) -> bytes:
        return self.data[int(self.starts[index]) : int(self.ends[index])]

    def joined(self) -> bytes:
        """The rows separated by `\n`: one slice of the block when they are whole lines back to back."""
        if not len(self):
            return b""
        if np.array_equal(self.starts[1:], self.ends[:-1] + 1):
            return self.data[int(self.starts[0]) : int(self.ends[-1])]
        return b"\n".join(self.raw(i) for i in range(len(self)))


@dataclass(frozen=True)
class Records:
    """Rows of one Parquet object: a pyarrow record batch; row i is row number `lines[i]` of the file."""

    source: str
    batch: Any  # pyarrow.RecordBatch
    lines: np.ndarray
    media_type: str = PARQUET

    def __len__(self) -> int:
        return len(self.lines)

    def cut(self, start: int, stop: int) -> Records:
        return Records(self.source, self.batch.slice(start, stop - start), self.lines[start:stop])


Piece = Lines | Records


def _strip(arr: np.ndarray, data: bytes, starts: np.ndarray, ends: np.ndarray) -> None:
    """Narrow each [start, end) in place as bytes.strip() would."""
    for _ in range(_STRIP_ROUNDS):
        trailing = ends > starts
        trailing[trailing] = _WHITESPACE[arr[ends[trailing] - 1]]
        ends[trailing] -= 1
        leading = ends > starts
        leading[leading] = _WHITESPACE[arr[starts[leading]]]
        starts[leading] += 1
        if not trailing.any() and not leading.any():
            return
    left = ends > starts
    left[left] = _WHITESPACE[arr[ends[left] - 1]] | _WHITESPACE[arr[starts[left]]]
    for index in np.flatnonzero(left):
        raw = data[int(starts[index]) : int(ends[index])]
        starts[index] += len(raw) - len(raw.lstrip())
        ends[index] -= len(raw) - len(raw.rstrip())
        ends[index] = max(ends[index], starts[index])


def is_header(raw: bytes) -> bool:
    """A first CSV line none of whose cells is a number names the columns. A line with some numbers is data
    (a bad one is reported as an error row, never skipped as a header)."""
    try:
        cells = codecs.decode_body(raw, codecs.CSV)
    except InvalidInput:
        return False
    return len(cells) == 1 and not any(codecs.is_csv_number(cell) for cell in cells[0])


def split_lines(
    source: str, media_type: str, data: bytes, first_line: int, *, file_start: bool, skip_header: bool = True
) -> Lines:
    """The rows of `data`, whole lines of an object (the last may lack its newline) starting at `first_line`."""
    arr = np.frombuffer(data, dtype=np.uint8)
    newlines = np.flatnonzero(arr == 10)
    ends = newlines if data.endswith(b"\n") else np.append(newlines, len(data))
    starts = np.empty_like(ends)
    if len(ends):
        starts[0] = 0
        starts[1:] = ends[:-1] + 1
    numbers = np.arange(first_line, first_line + len(ends), dtype=np.int64)
    _strip(arr, data, starts, ends)
    keep = ends > starts
    if file_start and len(ends) and keep[0]:
        first = data[int(starts[0]) : int(ends[0])]
        if first.startswith(BOM):
            rest = first[len(BOM) :]
            starts[0] += len(BOM) + len(rest) - len(rest.lstrip())
            ends[0] = max(int(starts[0]), int(ends[0]) - (len(rest) - len(rest.rstrip())))
            keep[0] = ends[0] > starts[0]
        if keep[0] and skip_header and media_type == codecs.CSV and is_header(data[int(starts[0]) : int(ends[0])]):
            keep[0] = False
    return Lines(source, media_type, data, starts[keep], ends[keep], numbers[keep])


def object_lines(
    store: Store, obj: StoredObject, media_type: str, progress: Progress, *, skip_header: bool = True
) -> Iterator[Lines]:
    """The rows of a line-format object, one `Lines` per block read."""
    return block_lines(store.blocks(obj.key), obj.key, media_type, progress, skip_header=skip_header)


def block_lines(
    blocks: Iterable[bytes], key: str, media_type: str, progress: Progress, *, skip_header: bool = True
) -> Iterator[Lines]:
    """The rows of an object given as its blocks, one `Lines` per block."""
    pending = b""
    line = 1
    file_start = True
    for block in blocks:
        progress.bytes_read += len(block)
        data = pending + block if pending else block
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            pending = data
            continue
        complete, pending = data[:cut], data[cut:]
        rows = split_lines(key, media_type, complete, line, file_start=file_start, skip_header=skip_header)
        line += complete.count(b"\n")
        file_start = False
        if len(rows):
            yield rows
    if pending:
        rows = split_lines(key, media_type, pending, line, file_start=file_start, skip_header=skip_header)
        if len(rows):
            yield rows


def parquet_module() -> Any:
    """pyarrow.parquet, or InvalidInput saying which engines carry it."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise InvalidInput(
            "Parquet needs pyarrow, which this runtime does not carry (the Lambda bundle leaves it out to stay "
            "under 150 MB)",
            field="engine",
            value="lambda",
            allowed="engine: fargate (the container image carries pyarrow) for Parquet input or output",
        ) from None
    return pq


def object_records(store: Store, obj: StoredObject, progress: Progress, batch_rows: int) -> Iterator[Records]:
    """The rows of a Parquet object, in record batches of at most `batch_rows` rows."""
    pq = parquet_module()
    with tempfile.TemporaryDirectory(prefix="servestack-parquet-") as folder:
        path = Path(folder) / "object.parquet"
        store.download(obj.key, path)
        progress.bytes_read += obj.size
        try:
            reader = pq.ParquetFile(path)
        except Exception as exc:  # pyarrow raises ArrowInvalid / OSError subclasses for a file it cannot read
            raise InvalidInput(
                f"{obj.key}: not a readable Parquet file ({str(exc)[:200]})",
                field=obj.key,
                allowed="a Parquet file (or rename it: the suffix decides the format)",
            ) from None
        line = 1
        for batch in reader.iter_batches(batch_size=batch_rows):
            yield Records(obj.key, batch, np.arange(line, line + batch.num_rows, dtype=np.int64))
            line += batch.num_rows


def pieces(store: Store, inputs: list[StoredObject], progress: Progress, batch_rows: int) -> Iterator[Piece]:
    for obj in inputs:
        media_type = FORMATS[suffix(obj.key)]
        if media_type == PARQUET:
            yield from object_records(store, obj, progress, batch_rows)
        else:
            yield from object_lines(store, obj, media_type, progress)


def chunks(source: Iterator[Piece], chunk_rows: int) -> Iterator[list[Piece]]:
    """Exactly `chunk_rows` rows per chunk (the last may hold fewer); a chunk may span objects."""
    chunk: list[Piece] = []
    size = 0
    for piece in source:
        offset = 0
        while offset < len(piece):
            take = min(chunk_rows - size, len(piece) - offset)
            chunk.append(piece.cut(offset, offset + take))
            size += take
            offset += take
            if size == chunk_rows:
                yield chunk
                chunk, size = [], 0
    if chunk:
        yield chunk
