"""`BatchJob`: every input object under a prefix, scored into parts under another, resumable, with a manifest.

Three stages overlap: a reader thread fetches objects and cuts them into chunks of rows, the calling thread
decodes and scores a chunk, and a writer thread checks the earlier chunks' parts and stores them, up to
`_UPLOADS` at once, recording them in order. On one core this hides the store's latency; with more, parsing
(pyarrow), inference (onnxruntime) and the store's I/O run at once, as each releases the GIL. At most `DEPTH`
chunks wait between two stages (servestack/inference/tabular/stages.py) and `_UPLOADS` are being stored, so memory
stays a few chunks whatever the input's size.
"""

from __future__ import annotations

import hashlib
import time
from collections import deque
from collections.abc import Callable, Generator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import orjson

from servestack.inference.errors import InternalError, InvalidInput, NoInput, ServingError
from servestack.inference.runtime import Arrays
from servestack.inference.service import ServedModel
from servestack.inference.tabular.chunking import chunks, pieces
from servestack.inference.tabular.decode import Decoded, decode_piece
from servestack.inference.tabular.encode import (
    batch_fields,
    error_line,
    json_keys,
    located_lines,
    named_fields,
    parquet_bytes,
    parquet_keys,
    parquet_table,
)
from servestack.inference.tabular.joining import join
from servestack.inference.tabular.parquet_reading import parquet_module
from servestack.inference.tabular.refused import predict_rows, refused_by_piece
from servestack.inference.tabular.rows import FILE_LINE, FORMATS, MAX_RECORD_BYTES, PARQUET, Piece, Progress, suffix
from servestack.inference.tabular.stages import Writer, prefetched
from servestack.inference.tabular.store import Store, StoredObject

OUTPUT_FORMATS = ("jsonl", "parquet")
# Bumped when the bytes of a part change for the same input: a part written by another version is scored
# again rather than reused. 2: floats in their shortest form (float32 as float32), columnar encoding. 3: Parquet
# parts dictionary-encode only their string columns, and are compressed with snappy rather than zstd. 4: string
# predictions and ids are typed Parquet columns; `label` is left out where it repeats `prediction`. 5: a Parquet
# part's `label` is an Arrow dictionary column (its Arrow schema says so; the Parquet column is the same strings),
# and its integer columns (`line`, class indices) are delta-encoded.
PART_FORMAT = 5
# Parts being stored at once. A PUT is mostly waiting on the store (S3: tens of ms), so one at a time would
# make the store's latency, not the job's CPU, set the pace; a few in flight hide it. Parts are still recorded
# (manifest order, progress) in order.
_UPLOADS = 4
INPUT_SUFFIXES: dict[str, tuple[str, ...]] = {
    "jsonl": (".jsonl", ".ndjson", ".json"),
    "csv": (".csv",),
    "parquet": (".parquet",),
}

# The fields of an output row besides the model's own: an id column may not take one of their names.
RESERVED_FIELDS = ("file", "line", "error", "prediction", "label", "probabilities")

T = TypeVar("T")


def sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


@dataclass
class ScoredPart:
    index: int
    rows: int
    sources: list[str]
    expected: np.ndarray  # the chunk's rows as keys: source index << 40 | line
    body: bytes
    errors: bytes
    good: int
    bad: int


def _keys(which: np.ndarray, lines: np.ndarray) -> np.ndarray:
    return (which.astype(np.int64) << 40) | lines.astype(np.int64)


@dataclass
class BatchJob:
    """Score everything under `input_prefix` into `output_prefix` of `store`. `run()` returns the manifest.

    `on_progress` is called once per part, in order, from the writer thread, after the part is checked and
    stored; an exception it raises stops the run and is raised by `run()` (the parts already being stored, at
    most `_UPLOADS`, may still land: a rerun reuses them as it reuses the others)."""

    store: Store
    model: ServedModel
    input_prefix: str
    output_prefix: str
    deployment: str = ""
    chunk_rows: int = 10_000
    strict: bool = False
    output_format: str = "jsonl"
    input_format: str | None = None  # jsonl, csv or parquet: only objects of that format; None: every format
    on_progress: Callable[[Progress], None] | None = None
    progress: Progress = field(default_factory=Progress)
    max_record_bytes: int = MAX_RECORD_BYTES  # a longer line is an error row (rows.py says why this default)
    # A column of the input the model does not take, copied to each output row (models with named columns).
    id_column: str | None = None
    # Objects that could not be read (wholly, or past some row), by key: filled by the reader as it meets them.
    failed_inputs: dict[str, ServingError] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.input_format is not None and self.input_format not in INPUT_SUFFIXES:
            raise InvalidInput(
                f"input_format: {self.input_format!r} is not one of {', '.join(INPUT_SUFFIXES)}",
                field="input_format",
                value=self.input_format,
                allowed=", ".join(INPUT_SUFFIXES),
            )
        if self.max_record_bytes < 1:
            raise InvalidInput(
                f"max_record_bytes: {self.max_record_bytes} is not a size",
                field="max_record_bytes",
                value=self.max_record_bytes,
                allowed="a positive number of bytes",
            )
        if self.id_column is not None and (self.id_column in RESERVED_FIELDS or self.id_column.startswith("proba_")):
            raise InvalidInput(
                f"id_column: {self.id_column!r} is the name of a field every output row has",
                field="id_column",
                value=self.id_column,
                allowed=f"a column name other than {', '.join(RESERVED_FIELDS)} and proba_<label>",
            )
        if self.output_format not in OUTPUT_FORMATS:
            raise InvalidInput(
                f"output_format: {self.output_format!r} is not one of {', '.join(OUTPUT_FORMATS)}",
                field="output_format",
                value=self.output_format,
                allowed=", ".join(OUTPUT_FORMATS),
            )

    def part_key(self, index: int) -> str:
        return f"{self.output_prefix}parts/part-{index:05d}.{self.output_format}"

    def error_key(self, index: int) -> str:
        return f"{self.output_prefix}errors/part-{index:05d}.jsonl"

    def _relative(self, key: str) -> str:
        """Keys in the manifest are relative to it, so output moved elsewhere stays byte-identical."""
        return key.removeprefix(self.output_prefix)

    def reads_files(self) -> bool:
        """Whether every object under the prefix is input, the ones of no row format each one record for the
        model to read as it reads such a body online (files.py: its `preprocess` hook, its declared image input,
        its tokenizer); else only the row formats are."""
        return self.input_format is None and self.model.reads_raw_bodies

    def inputs(self) -> list[StoredObject]:
        wanted = FORMATS if self.input_format is None else INPUT_SUFFIXES[self.input_format]
        files = self.reads_files()
        found = [
            o
            for o in self.store.list(self.input_prefix)
            if (suffix(o.key) in wanted or (files and not o.key.endswith("/")))  # `x/`: a console's folder marker
            and not (self.output_prefix and o.key.startswith(self.output_prefix))  # never this job's own output
        ]
        return sorted(found, key=lambda o: o.key)

    def fingerprint(self, inputs: list[StoredObject]) -> str:
        """What a finished part must have been computed from for a rerun to reuse it."""
        described = {
            "inputs": [[o.key, o.size, o.etag] for o in inputs],
            "model": [self.model.manifest.name, self.model.manifest.version, self.model.manifest.sha256],
            "chunk_rows": self.chunk_rows,
            "strict": self.strict,
            "output": [self.output_format, PART_FORMAT],
            "max_record_bytes": self.max_record_bytes,
            "id_column": self.id_column,
        }
        return sha256(orjson.dumps(described, option=orjson.OPT_SORT_KEYS))[:32]

    # ------------------------------------------------------------------------------------ the run
    def run(self) -> dict[str, Any]:
        inputs = self.inputs()
        if not inputs:
            wanted = FORMATS if self.input_format is None else INPUT_SUFFIXES[self.input_format]
            ending = "" if self.reads_files() else f" ending in {', '.join(wanted)}"
            raise NoInput(
                f"no input under {self.input_prefix}: no object{ending}",
                field="input_prefix",
                value=self.input_prefix,
                allowed=f"objects{ending}",
            )
        if self.output_format == "parquet" or any(FORMATS.get(suffix(o.key)) == PARQUET for o in inputs):
            parquet_module()  # no pyarrow here: say so before anything is read
        self.progress.total_bytes = sum(o.size for o in inputs)
        run_id = self.fingerprint(inputs)
        existing = {o.key for o in self.store.list(f"{self.output_prefix}parts/")}
        existing_errors = {o.key for o in self.store.list(f"{self.output_prefix}errors/")}
        self.progress.started = time.perf_counter()  # rows/s of the run, not of loading the model before it
        self.progress.started_cpu = time.process_time()  # the start-up's CPU (bench/batch_job.py reports it)
        parts: list[dict[str, Any]] = []
        uploads = ThreadPoolExecutor(max_workers=_UPLOADS, thread_name_prefix="batch-upload")
        in_flight: deque[Future[tuple[dict[str, Any], int]]] = deque()

        def settle(limit: int) -> None:
            """Record finished parts, oldest first, until at most `limit` are in flight."""
            while len(in_flight) > limit:
                part, rows = in_flight.popleft().result()
                self._record(part, rows, parts)

        def store(item: tuple[ScoredPart | None, dict[str, Any] | None]) -> None:
            in_flight.append(uploads.submit(self._store_part, item, run_id))
            settle(_UPLOADS)

        writer: Writer[tuple[ScoredPart | None, dict[str, Any] | None]] = Writer(store, last=lambda: settle(0))
        reader: Generator[list[Piece], None, None] = prefetched(
            chunks(
                pieces(
                    self.store,
                    inputs,
                    self.progress,
                    self.chunk_rows,
                    max_record_bytes=self.max_record_bytes,
                    failed=self.failed_inputs,
                ),
                self.chunk_rows,
            )
        )
        try:
            for index, chunk in enumerate(reader):
                writer.check()
                reused = self._reusable(index, chunk, run_id, existing)
                if reused is not None:
                    writer.submit((None, reused))
                else:
                    writer.submit((self._score(index, chunk), None))
            writer.finish()
        except BaseException:
            writer.abandon()
            raise
        finally:
            reader.close()  # stops the reader thread now, not when the traceback lets go of this frame
            uploads.shutdown(wait=True, cancel_futures=True)
        for stale in sorted(existing - {self.part_key(i) for i in range(len(parts))}):
            self.store.delete(stale)
        written_errors = {self.error_key(i) for i, part in enumerate(parts) if part["errors"]}
        for stale in sorted(existing_errors - written_errors):
            self.store.delete(stale)  # error parts of an earlier run with other input
        return self._finish(inputs, parts, run_id)

    def _reusable(self, index: int, chunk: list[Piece], run_id: str, existing: set[str]) -> dict[str, Any] | None:
        """A finished part of this run's fingerprint that still checks out, else None (score it again)."""
        key = self.part_key(index)
        meta = self.store.metadata(key) if key in existing else None
        if meta is None or meta.get("run") != run_id:
            return None
        part = {"key": self._relative(key), "rows": int(meta["rows"]), "errors": int(meta["errors"])}
        part |= {"bytes": int(meta["bytes"]), "sha256": meta["sha256"]}
        sources, expected = _expected(chunk)
        if self._verify(index, sources, expected, part) is not None:
            return None
        self.progress.parts_skipped += 1
        return part | {"_rows": sum(len(piece) for piece in chunk)}

    def _score(self, index: int, chunk: list[Piece]) -> ScoredPart:
        """Decode every piece, predict the good rows of the chunk at once, encode the part and its error part.
        A row the model refuses (refused.py) becomes an error row like one that did not decode."""
        sources, expected = _expected(chunk)
        decoded: list[Decoded] = []
        for piece in chunk:
            result = decode_piece(self.model, piece, self.max_record_bytes, self.id_column)
            if result.bad and self.strict:
                raise _strict_stop(piece, result)
            decoded.append(result)
        batch, decoded = _chunk_batch(self.model, decoded)
        outputs = None
        if batch is not None:
            outputs, refused = predict_rows(self.model, batch)
            if refused:
                decoded = refused_by_piece(decoded, refused)
        errors = bytearray()
        for piece, result in zip(chunk, decoded, strict=True):
            if result.bad and self.strict:
                raise _strict_stop(piece, result)
            for row, error in result.bad:
                errors += error_line(piece.source, int(piece.lines[row]), error)
        good = sum(len(result.good) for result in decoded)
        bad = sum(len(result.bad) for result in decoded)
        rows = sum(len(piece) for piece in chunk)
        if good + bad != rows:
            raise InternalError(f"part {index}: {rows} rows in, {good} scored + {bad} errors out")
        body = self._encode(chunk, decoded, sources, good, outputs)
        return ScoredPart(index, rows, sources, expected, body, bytes(errors), good, bad)

    def _encode(
        self, chunk: list[Piece], decoded: list[Decoded], sources: list[str], good: int, outputs: Arrays | None
    ) -> bytes:
        """The part's bytes: each good row's location and its fields from `outputs`, the predictions of the
        chunk's good rows in order."""
        scored = [(piece, result) for piece, result in zip(chunk, decoded, strict=True) if result.arrays is not None]
        position = {source: i for i, source in enumerate(sources)}
        lines = np.concatenate([piece.lines[r.good] for piece, r in scored]) if scored else np.empty(0, np.int64)
        which = (
            np.concatenate([np.full(len(r.good), position[piece.source], np.int64) for piece, r in scored])
            if scored
            else np.empty(0, np.int64)
        )
        fields: dict[str, Any] = {}
        if scored and outputs is not None:
            fields = named_fields(self.model, batch_fields(self.model, outputs, good))
            if self.id_column is not None:
                ids = [value for _, r in scored for value in (r.ids or [])]
                fields = {self.id_column: ids} | {k: v for k, v in fields.items() if k != self.id_column}
        if self.output_format == "parquet":
            return parquet_bytes([parquet_table(sources, which, lines, fields)])
        encoded_sources = [orjson.dumps(source) for source in sources]
        return located_lines([encoded_sources[i] for i in which.tolist()], lines, fields)

    def _store_part(
        self, item: tuple[ScoredPart | None, dict[str, Any] | None], run_id: str
    ) -> tuple[dict[str, Any], int]:
        """An upload thread's work: check a scored part, then store it (its error part first); or take a reused
        one. Returns the part's manifest entry and the input rows it covers.

        The part is checked before it is stored, from the very bytes stored: its records against the chunk's
        rows, and the stored object against those bytes by their sha256, which the store is given with them
        (S3 refuses a PUT whose body does not match, `BadDigest`). Reading each part back would cost a GET and
        a second hash per part on the job's one core, and prove nothing more."""
        scored, reused = item
        if reused is not None:
            rows = reused.pop("_rows")
            return reused, int(rows)
        assert scored is not None
        digest = sha256(scored.body)
        part = {
            "key": self._relative(self.part_key(scored.index)),
            "rows": scored.good,
            "errors": scored.bad,
            "bytes": len(scored.body),
            "sha256": digest,
        }
        problem = self._check(scored.index, scored.sources, scored.expected, part, scored.body, scored.errors)
        if problem is not None:
            raise InternalError(f"part {scored.index}: {problem}; the run stops before reporting success")
        if scored.errors:
            self.store.put(self.error_key(scored.index), scored.errors, {"run": run_id})
        meta = {"run": run_id, "rows": str(scored.good), "errors": str(scored.bad), "bytes": str(len(scored.body))}
        self.store.put(self.part_key(scored.index), scored.body, meta | {"sha256": digest}, sha256=digest)
        return part, scored.rows

    def _record(self, part: dict[str, Any], rows: int, parts: list[dict[str, Any]]) -> None:
        """A stored part, in the order of the parts: into the manifest's list and the progress."""
        parts.append(part)
        self.progress.rows += rows
        self.progress.errors += part["errors"]
        self.progress.parts_done += 1
        if self.on_progress is not None:
            self.on_progress(self.progress)

    def _verify(self, index: int, sources: list[str], expected: np.ndarray, part: dict[str, Any]) -> str | None:
        """Read a stored part and its error part back (a part an earlier run left, before it is reused): None
        when they pass `_check`, else what is wrong."""
        body = self.store.get(self.part_key(index))
        errors = self.store.get(self.error_key(index)) if part["errors"] else b""
        if sha256(body) != part["sha256"]:
            return "the stored part does not match its sha256"
        return self._check(index, sources, expected, part, body, errors)

    def _check(
        self, index: int, sources: list[str], expected: np.ndarray, part: dict[str, Any], body: bytes, errors: bytes
    ) -> str | None:
        """None when a part's bytes and its error part's together hold each of the chunk's rows exactly once
        (predictions with a response field) and the part's size is its recorded one; else what is wrong."""
        if len(body) != part["bytes"]:
            return f"the part holds {len(body)} bytes, its record says {part['bytes']}"
        found: list[np.ndarray] = []
        for kind, key, raw, count in (
            ("prediction", self.part_key(index), body, part["rows"]),
            ("error", self.error_key(index), errors, part["errors"]),
        ):
            try:
                which, lines = (
                    parquet_keys(raw, sources)
                    if kind == "prediction" and self.output_format == "parquet"
                    else json_keys(raw, sources)
                )
            except ValueError as problem:
                return f"{key}: {problem}"
            if len(lines) != count:
                return f"{key} holds {len(lines)} {kind} records, its count says {count}"
            found.append(_keys(which, lines))
        seen = np.concatenate(found)
        # A part without error rows holds the chunk's rows in the chunk's order: equal as they are, no sort
        # (two sorts of every row's key were half of what checking a part cost). Else compared as sets.
        if np.array_equal(seen, expected):
            return None
        if not np.array_equal(np.sort(seen), np.sort(expected)):
            missing = len(np.setdiff1d(expected, seen))
            return f"{missing} rows are in neither the part nor its error part, or a row is there twice"
        return None

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
            "output_format": self.output_format,
            "inputs": [self._outcome(o) for o in inputs],
            "rows": {"total": sum(p["rows"] + p["errors"] for p in parts), "succeeded": sum(p["rows"] for p in parts)}
            | {"failed": failed},
            "parts": parts,
            "errors": error_file,
        }
        body = orjson.dumps(document, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"
        self.store.put(f"{self.output_prefix}manifests/{run_id}.json", body, {"run": run_id})  # one per run, kept
        self.store.put(f"{self.output_prefix}manifest.json", body, {"run": run_id})  # the latest, at a fixed name
        return document

    def _outcome(self, obj: StoredObject) -> dict[str, Any]:
        """An input's entry in the manifest: `read` (every row is in a part or the error file), or `failed` with
        why (its error record, line FILE_LINE, is in the error file; rows read before the failure are scored)."""
        entry: dict[str, Any] = {"key": obj.key, "bytes": obj.size, "etag": obj.etag, "outcome": "read"}
        error = self.failed_inputs.get(obj.key)
        if error is not None:
            entry |= {"outcome": "failed", "error": error.to_dict(), "error_line": FILE_LINE}
        return entry


def _chunk_batch(model: ServedModel, decoded: list[Decoded]) -> tuple[Arrays | None, list[Decoded]]:
    """The good rows of a chunk's pieces as one batch, in piece order (None when no piece has any), and the
    pieces again: a piece whose rows cannot join the others' (sequences of another length and no pad value to
    even them: joining.py) has them as error rows instead."""
    having = [index for index, result in enumerate(decoded) if result.arrays is not None]
    batch, refused = join(model.manifest, [decoded[index].arrays or {} for index in having])
    if not refused:
        return batch, decoded
    pieces = list(decoded)
    for position, error in refused:
        result = pieces[having[position]]
        bad = sorted([*result.bad, *((int(row), error) for row in result.good)], key=lambda pair: pair[0])
        ids: list[Any] | None = [] if result.ids is not None else None
        pieces[having[position]] = Decoded(np.empty(0, dtype=np.int64), None, bad, ids)
    return batch, pieces


def _strict_stop(piece: Piece, result: Decoded) -> InvalidInput:
    """What a strict job raises for a piece's first bad row, naming where it is."""
    row, error = result.bad[0]
    where = f"{piece.source}:{int(piece.lines[row])}"
    return InvalidInput(
        f"{where}: {error.message} (strict: stopping at the first bad row)", field=where, allowed=error.allowed
    )


def _expected(chunk: list[Piece]) -> tuple[list[str], np.ndarray]:
    """The chunk's sources (in order of first appearance) and its rows as keys."""
    order: dict[str, int] = {}  # a dict, not a list scan: a chunk may span thousands of one-row files
    for piece in chunk:
        order.setdefault(piece.source, len(order))
    keys = [_keys(np.full(len(piece), order[piece.source], np.int64), piece.lines) for piece in chunk]
    return list(order), np.concatenate(keys) if keys else np.empty(0, np.int64)


__all__ = ["OUTPUT_FORMATS", "BatchJob", "Progress", "ServingError", "StoredObject", "sha256"]
