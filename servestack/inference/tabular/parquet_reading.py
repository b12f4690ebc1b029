"""Parquet objects read in bounded batches, bounded by what their rows hold decoded, not by the file's bytes.

A Parquet file can hold far more than its bytes. A dictionary-encoded string is stored once and then repeated by
run-length-encoded indices: a 68 KB file held 300,000 rows of one 2,000-character string, 600 MB decoded. A
run-length-encoded column of numbers grows the same way. Reading it as before, a row group whole with a Python
object per value, took a batch job to 1.7 GB. So:
- the footer, the column count and the column names are checked before anything is read;
- a row group's decoded size is worked out from its metadata before it is read: each column's values times
  their width, byte arrays at their uncompressed size (dictionary and indices). A row group over
  MAX_ROW_GROUP_BYTES decoded is refused (one error record; the file is `failed`);
- rows are read one batch at a time (`iter_batches`, never a row group whole): at most `batch_rows` rows, and
  MAX_CHUNK_DECODED_BYTES decoded on average over the row group;
- string and binary columns are read as dictionaries (`read_dictionary`): a value the file repeats through
  its dictionary is held once, and reaches the model as an object array of references to it
  (servestack/inference/tabular/named.py), never a Python object per row;
- each batch's rows are measured at their decoded size (`decoded_row_bytes`), strings at their length, which
  is what onnxruntime copies them to. A row over MAX_CHUNK_DECODED_BYTES is an error row, and
  servestack/inference/tabular/chunking.py closes a chunk before its rows pass that budget, so the chunk
  being scored decodes to at most that much.
"""

from __future__ import annotations

import math
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from servestack.inference.errors import InvalidInput
from servestack.inference.tabular.arrow_arrays import numbers
from servestack.inference.tabular.rows import PARQUET, Progress, Records, Refused, UnreadableFile
from servestack.inference.tabular.store import Store, StoredObject

MIB = 1024 * 1024
# The footer (parsed whole before any row: a one-row file of 300,000 columns has a 50 MB footer that took
# ~800 MB of memory to parse) and the columns are bounded...
MAX_PARQUET_COLUMNS = 10_000
MAX_PARQUET_FOOTER_BYTES = 16 * MIB
# ...and so is what a row group decodes to, worked out from its metadata (a row with a list of every value of
# its row group is read whole, so this is the most one batch can hold)...
MAX_ROW_GROUP_BYTES = 512 * MIB
# ...and what the rows of one chunk decode to, strings at their length: the budget of the chunk being scored
# (the model's input arrays, and onnxruntime's copy of every string in them). 32 MiB is under 1% of a Fargate
# job's default 4 GiB, and still thousands of ordinary rows (10,000 rows of 30 floats are 1.2 MB).
MAX_CHUNK_DECODED_BYTES = 32 * MIB
# An object up to this size is read from memory, a larger one from a local file: writing the object to a file and
# reading it back cost a one-core job ~0.05 CPU s per million rows of 30 floats (55 MB), and 64 MiB held while
# its rows are read is under 2% of a Fargate job's default 4 GiB.
MAX_IN_MEMORY_BYTES = 64 * MIB
# What a string costs beside its characters once it is a value of an array (a reference, an offset).
_STRING_OVERHEAD = 8
# Bytes per value of the fixed-width physical types (a boolean is a bit in the file, a byte decoded).
_PHYSICAL_BYTES = {"BOOLEAN": 1, "INT32": 4, "INT64": 8, "INT96": 12, "FLOAT": 4, "DOUBLE": 8}


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


def _unreadable(key: str, reason: str, *, value: Any = None, allowed: str | None = None) -> UnreadableFile:
    return UnreadableFile(
        f"{key}: {reason}",
        field="file",
        value=key if value is None else value,
        allowed=allowed or "a Parquet file (or rename it: the suffix decides the format)",
    )


def _footer_bytes(source: Path | bytes) -> int | None:
    """The length of a Parquet file's footer, from its last 8 bytes (`<length, 4 bytes LE>PAR1`); None when the
    file does not end as a Parquet file does."""
    if isinstance(source, bytes):
        if len(source) < 12:
            return None
        tail = source[-8:]
    else:
        with source.open("rb") as handle:
            size = handle.seek(0, 2)
            if size < 12:
                return None
            handle.seek(size - 8)
            tail = handle.read(8)
    if tail[4:] != b"PAR1":
        return None
    return int.from_bytes(tail[:4], "little")


def open_parquet(pq: Any, key: str, source: Path | bytes) -> Any:
    """A ParquetFile (of a local file, or of the object's bytes) whose footer and columns are within the limits,
    its string and binary columns read as dictionaries; or `UnreadableFile`."""
    footer = _footer_bytes(source)
    if footer is None:
        raise _unreadable(key, "not a Parquet file (it does not end with the PAR1 magic; truncated, or another format)")
    if footer > MAX_PARQUET_FOOTER_BYTES:
        raise _unreadable(
            key,
            f"a footer of {footer} bytes (its metadata is parsed whole before any row is read)",
            value=f"{footer} bytes",
            allowed=f"a footer of at most {MAX_PARQUET_FOOTER_BYTES} bytes: fewer columns or row groups per file",
        )
    import pyarrow as pa

    path = pa.BufferReader(source) if isinstance(source, bytes) else source
    try:
        metadata = pq.read_metadata(path)
        if metadata.num_columns > MAX_PARQUET_COLUMNS:
            raise _unreadable(
                key,
                f"{metadata.num_columns} columns",
                value=metadata.num_columns,
                allowed=f"at most {MAX_PARQUET_COLUMNS} columns",
            )
        reader = pq.ParquetFile(path, metadata=metadata, read_dictionary=_byte_array_columns(metadata))
    except UnreadableFile:
        raise
    except Exception as exc:  # pyarrow raises ArrowInvalid / OSError subclasses for a file it cannot read
        raise _unreadable(key, f"not a readable Parquet file ({str(exc)[:200]})") from None
    counts = Counter(reader.schema_arrow.names)  # one pass (a count per name was quadratic in 10,000 columns)
    twice = sorted(name for name, count in counts.items() if count > 1)
    if twice:
        raise _unreadable(
            key,
            f"columns named more than once: {twice[:8]} (which one is the input would be a guess)",
            value=twice[:8],
            allowed="each column name once",
        )
    return reader


def _byte_array_columns(metadata: Any) -> list[str]:
    """The top-level string and binary columns, by name: those pyarrow keeps as dictionaries."""
    columns = (metadata.schema.column(index) for index in range(len(metadata.schema)))
    return [
        column.path
        for column in columns
        if column.physical_type == "BYTE_ARRAY"
        and column.logical_type.type in _DICTIONARY_TYPES
        and column.max_repetition_level == 0
        and "." not in column.path
    ]


_DICTIONARY_TYPES = frozenset({"STRING", "ENUM", "NONE"})  # text and plain binaries, not decimals or JSON


def row_group_bytes(metadata: Any, group: int) -> int:
    """What row group `group` decodes to, from its metadata alone: each leaf column's values times their width;
    byte arrays (read as dictionaries) at their uncompressed size plus an index per value."""
    row_group = metadata.row_group(group)
    total = 0
    for index in range(row_group.num_columns):
        chunk = row_group.column(index)
        width = _PHYSICAL_BYTES.get(chunk.physical_type)
        if width is None and chunk.physical_type == "FIXED_LEN_BYTE_ARRAY":
            width = max(1, int(metadata.schema.column(index).length or 1))
        if width is None:  # BYTE_ARRAY: the dictionary (or the plain values) and an index per value
            total += int(chunk.total_uncompressed_size) + 4 * int(chunk.num_values)
        else:
            total += width * int(chunk.num_values)
    return total


def object_records(store: Store, obj: StoredObject, progress: Progress, batch_rows: int) -> Iterator[Records | Refused]:
    """The rows of a Parquet object, row group by row group, one bounded batch at a time (see the module doc);
    a row over MAX_CHUNK_DECODED_BYTES is a `Refused` row. `UnreadableFile` when the file cannot be read, before
    its first row or after some."""
    pq = parquet_module()
    import pyarrow as pa

    with tempfile.TemporaryDirectory(prefix="servestack-parquet-") as folder:
        source: Path | bytes = Path(folder) / "object.parquet"
        if obj.size <= MAX_IN_MEMORY_BYTES:
            source = store.get(obj.key)
        else:
            store.download(obj.key, Path(folder) / "object.parquet")
        progress.bytes_read += obj.size
        reader = open_parquet(pq, obj.key, source)
        metadata = reader.metadata
        line = 1
        for group in range(metadata.num_row_groups):
            rows, size = metadata.row_group(group).num_rows, row_group_bytes(metadata, group)
            if size > MAX_ROW_GROUP_BYTES:
                raise _unreadable(
                    obj.key,
                    f"row group {group} decodes to {size} bytes",
                    value=f"{size} bytes",
                    allowed=f"row groups that decode to at most {MAX_ROW_GROUP_BYTES} bytes",
                )
            per_batch = max(1, min(batch_rows, MAX_CHUNK_DECODED_BYTES * rows // max(size, 1)))
            # One thread: the job reads on a thread of its own beside inference already, and pyarrow's pool
            # decoding the columns of one batch at once cost ~4x the CPU of one thread on a one-core job.
            batches = reader.iter_batches(batch_size=per_batch, row_groups=[group], use_threads=False)
            while True:
                try:
                    batch = next(batches, None)
                except (pa.ArrowException, OSError) as exc:  # a truncated or corrupt row group
                    raise _unreadable(
                        obj.key, f"row group {group} cannot be read after {line - 1} rows ({str(exc)[:200]})"
                    ) from None
                if batch is None:
                    break
                yield from _measured(obj.key, batch, line)
                line += batch.num_rows


def _measured(key: str, batch: Any, line: int) -> Iterator[Records | Refused]:
    """`batch` (whose first row is line `line`) as Records that carry each row's decoded size, with each row over
    MAX_CHUNK_DECODED_BYTES taken out as a Refused row."""
    sizes = decoded_row_bytes(batch)
    lines = np.arange(line, line + batch.num_rows, dtype=np.int64)
    start = 0
    for row in np.flatnonzero(sizes > MAX_CHUNK_DECODED_BYTES).tolist():
        if row > start:
            yield Records(key, batch.slice(start, row - start), lines[start:row], PARQUET, sizes[start:row])
        yield Refused(key, lines[row : row + 1], (row_too_large(int(sizes[row])),), PARQUET)
        start = row + 1
    if start == 0:
        yield Records(key, batch, lines, PARQUET, sizes)
    elif start < batch.num_rows:
        yield Records(key, batch.slice(start), lines[start:], PARQUET, sizes[start:])


def row_too_large(size: int) -> InvalidInput:
    return InvalidInput(
        f"row: decodes to {size} bytes, over the batch budget of {MAX_CHUNK_DECODED_BYTES} bytes",
        field="row",
        value=f"{size} bytes",
        allowed=f"rows that decode to at most {MAX_CHUNK_DECODED_BYTES} bytes (strings at their length)",
    )


def decoded_row_bytes(batch: Any) -> np.ndarray:
    """Each row's values at their decoded size (int64): fixed-width values at their width, strings and binaries at
    their length (a dictionary's values at theirs, however often repeated), lists as the sum of their values."""
    sizes = np.zeros(batch.num_rows, dtype=np.int64)
    same_in_every_row = 0  # fixed-width columns add one number: summed first, added to the rows once
    for column in batch.columns:
        size = _value_bytes(column)
        if isinstance(size, int):
            same_in_every_row += size
        else:
            sizes += size
    sizes += same_in_every_row
    return sizes


def _value_bytes(array: Any) -> np.ndarray | int:
    """The decoded size of each value of `array`: one int when every value has the same."""
    import pyarrow as pa

    kind = array.type
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):  # the usual case, before pyarrow.compute's import
        return max(1, int(kind.bit_width) // 8)
    import pyarrow.compute as pc

    if pa.types.is_dictionary(kind):
        entries = _value_bytes(array.dictionary)
        if isinstance(entries, int):
            return entries
        if not len(entries):
            return np.zeros(len(array), dtype=np.int64)
        picked: np.ndarray = np.asarray(entries, dtype=np.int64)[_numbers(pc.fill_null(array.indices, 0))]
        return picked
    if any(test(kind) for test in (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary,
                                    pa.types.is_large_binary)):  # fmt: skip
        lengths: np.ndarray = _numbers(pc.fill_null(pc.binary_length(array), 0)) + _STRING_OVERHEAD
        return lengths
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        counts = _numbers(pc.fill_null(pc.list_value_length(array), 0))
        values = _value_bytes(pc.list_flatten(array))
        if isinstance(values, int):
            return counts * values
        totals = np.concatenate(([0], np.cumsum(values)))
        bounds = np.concatenate(([0], np.cumsum(counts)))
        return np.asarray(totals[bounds[1:]] - totals[bounds[:-1]], dtype=np.int64)
    if pa.types.is_struct(kind):
        sizes: np.ndarray | int = 0
        for field in array.flatten():
            sizes = sizes + _value_bytes(field)
        return sizes
    if pa.types.is_boolean(kind) or pa.types.is_null(kind):
        return 1
    bit_width = int(getattr(kind, "bit_width", 0) or 0)
    if bit_width:
        return max(1, bit_width // 8)
    return math.ceil(int(array.nbytes) / max(len(array), 1))  # anything else (maps, unions...): its buffers, shared out


def _numbers(array: Any) -> np.ndarray:
    """An Arrow integer array without nulls as int64."""
    return np.asarray(numbers(array), dtype=np.int64)
