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
- Every input row ends in exactly one place: a line of its part, or a line of its error part. Each line is
  parsed on its own and must hold exactly one row (a JSON line `[..], [..]` holds two and is an error; a CSV
  line is split only at `\n`, never at `\x1c` or `\u2028`), so no line can shift another's prediction.
  Before the manifest is written, every part and error part is read back and checked: its bytes against its
  sha256, and its (file, line) pairs against the chunk's rows, each exactly once. Error parts and
  `errors.jsonl` left by an earlier run that this run did not write are deleted.
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
from models.errors import InternalError, InvalidInput, ServingError
from models.runtime import Arrays
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


_BOM = b"\xef\xbb\xbf"


def _is_header(raw: bytes) -> bool:
    """A first CSV line none of whose cells is a number names the columns. A line with some numbers is data
    (a bad one is reported as an error row, never skipped as a header)."""
    try:
        cells = codecs.decode_body(raw, codecs.CSV)
    except InvalidInput:
        return False
    return len(cells) == 1 and not any(codecs.is_csv_number(cell) for cell in cells[0])


def read_rows(store: Store, inputs: list[StoredObject], progress: Progress) -> Iterator[Row]:
    """Every non-empty line of every input, numbered from 1 within its file."""
    for obj in inputs:
        media_type = FORMATS[_suffix(obj.key)]
        for number, line in enumerate(store.lines(obj.key), start=1):
            progress.bytes_read += len(line) + 1
            raw = line.strip()
            if number == 1:
                raw = raw.removeprefix(_BOM).strip()
            if not raw or (number == 1 and media_type == codecs.CSV and _is_header(raw)):
                continue
            yield Row(obj.key, number, raw, media_type)


def _suffix(key: str) -> str:
    dot = key.rfind(".")
    return key[dot:].lower() if dot > key.rfind("/") else ""


@dataclass(frozen=True)
class _Parsed:
    row: Row
    payload: Any  # JSON: the row's one instance; CSV: its one row of cells
    booleans: bool


def _parse_line(row: Row) -> _Parsed:
    """One line as exactly one row, or `InvalidInput` saying why not."""
    decoded = codecs.decode_body(row.raw, row.media_type)
    if row.media_type == codecs.CSV:
        if len(decoded) != 1:
            raise InvalidInput(
                f"line holds {len(decoded)} CSV rows; each line is one row",
                field="line",
                value=f"{len(decoded)} rows",
                allowed="one row of comma-separated numbers per line",
            )
        return _Parsed(row, decoded[0], False)
    return _Parsed(row, decoded, codecs.may_hold_booleans(row.raw))


def _combined(parsed: list[_Parsed]) -> Any:
    if parsed[0].row.media_type == codecs.CSV:
        return [p.payload for p in parsed]
    return {"instances": [p.payload for p in parsed]}


def _decode_rows(model: ServedModel, parsed: list[_Parsed]) -> Arrays:
    """The rows as one batch; raises unless it decodes to exactly one array row per input row."""
    arrays = model.decode_payload(
        _combined(parsed), parsed[0].row.media_type, may_hold_booleans=any(p.booleans for p in parsed)
    )
    counts = {int(array.shape[0]) for array in arrays.values()}
    if counts != {len(parsed)}:
        raise InvalidInput(
            f"{len(parsed)} lines decoded to {sorted(counts)} rows; each line must be exactly one row",
            field="line",
            value=sorted(counts),
            allowed="one row per line",
        )
    return arrays


def decode_chunk(
    model: ServedModel, rows: list[Row]
) -> tuple[list[Row], Arrays | None, list[tuple[Row, ServingError]]]:
    """Decode rows of one media type as one batch of exactly `len(good)` rows; each line is parsed on its own,
    and when the batch is refused, rows are decoded one by one to find the bad ones."""
    parsed: list[_Parsed] = []
    bad: list[tuple[Row, ServingError]] = []
    for row in rows:
        try:
            parsed.append(_parse_line(row))
        except ServingError as error:
            bad.append((row, error))
    if not parsed:
        return [], None, bad
    try:
        return [p.row for p in parsed], _decode_rows(model, parsed), bad
    except ServingError:
        pass
    good: list[_Parsed] = []
    for item in parsed:
        try:
            _decode_rows(model, [item])
            good.append(item)
        except ServingError as error:
            bad.append((item.row, error))
    order = {(row.source, row.line): index for index, row in enumerate(rows)}
    bad.sort(key=lambda pair: order[(pair[0].source, pair[0].line)])
    return [p.row for p in good], (_decode_rows(model, good) if good else None), bad


def encode_rows(model: ServedModel, rows: list[Row], arrays: Arrays) -> bytes:
    """One JSON line per row: where it came from, then its response fields (as the online modes answer).
    A response with no field of one value per row is an error, never a part of lines without predictions."""
    fields = model.respond(model.predict(arrays))
    per_row: dict[str, list[Any]] = {}
    for name, value in fields.items():
        listed = value.tolist() if isinstance(value, np.ndarray) else value
        if isinstance(listed, list) and len(listed) == len(rows):
            per_row[SINGULAR.get(name, name)] = listed
    primary = "prediction" if "predictions" in fields else None
    if not per_row or (primary is not None and primary not in per_row):
        raise InternalError(
            f"model {model.manifest.key}: the response to {len(rows)} rows has no field with one value per row",
            field="predictions",
            value=sorted(fields)[:8],
            allowed=f"a list of {len(rows)} values",
        )
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
        existing_errors = {o.key for o in self.store.list(f"{self.output_prefix}errors/")}
        parts: list[dict[str, Any]] = []
        for index, rows in enumerate(self.chunks(inputs)):
            key = self.part_key(index)
            meta = self.store.metadata(key) if key in existing else None
            part: dict[str, Any] | None = None
            if meta is not None and meta.get("run") == run_id:
                part = {"key": self._relative(key), "rows": int(meta["rows"]), "errors": int(meta["errors"])}
                part |= {"bytes": int(meta["bytes"]), "sha256": meta["sha256"]}
                if self._verify(index, rows, part) is None:
                    self.progress.parts_skipped += 1
                else:
                    part = None  # a finished part that no longer checks out is scored again
            if part is None:
                part = self._score(index, rows, run_id)
                problem = self._verify(index, rows, part)
                if problem is not None:
                    raise InternalError(f"part {index}: {problem}; the run stops before reporting success")
            parts.append(part)
            self.progress.rows += len(rows)
            self.progress.errors += part["errors"]
            self.progress.parts_done += 1
            if self.on_progress is not None:
                self.on_progress(self.progress)
        for stale in sorted(existing - {self.part_key(i) for i in range(len(parts))}):
            self.store.delete(stale)
        written_errors = {self.error_key(i) for i, part in enumerate(parts) if part["errors"]}
        for stale in sorted(existing_errors - written_errors):
            self.store.delete(stale)  # error parts of an earlier run with other input
        return self._finish(inputs, parts, run_id)

    def _verify(self, index: int, rows: list[Row], part: dict[str, Any]) -> str | None:
        """Read the stored part and error part back: None when together they hold each of `rows` exactly once
        (predictions with a response field) and the part's bytes match its sha256; else what is wrong."""
        body = self.store.get(self.part_key(index))
        if sha256(body) != part["sha256"] or len(body) != part["bytes"]:
            return "the stored part does not match its sha256"
        expected = {(row.source, row.line) for row in rows}
        seen: set[tuple[str, int]] = set()
        for kind, key, count in (
            ("prediction", self.part_key(index), part["rows"]),
            ("error", self.error_key(index), part["errors"]),
        ):
            raw = body if kind == "prediction" else (self.store.get(key) if count else b"")
            lines = raw.splitlines()
            if len(lines) != count:
                return f"{key} holds {len(lines)} {kind} lines, its count says {count}"
            for line in lines:
                record = orjson.loads(line)
                where = (record.get("file"), record.get("line"))
                if where not in expected or where in seen:
                    return f"{key}: {where} is not a row of this part, or is there twice"
                if kind == "prediction" and len(record) < 3:
                    return f"{key}: {where} has no prediction"
                seen.add(where)
        if seen != expected:
            return f"{len(expected - seen)} rows are in neither the part nor its error part"
        return None

    def _score(self, index: int, rows: list[Row], run_id: str) -> dict[str, Any]:
        out = bytearray()
        errors = bytearray()
        good_rows = 0
        bad_rows = 0
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
            bad_rows += len(bad)
            if good and arrays is not None:
                out += encode_rows(self.model, good, arrays)
                good_rows += len(good)
        if good_rows + bad_rows != len(rows):
            raise InternalError(f"part {index}: {len(rows)} rows in, {good_rows} scored + {bad_rows} errors out")
        body = bytes(out)
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
        if self.progress.rows != sum(p["rows"] + p["errors"] for p in parts):
            raise InternalError(f"{self.progress.rows} rows read, but the parts account for a different number")
        if not failed:
            self.store.delete(f"{self.output_prefix}errors.jsonl")  # an earlier run's, if any
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
