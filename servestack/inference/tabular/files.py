"""Binary input files: an image, audio, raw bytes, text... under a batch job's input prefix, one record each.

A model that reads bodies no codec reads (a `preprocess` hook, a declared image input, a tokenizer:
`ServedModel.reads_raw_bodies`) reads every object under the prefix, not only the row formats (JSON Lines, CSV,
Parquet: rows.py). Any other object is one record: its bytes go to the model as one request does online, with the
media type its name suggests (`media_types.guessed_type`: `.png` -> `image/png`, `.wav` -> `audio/x-wav`, unknown
-> `application/octet-stream`), and its prediction is one output row whose `file` is the object's key (its id) and
`line` 1. So every file is accounted for: scored, or an error row with the reason (the hook refused it, it gave
other than one row, it is over the size limit). A model that reads no such body has no reader for these objects,
and the job leaves them out as it always did.

A file is held whole while its chunk is scored: one over `MAX_FILE_BYTES` is an error record (line 0, the
file's outcome `failed`) whose bytes are never read, and chunks of files are cut at that many bytes
(chunking.py), so a chunk of files holds what a chunk of Parquet rows may.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from servestack.inference import media_types
from servestack.inference.errors import InvalidInput, ServingError
from servestack.inference.runtime import Arrays
from servestack.inference.service import ServedModel
from servestack.inference.tabular.joining import join
from servestack.inference.tabular.parquet_reading import MAX_CHUNK_DECODED_BYTES
from servestack.inference.tabular.rows import FORMATS, Lines, Progress, Refused, UnreadableFile, suffix
from servestack.inference.tabular.store import Store, StoredObject

MAX_FILE_BYTES = MAX_CHUNK_DECODED_BYTES
FILE_ROW = 1  # a file's one record: its `line` in the output


def is_row_format(key: str) -> bool:
    """Whether the object holds rows (JSON Lines, CSV, Parquet) rather than being one record of its own."""
    return suffix(key) in FORMATS


def media_type_of(key: str) -> str:
    """The media type a record of a file is handed to the hook with."""
    return media_types.guessed_type(key.rsplit("/", 1)[-1])


def object_file(store: Store, obj: StoredObject, progress: Progress) -> Iterator[Lines | Refused]:
    """The object as one record, or `UnreadableFile` (line 0) when it is over `MAX_FILE_BYTES`."""
    media_type = media_type_of(obj.key)
    if obj.size > MAX_FILE_BYTES:
        raise UnreadableFile(
            f"{obj.key}: {obj.size} bytes, over the limit of {MAX_FILE_BYTES} bytes for a file read whole",
            field="file",
            value=f"{obj.size} bytes",
            allowed=f"files of at most {MAX_FILE_BYTES} bytes",
        )
    data = b"".join(store.blocks(obj.key))
    progress.bytes_read += len(data)
    one = np.array([0], dtype=np.int64)
    yield Lines(
        obj.key, media_type, data, one, np.array([len(data)], np.int64), np.array([FILE_ROW], np.int64), whole=True
    )


def decode_files(model: ServedModel, piece: Lines) -> tuple[np.ndarray, Arrays | None, list[tuple[int, ServingError]]]:
    """Each file of the piece through the model's decoding (its hook), as one request: (good row indices,
    their arrays joined, the bad rows with their reasons). A file must give exactly one row: its record."""
    decoded: list[tuple[int, Arrays]] = []
    bad: list[tuple[int, ServingError]] = []
    for index in range(len(piece)):
        try:
            arrays = model.decode(piece.raw(index), piece.media_type)
        except ServingError as error:
            bad.append((index, error))
            continue
        rows = {int(array.shape[0]) for array in arrays.values()}
        if rows != {1}:
            bad.append((index, _not_one_row(model, sorted(rows))))
            continue
        decoded.append((index, arrays))
    joined, refused = join(model.manifest, [arrays for _, arrays in decoded])
    unfit = {position for position, _ in refused}
    bad += [(decoded[position][0], error) for position, error in refused]
    bad.sort(key=lambda pair: pair[0])
    good = np.array([index for position, (index, _) in enumerate(decoded) if position not in unfit], dtype=np.int64)
    return good, joined, bad


def _not_one_row(model: ServedModel, rows: list[int]) -> InvalidInput:
    return InvalidInput(
        f"model {model.key}: preprocess made {rows} rows of one file; a file is one record of a batch job, "
        f"its prediction one output row",
        field="file",
        value=rows,
        allowed="one row per file",
    )
