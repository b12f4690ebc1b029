"""Input objects as rows, in chunks: lines of JSON Lines and CSV objects, record batches of Parquet objects.

A row of a line format is one line, stripped as `bytes.strip()` strips it; blank lines are not rows (nor is a line
holding only a byte order mark, wherever it is), a byte order mark before the first line is dropped, and a first
CSV line none of whose cells is a number names the columns. Lines end at `\n` only (a `\r` before it is stripped;
one elsewhere stays in the line, which then holds no valid row), so no line can shift another's number. Lines are
found with numpy over whole blocks of the object and kept as offsets into the block, never as one Python object
per row.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, overload

import numpy as np

from servestack.inference import codecs, input_checks, media_types
from servestack.inference.errors import InvalidInput, ServingError
from servestack.inference.tabular.store import Store, StoredObject

PARQUET = "application/vnd.apache.parquet"
FORMATS = {
    ".jsonl": media_types.JSON,
    ".ndjson": media_types.JSON,
    ".json": media_types.JSON,
    ".csv": media_types.CSV,
    ".parquet": PARQUET,
}
BOM = b"\xef\xbb\xbf"
# What bytes.strip() strips: space, \t, \n, \v, \f, \r.
_WHITESPACE = np.zeros(256, dtype=bool)
_WHITESPACE[[9, 10, 11, 12, 13, 32]] = True
# Vectorized stripping peels one byte per round off every line; lines with longer runs are finished one by one.
_STRIP_ROUNDS = 4
# What one record (a line; a Parquet file's row group, column count and footer) may hold, by default. A record
# is read whole and, on the line-by-line path, parsed into Python objects: ~17x its bytes for JSON Lines and
# ~24x for CSV (a 100 MB line cost 1.7 and 2.4 GB). At 1 MiB a record's worst case is ~25 MiB, about 1% of the
# smallest batch job's memory (Lambda: 1,024 MB and up; Fargate: 4 GiB by default), so a few chunks of the
# longest records still fit beside the model. A longer line is an error row, and its bytes are never held.
MAX_RECORD_BYTES = 1024 * 1024
# (What a Parquet object may hold is servestack/inference/tabular/parquet_reading.py's.)
FILE_LINE = 0  # the line number of an error about a whole file (rows are numbered from 1)


@dataclass
class Progress:
    rows: int = 0
    errors: int = 0
    bytes_read: int = 0
    total_bytes: int = 0
    parts_done: int = 0
    parts_skipped: int = 0
    started: float = field(default_factory=time.perf_counter)
    started_cpu: float = field(default_factory=time.process_time)  # the process's CPU seconds when the run started

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
    header: tuple[str, ...] | None = None  # a CSV object's column names, from its first line, on every block
    whole: bool = False  # each row is a whole file, for a `preprocess` hook (files.py), not a line

    def __len__(self) -> int:
        return len(self.lines)

    def cut(self, start: int, stop: int) -> Lines:
        return self.select(slice(start, stop))

    def select(self, rows: slice | np.ndarray) -> Lines:
        """The rows `rows` picks (a slice, or ascending indices), of the same block."""
        return Lines(
            self.source,
            self.media_type,
            self.data,
            self.starts[rows],
            self.ends[rows],
            self.lines[rows],
            self.header,
            self.whole,
        )

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
    """Rows of one Parquet object: a pyarrow record batch; row i is row number `lines[i]` of the file, and
    decodes to `row_bytes[i]` bytes when the reader measured it (parquet_reading.py), which bounds chunks."""

    source: str
    batch: Any  # pyarrow.RecordBatch
    lines: np.ndarray
    media_type: str = PARQUET
    row_bytes: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.lines)

    def cut(self, start: int, stop: int) -> Records:
        sizes = self.row_bytes[start:stop] if self.row_bytes is not None else None
        return Records(self.source, self.batch.slice(start, stop - start), self.lines[start:stop], PARQUET, sizes)


@dataclass(frozen=True)
class Refused:
    """Rows refused while reading, before anything is decoded: a line over the record limit (its bytes never
    held), or `FILE_LINE` for a file that could not be read, or stopped being readable part way."""

    source: str
    lines: np.ndarray
    errors: tuple[ServingError, ...]
    media_type: str = ""

    def __len__(self) -> int:
        return len(self.lines)

    def cut(self, start: int, stop: int) -> Refused:
        return Refused(self.source, self.lines[start:stop], self.errors[start:stop], self.media_type)


Piece = Lines | Records | Refused


class UnreadableFile(InvalidInput):
    """An input object that cannot be read as its suffix says (the job records it and goes on to the next)."""


def record_too_long(size: int, limit: int) -> InvalidInput:
    return InvalidInput(
        f"line: {size} bytes, over the record limit of {limit} bytes",
        field="line",
        value=f"{size} bytes",
        allowed=f"lines of at most {limit} bytes (max_record_bytes)",
    )


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
        cells = codecs.decode_body(raw, media_types.CSV)
    except InvalidInput:
        return False
    return len(cells) == 1 and not any(input_checks.is_csv_number(cell) for cell in cells[0])


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
    # A line holding only a byte order mark is blank wherever it is, not only at the start of the object: a
    # Transform mini-batch may begin with one anywhere in the object, and the container (which takes each
    # mini-batch's start for an object's) and the step after the job (which reads the whole object) must agree
    # on which lines are rows.
    three = np.flatnonzero((ends - starts) == len(BOM))
    if len(three):
        at = starts[three]
        only_mark = (arr[at] == BOM[0]) & (arr[at + 1] == BOM[1]) & (arr[at + 2] == BOM[2])
        keep[three[only_mark]] = False
    if file_start and len(ends) and keep[0]:
        first = data[int(starts[0]) : int(ends[0])]
        if first.startswith(BOM):
            rest = first[len(BOM) :]
            starts[0] += len(BOM) + len(rest) - len(rest.lstrip())
            ends[0] = max(int(starts[0]), int(ends[0]) - (len(rest) - len(rest.rstrip())))
            keep[0] = ends[0] > starts[0]
        first_row = data[int(starts[0]) : int(ends[0])]
        if keep[0] and skip_header and media_type == media_types.CSV and is_header(first_row):
            keep[0] = False
            names = tuple(cell.strip(" \t") for cell in codecs.decode_body(first_row, media_types.CSV)[0])
            return Lines(source, media_type, data, starts[keep], ends[keep], numbers[keep], names)
    return Lines(source, media_type, data, starts[keep], ends[keep], numbers[keep])


def object_lines(
    store: Store,
    obj: StoredObject,
    media_type: str,
    progress: Progress,
    *,
    skip_header: bool = True,
    max_record_bytes: int | None = None,
) -> Iterator[Lines | Refused]:
    """The rows of a line-format object, one `Lines` per block read."""
    return block_lines(
        store.blocks(obj.key), obj.key, media_type, progress, skip_header=skip_header, max_record_bytes=max_record_bytes
    )


@overload
def block_lines(
    blocks: Iterable[bytes], key: str, media_type: str, progress: Progress, *, skip_header: bool = True
) -> Iterator[Lines]: ...


@overload
def block_lines(
    blocks: Iterable[bytes],
    key: str,
    media_type: str,
    progress: Progress,
    *,
    skip_header: bool = True,
    max_record_bytes: int | None,
) -> Iterator[Lines | Refused]: ...


def block_lines(
    blocks: Iterable[bytes],
    key: str,
    media_type: str,
    progress: Progress,
    *,
    skip_header: bool = True,
    max_record_bytes: int | None = None,
) -> Iterator[Lines | Refused]:
    """The rows of an object given as its blocks, one `Lines` per block. With `max_record_bytes`, a line that
    grows past it before its newline is dropped as it arrives and becomes a `Refused` row: the unfinished line
    held is never more than the limit (plus one block)."""
    pending = b""
    line = 1
    file_start = True
    skipped = 0  # bytes of an over-long line dropped so far; 0 when not inside one
    header: tuple[str, ...] | None = None
    for block in blocks:
        progress.bytes_read += len(block)
        if skipped:
            newline = block.find(b"\n")
            if newline < 0:
                skipped += len(block)
                continue
            skipped += newline
            yield _too_long(key, media_type, line, skipped, max_record_bytes)
            line, skipped, file_start = line + 1, 0, False
            block = block[newline + 1 :]
        data = pending + block if pending else block
        cut = data.rfind(b"\n") + 1
        complete, pending = data[:cut], data[cut:]
        if cut:
            rows = split_lines(key, media_type, complete, line, file_start=file_start, skip_header=skip_header)
            header = rows.header if file_start else header
            line += complete.count(b"\n")
            file_start = False
            if len(rows):
                yield rows if rows.header == header else replace(rows, header=header)
        if max_record_bytes is not None and len(pending) > max_record_bytes:
            skipped, pending = len(pending), b""
    if skipped:
        yield _too_long(key, media_type, line, skipped, max_record_bytes)
    elif pending:
        rows = split_lines(key, media_type, pending, line, file_start=file_start, skip_header=skip_header)
        if len(rows):
            yield rows if file_start or rows.header == header else replace(rows, header=header)


def _too_long(key: str, media_type: str, line: int, size: int, limit: int | None) -> Refused:
    error = record_too_long(size, int(limit or 0))
    return Refused(key, np.array([line], dtype=np.int64), (error,), media_type)
