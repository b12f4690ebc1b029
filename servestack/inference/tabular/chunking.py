"""Every input object's rows, in order (`pieces`), and the chunks a batch job scores them in (`chunks`).

A chunk holds at most `chunk_rows` rows and, of Parquet rows (which the reader measures: parquet_reading.py)
or whole files (files.py), at most MAX_CHUNK_DECODED_BYTES decoded or held. Lines need no byte bound of their
own: a line is at most `max_record_bytes`, and a block of them what the store reads at a time. Chunks are cut
the same way on every run of the same input, so a rerun finds its parts where the first run put them.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from servestack.inference.errors import ServingError
from servestack.inference.tabular.files import is_row_format, media_type_of, object_file
from servestack.inference.tabular.parquet_reading import MAX_CHUNK_DECODED_BYTES, object_records
from servestack.inference.tabular.rows import (
    FILE_LINE,
    FORMATS,
    PARQUET,
    Lines,
    Piece,
    Progress,
    Records,
    Refused,
    UnreadableFile,
    object_lines,
    suffix,
)
from servestack.inference.tabular.store import Store, StoredObject


def pieces(
    store: Store,
    inputs: list[StoredObject],
    progress: Progress,
    batch_rows: int,
    *,
    max_record_bytes: int | None = None,
    failed: dict[str, ServingError] | None = None,
) -> Iterator[Piece]:
    """Every object's rows, in order. An object that cannot be read (or stops being readable) becomes one
    `Refused` row, line `FILE_LINE`, saying why (recorded in `failed`), and the next object is read."""
    for obj in inputs:
        media_type = FORMATS.get(suffix(obj.key)) or media_type_of(obj.key)
        rows: Iterator[Piece] = (
            object_records(store, obj, progress, batch_rows)
            if media_type == PARQUET
            else object_file(store, obj, progress)
            if not is_row_format(obj.key)
            else object_lines(store, obj, media_type, progress, max_record_bytes=max_record_bytes)
        )
        try:
            yield from rows
        except UnreadableFile as error:
            if failed is not None:
                failed[obj.key] = error
            yield Refused(obj.key, np.array([FILE_LINE], dtype=np.int64), (error,), media_type)


def chunks(
    source: Iterator[Piece], chunk_rows: int, chunk_bytes: int = MAX_CHUNK_DECODED_BYTES
) -> Iterator[list[Piece]]:
    """Chunks of `chunk_rows` rows, fewer where the measured rows of Parquet pieces would pass `chunk_bytes`
    decoded (the last chunk may hold fewer too); a chunk may span objects. A row is never split from itself:
    one over `chunk_bytes` (which the reader refuses) would be a chunk of its own."""
    chunk: list[Piece] = []
    rows = weight = 0
    for piece in source:
        ends = (
            np.cumsum(piece.row_bytes) if isinstance(piece, Records) and piece.row_bytes is not None
            else np.cumsum(piece.ends - piece.starts) if isinstance(piece, Lines) and piece.whole
            else None
        )  # fmt: skip
        offset = 0
        while offset < len(piece):
            take = min(chunk_rows - rows, len(piece) - offset)
            full = rows + take == chunk_rows
            before = 0
            if ends is not None:
                before = int(ends[offset - 1]) if offset else 0
                fits = int(np.searchsorted(ends[offset : offset + take], before + chunk_bytes - weight, side="right"))
                if fits < take:
                    take, full = (fits if fits or rows else 1), True
            if take:
                chunk.append(piece.cut(offset, offset + take))
                rows += take
                weight += int(ends[offset + take - 1]) - before if ends is not None else 0
                offset += take
            if full:
                yield chunk
                chunk, rows, weight = [], 0, 0
    if chunk:
        yield chunk
