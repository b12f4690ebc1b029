"""`engine: transform`: SageMaker Batch Transform runs the realtime container over the input, and a step after
the job writes the manifest and the error file as the other engines do.

How Transform runs the container (`SplitType: Line`, `BatchStrategy: MultiRecord`, `AssembleWith: Line`):
SageMaker spreads the input objects over the job's instances, cuts each object at newlines into mini-batches
of whole lines up to `MaxPayloadInMB`, sends each to `POST /invocations`, and writes the answers for one object,
in the object's order, to `<output path>/<object key below the input prefix>.out`. It uploads an `.out` only
when every mini-batch of its object succeeded, and fails the job when one did not.

What differs from the Lambda and Fargate engines, and why:
- Record order: rows are in input order within an object, as elsewhere; there are no `parts/part-N` chunks
  across objects: each input object has its `.out` (a part per object), and objects run in any order on any
  instance.
- Error handling: a bad row must not fail its mini-batch (Transform would fail the whole object, then the
  job), so the container answers `{"error": {...}}` on that row's line, with the same error the other
  engines write. The step after the job gathers them into `errors.jsonl` with file and line; a failed job
  (an instance lost, a container crash) has no manifest: the step raises, which the failure alarm counts.
- The line numbers: `.out` holds one line per non-blank input line (the container skips blank lines; a CSV
  header line is answered with an error and dropped by the step), so the step reads each input object again
  to pair every `.out` line with its input line number.
- Format: a job has one content type; `input_format` (jsonl or csv) says which suffixes are input. Transform
  also sends every other object under the input prefix through the container; their `.out` objects are not
  parts and the step deletes them. Parquet cannot be split at lines: Parquet input needs engine fargate.
- Resume: a job that fails is run again whole (a new job, by the next schedule or `local run-batch`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson

from servestack.inference import media_types
from servestack.inference.errors import InternalError, InvalidInput, NoInput, UnsupportedMediaType
from servestack.inference.manifest import Manifest
from servestack.inference.service import ServedModel
from servestack.inference.tabular.decode import decode_piece
from servestack.inference.tabular.encode import json_cells, json_lines, per_row_fields
from servestack.inference.tabular.refused import predict_rows, without_refused
from servestack.inference.tabular.rows import Lines, Progress, block_lines, is_header, split_lines, suffix
from servestack.inference.tabular.store import Store, StoredObject

JSON_LINES = "application/jsonlines"
# The transform job's content type, per input format; and which suffixes are input.
INPUT_FORMATS: dict[str, tuple[str, tuple[str, ...]]] = {
    "jsonl": (JSON_LINES, (".jsonl", ".ndjson", ".json")),
    "csv": (media_types.CSV, (".csv",)),
}
_LINE_TYPES = {JSON_LINES: media_types.JSON, "application/json": media_types.JSON, media_types.CSV: media_types.CSV}
_ERROR_PREFIX = b'{"error":'


def media_type_of(content_type: str | None) -> str:
    """The line format a transform mini-batch is in, from its Content-Type."""
    media_type = media_types.media_type_of(content_type)
    found = _LINE_TYPES.get(media_type)
    if found is None:
        raise UnsupportedMediaType(
            f"Content-Type: {media_type!r} is not a line format of a transform job",
            field="Content-Type",
            value=media_type,
            allowed=", ".join(_LINE_TYPES),
        )
    return found


def score_lines(model: ServedModel, body: bytes, media_type: str) -> bytes:
    """A mini-batch of lines -> one JSON line per non-blank line: the row's response fields, or its error."""
    lines = split_lines("", media_type, body, 1, file_start=True, skip_header=False)
    if not len(lines):
        return b""
    decoded = decode_piece(model, lines)
    answers: list[bytes] = [b""] * len(lines)
    outputs = None
    if decoded.arrays is not None and len(decoded.good):
        outputs, refused = predict_rows(model, decoded.arrays)  # a row the model refuses is that row's error
        decoded = without_refused(decoded, refused)
    if outputs is not None and decoded.arrays is not None:
        fields = per_row_fields(model, model.respond(outputs), len(decoded.good))
        good = json_lines([(name, json_cells(column)) for name, column in fields.items()], len(decoded.good))
        if not decoded.bad:
            return good
        for index, line in zip(decoded.good.tolist(), good.split(b"\n"), strict=False):
            answers[index] = line + b"\n"
    for index, error in decoded.bad:
        answers[index] = orjson.dumps({"error": error.to_dict()}) + b"\n"
    return b"".join(answers)


def out_key(input_key: str, input_prefix: str, output_prefix: str) -> str:
    """Where Transform writes an input object's answers: its key below the input prefix, below the output
    prefix, with `.out` appended."""
    return f"{output_prefix}{input_key.removeprefix(input_prefix)}.out"


def _answered(store: Store, obj: StoredObject, media_type: str, progress: Progress) -> Iterator[np.ndarray]:
    """The line numbers of the lines the container answered, in order; a CSV header's is -1 (not a row)."""
    first = True
    for lines in block_lines(store.blocks(obj.key), obj.key, media_type, progress, skip_header=False):
        numbers = lines.lines.copy()
        if first and media_type == media_types.CSV and numbers[0] == 1 and is_header(lines.raw(0)):
            numbers[0] = -1
        first = False
        yield numbers


class _Hashed:
    """An object's blocks, passed through while their sha256 and size are taken."""

    def __init__(self, blocks: Iterator[bytes]) -> None:
        self.blocks = blocks
        self.digest = hashlib.sha256()
        self.size = 0

    def __iter__(self) -> Iterator[bytes]:
        for block in self.blocks:
            self.digest.update(block)
            self.size += len(block)
            yield block


def _starts_with(lines: Lines, prefix: bytes) -> np.ndarray:
    arr = np.frombuffer(lines.data + b"\0" * len(prefix), dtype=np.uint8)
    expected = np.frombuffer(prefix, dtype=np.uint8)
    found: np.ndarray = np.all(arr[lines.starts[:, None] + np.arange(len(prefix))] == expected, axis=1)
    long_enough: np.ndarray = lines.ends - lines.starts >= len(prefix)
    both: np.ndarray = found & long_enough
    return both


def assemble(
    store: Store,
    model: Manifest,
    *,
    deployment: str,
    input_prefix: str,
    output_prefix: str,
    job: str,
    input_format: str = "jsonl",
) -> dict[str, Any]:
    """After a completed job: pair every `.out` line with its input line, write `errors.jsonl` (file, line,
    error) and `manifest.json`, delete `.out` objects that are not this run's parts. Returns the manifest."""
    if input_format not in INPUT_FORMATS:
        raise InvalidInput(
            f"input_format: {input_format!r} is not one of {', '.join(INPUT_FORMATS)}",
            field="input_format",
            value=input_format,
            allowed=", ".join(INPUT_FORMATS),
        )
    suffixes = INPUT_FORMATS[input_format][1]
    media_type = media_types.CSV if input_format == "csv" else media_types.JSON
    inputs = sorted((o for o in store.list(input_prefix) if suffix(o.key) in suffixes), key=lambda o: o.key)
    if not inputs:  # SageMaker refuses to create a job over an empty prefix; the input left since
        raise NoInput(
            f"no input under {input_prefix}: no object ending in {', '.join(suffixes)}",
            field="input_prefix",
            value=input_prefix,
            allowed=", ".join(suffixes),
        )
    progress = Progress()
    parts: list[dict[str, Any]] = []
    errors = bytearray()
    for obj in inputs:
        key = out_key(obj.key, input_prefix, output_prefix)
        if store.metadata(key) is None:
            raise InternalError(f"{key}: the job wrote no answers for {obj.key}; the run stops before a manifest")
        hashed = _Hashed(store.blocks(key))
        numbers = _answered(store, obj, media_type, progress)
        pending = np.empty(0, dtype=np.int64)
        rows = bad = 0
        for answers in block_lines(hashed, key, media_types.JSON, progress, skip_header=False):
            while len(pending) < len(answers):
                more = next(numbers, None)
                if more is None:
                    raise InternalError(f"{key}: more answers than {obj.key} has lines")
                pending = np.concatenate((pending, more))
            matched, pending = pending[: len(answers)], pending[len(answers) :]
            failed = _starts_with(answers, _ERROR_PREFIX)
            row = matched >= 0
            rows += int(np.count_nonzero(row & ~failed))
            bad += int(np.count_nonzero(row & failed))
            for index in np.flatnonzero(row & failed):
                error = orjson.loads(answers.raw(int(index)))["error"]
                errors += orjson.dumps({"file": obj.key, "line": int(matched[index]), "error": error}) + b"\n"
        if len(pending) or next(numbers, None) is not None:
            raise InternalError(f"{key}: fewer answers than {obj.key} has lines")
        part = {"key": key.removeprefix(output_prefix), "input": obj.key, "rows": rows, "errors": bad}
        parts.append(part | {"bytes": hashed.size, "sha256": hashed.digest.hexdigest()})
    part_keys = {f"{output_prefix}{part['key']}" for part in parts}
    for stale in sorted(o.key for o in store.list(output_prefix) if o.key.endswith(".out") and o.key not in part_keys):
        store.delete(stale)  # answers for objects that are not input (a README), or of an earlier run's input
    error_file: dict[str, Any] | None = None
    failed_rows = sum(part["errors"] for part in parts)
    if failed_rows:
        body = bytes(errors)
        store.put(f"{output_prefix}errors.jsonl", body, {"run": job})
        error_file = {
            "key": "errors.jsonl",
            "rows": failed_rows,
            "bytes": len(body),
            "sha256": hashlib.sha256(body).hexdigest(),
        }
    else:
        store.delete(f"{output_prefix}errors.jsonl")
    succeeded = sum(part["rows"] for part in parts)
    document = {
        "deployment": deployment,
        "engine": "transform",
        "model": {"name": model.name, "version": model.version, "sha256": model.sha256},
        "run": job,
        "input_format": input_format,
        "inputs": [{"key": o.key, "bytes": o.size, "etag": o.etag} for o in inputs],
        "rows": {"total": succeeded + failed_rows, "succeeded": succeeded, "failed": failed_rows},
        "parts": parts,
        "errors": error_file,
    }
    body = orjson.dumps(document, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"
    store.put(f"{output_prefix}manifests/{job}.json", body, {"run": job})  # one per run, kept
    store.put(f"{output_prefix}manifest.json", body, {"run": job})  # the latest, at a fixed name
    return document
