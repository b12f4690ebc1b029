"""Batch scoring of row files (JSON Lines, CSV) in bounded chunks, in parts that make a run resumable.

Transport-free: rows come from, and parts go to, a `Store` (S3 in handlers/batch.py, a folder in tests).
- Input: every `*.jsonl|*.ndjson|*.json` (one instance per line, as in `{"instances": [...]}`) and `*.csv`
  (one row per line; a first line that is not numeric is a header) object under the input prefix, in key
  order. Memory stays bounded: at most one chunk of `chunk_rows` rows is held at a time.
- Output: part `i` holds the predictions for input rows `[i*chunk_rows, (i+1)*chunk_rows)`, one JSON line
  per good row (`file`, `line`, then the response fields). A part is written whole (one PUT), so an
  existing part with this run's fingerprint is finished and a rerun skips it. Bad rows go to
  `errors/part-i.jsonl` (file, line, error) before their part, and are gathered into `errors.jsonl` at the
  end; `strict=True` stops at the first bad row instead. `manifest.json` is written last: row counts, model
  name/version/sha256, each input and part with its sha256. Nothing in the output depends on time, so an
  interrupted run plus a rerun is byte-identical to one uninterrupted run.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import orjson

from models import codecs
from models.errors import InvalidInput, ServingError
from models.service import ServedModel

FORMATS = {".jsonl": codecs.JSON, ".ndjson": codecs.JSON, ".json": codecs.JSON, ".csv": codecs.CSV}
SINGULAR = {"predictions": "prediction", "labels": "label"}


@dataclass(frozen=True)
class StoredObject:
    key: str
    size: int
    etag: str


class Store(Protocol):
    """Where a batch job reads rows and writes parts (an S3 bucket, a folder)."""

    def list(self, prefix: str) -> list[StoredObject]: ...

    def lines(self, key: str) -> Iterator[bytes]: ...

    def get(self, key: str) -> bytes: ...

    def metadata(self, key: str) -> dict[str, str] | None: ...

    def put(self, key: str, body: bytes, metadata: dict[str, str]) -> None: ...

    def delete(self, key: str) -> None: ...


@dataclass(frozen=True)
class Row:
    source: str
    line: int
    raw: bytes
    media_type: str


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


def _is_header(raw: bytes) -> bool:
    for cell in raw.split(b","):
        try:
            float(cell)
        except ValueError:
            return True
    return False


def read_rows(store: Store, inputs: list[StoredObject], progress: Progress) -> Iterator[Row]:
    """Every non-empty line of every input, numbered from 1 within its file."""
    for obj in inputs:
        media_type = FORMATS[_suffix(obj.key)]
        for number, line in enumerate(store.lines(obj.key), start=1):
            progress.bytes_read += len(line) + 1
            raw = line.strip()
            if not raw or (number == 1 and media_type == codecs.CSV and _is_header(raw)):
                continue
            yield Row(obj.key, number, raw, media_type)


def _suffix(key: str) -> str:
    dot = key.rfind(".")
    return key[dot:].lower() if dot > key.rfind("/") else ""


def _body(rows: list[Row]) -> bytes:
    if rows[0].media_type == codecs.CSV:
        return b"\n".join(r.raw for r in rows)
    return b'{"instances":[' + b",".join(r.raw for r in rows) + b"]}"


def decode_chunk(model: ServedModel, rows: list[Row]) -> tuple[list[Row], Any, list[tuple[Row, ServingError]]]:
    """Decode rows of one media type as one batch; only when that fails, row by row to find the bad ones."""
    try:
        return rows, model.decode(_body(rows), rows[0].media_type), []
    except InvalidInput:
        pass
    good: list[Row] = []
    bad: list[tuple[Row, ServingError]] = []
    for row in rows:
        try:
            model.decode(_body([row]), row.media_type)
            good.append(row)
        except ServingError as error:
            bad.append((row, error))
    return good, (model.decode(_body(good), good[0].media_type) if good else None), bad


def encode_rows(model: ServedModel, rows: list[Row], arrays: Any) -> bytes:
    """One JSON line per row: where it came from, then its response fields (as the online modes answer)."""
    fields = model.respond(model.predict(arrays))
    per_row: dict[str, list[Any]] = {}
    for name, value in fields.items():
        listed = value.tolist() if isinstance(value, np.ndarray) else value
        if isinstance(listed, list) and len(listed) == len(rows):
            per_row[SINGULAR.get(name, name)] = listed
    names = list(per_row)
    columns = [per_row[n] for n in names]
    out = bytearray()
    for index, row in enumerate(rows):
        record = {"file": row.source, "line": row.line}
        for name, column in zip(names, columns, strict=True):
            record[name] = column[index]
        out += orjson.dumps(record)
        out += b"\n"
    return bytes(out)


def _error_line(row: Row, error: ServingError) -> bytes:
    return orjson.dumps({"file": row.source, "line": row.line, "error": error.to_dict()}) + b"\n"


def sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


@dataclass
class BatchJob:
    """Score everything under `input_prefix` into `output_prefix` of `store`. `run()` returns the manifest."""

    store: Store
    model: ServedModel
    input_prefix: str
    output_prefix: str
    deployment: str = ""
    chunk_rows: int = 10_000
    strict: bool = False
    on_progress: Callable[[Progress], None] | None = None
    progress: Progress = field(default_factory=Progress)

    def part_key(self, index: int) -> str:
        return f"{self.output_prefix}parts/part-{index:05d}.jsonl"

    def error_key(self, index: int) -> str:
        return f"{self.output_prefix}errors/part-{index:05d}.jsonl"

    def _relative(self, key: str) -> str:
        """Keys in the manifest are relative to it, so output moved elsewhere stays byte-identical."""
        return key.removeprefix(self.output_prefix)

    def inputs(self) -> list[StoredObject]:
        found = [o for o in self.store.list(self.input_prefix) if _suffix(o.key) in FORMATS]
        return sorted(found, key=lambda o: o.key)

    def fingerprint(self, inputs: list[StoredObject]) -> str:
        """What a finished part must have been computed from for a rerun to reuse it."""
        described = {
            "inputs": [[o.key, o.size, o.etag] for o in inputs],
            "model": [self.model.manifest.name, self.model.manifest.version, self.model.manifest.sha256],
            "chunk_rows": self.chunk_rows,
            "strict": self.strict,
        }
        return sha256(orjson.dumps(described, option=orjson.OPT_SORT_KEYS))[:32]

    def chunks(self, inputs: list[StoredObject]) -> Iterator[list[Row]]:
        chunk: list[Row] = []
        for row in read_rows(self.store, inputs, self.progress):
            chunk.append(row)
            if len(chunk) == self.chunk_rows:
                yield chunk
                chunk = []
        if chunk:
            yield chunk

    def run(self) -> dict[str, Any]:
        inputs = self.inputs()
        if not inputs:
            raise InvalidInput(
                f"no input under {self.input_prefix}",
                field="input_prefix",
                value=self.input_prefix,
                allowed=f"objects ending in {', '.join(FORMATS)}",
            )
        self.progress.total_bytes = sum(o.size for o in inputs)
        run_id = self.fingerprint(inputs)
        existing = {o.key for o in self.store.list(f"{self.output_prefix}parts/")}
        parts: list[dict[str, Any]] = []
        for index, rows in enumerate(self.chunks(inputs)):
            key = self.part_key(index)
            meta = self.store.metadata(key) if key in existing else None
            if meta is not None and meta.get("run") == run_id:
                part: dict[str, Any] = {
                    "key": self._relative(key),
                    "rows": int(meta["rows"]),
                    "errors": int(meta["errors"]),
                }
                part |= {"bytes": int(meta["bytes"]), "sha256": meta["sha256"]}
                self.progress.parts_skipped += 1
            else:
                part = self._score(index, rows, run_id)
            parts.append(part)
            self.progress.rows += len(rows)
            self.progress.errors += part["errors"]
            self.progress.parts_done += 1
            if self.on_progress is not None:
                self.on_progress(self.progress)
        for stale in sorted(existing - {self.part_key(i) for i in range(len(parts))}):
            self.store.delete(stale)
        return self._finish(inputs, parts, run_id)

    def _score(self, index: int, rows: list[Row], run_id: str) -> dict[str, Any]:
        out = bytearray()
        errors = bytearray()
        good_rows = 0
        for group in _by_media_type(rows):
            good, arrays, bad = decode_chunk(self.model, group)
            if bad and self.strict:
                row, error = bad[0]
                raise InvalidInput(
                    f"{row.source}:{row.line}: {error.message} (strict: stopping at the first bad row)",
                    field=f"{row.source}:{row.line}",
                    allowed=error.allowed,
                )
            for row, error in bad:
                errors += _error_line(row, error)
            if good:
                out += encode_rows(self.model, good, arrays)
                good_rows += len(good)
        body = bytes(out)
        bad_rows = len(rows) - good_rows
        if errors:
            self.store.put(self.error_key(index), bytes(errors), {"run": run_id})
        else:
            self.store.delete(self.error_key(index))
        digest = sha256(body)
        meta = {"run": run_id, "rows": str(good_rows), "errors": str(bad_rows), "bytes": str(len(body))}
        self.store.put(self.part_key(index), body, meta | {"sha256": digest})
        return {
            "key": self._relative(self.part_key(index)),
            "rows": good_rows,
            "errors": bad_rows,
            "bytes": len(body),
            "sha256": digest,
        }

    def _finish(self, inputs: list[StoredObject], parts: list[dict[str, Any]], run_id: str) -> dict[str, Any]:
        error_file: dict[str, Any] | None = None
        failed = sum(p["errors"] for p in parts)
        if failed:
            gathered = b"".join(self.store.get(self.error_key(i)) for i, p in enumerate(parts) if p["errors"])
            key = f"{self.output_prefix}errors.jsonl"
            self.store.put(key, gathered, {"run": run_id})
            error_file = {
                "key": self._relative(key),
                "rows": failed,
                "bytes": len(gathered),
                "sha256": sha256(gathered),
            }
        manifest = self.model.manifest
        document = {
            "deployment": self.deployment,
            "model": {"name": manifest.name, "version": manifest.version, "sha256": manifest.sha256},
            "run": run_id,
            "chunk_rows": self.chunk_rows,
            "strict": self.strict,
            "inputs": [{"key": o.key, "bytes": o.size, "etag": o.etag} for o in inputs],
            "rows": {"total": sum(p["rows"] + p["errors"] for p in parts), "succeeded": sum(p["rows"] for p in parts)}
            | {"failed": failed},
            "parts": parts,
            "errors": error_file,
        }
        body = orjson.dumps(document, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"
        self.store.put(f"{self.output_prefix}manifest.json", body, {"run": run_id})
        return document


def _by_media_type(rows: list[Row]) -> Iterator[list[Row]]:
    """Consecutive runs of rows with one media type (a part can span a JSONL and a CSV file)."""
    start = 0
    for index in range(1, len(rows) + 1):
        if index == len(rows) or rows[index].media_type != rows[start].media_type:
            yield rows[start:index]
            start = index
