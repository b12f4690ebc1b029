"""A batch deployment's runs as the captured traffic of `servestack monitor` and of its scheduled check: a batch
run's record is its own input and output objects (docs/monitoring.md, Capture), nothing copied.

Where they are: the deployment's output prefix (`--capture s3://bucket/<output prefix>`). Each run leaves its
manifest there, `manifests/<run>.json` (one per run, kept; servestack/inference/tabular/job.py), and its time is
when that manifest was stored (its LastModified): a run is in the window when that time is. The manifest names the
run's input objects (key and ETag) and its output parts, each of whose JSON lines is one scored row: `file` (the
input's key), `line`, then the answer's fields (`prediction`, `label`, `probabilities` or `proba_<label>`).

What is compared: the rows each run scored, read again from its input objects exactly as the run read them (the
batch job's own line splitting and decoding, servestack/inference/tabular/), joined to their predictions by file and
line, which every output row carries (an `id_column`, when set, is copied beside them). A row that was an error
in the run has no output row and is not read. A run is left out, with a note saying why, when what it scored can no
longer be read as it was: its parts were replaced by a later run's (parts have fixed names, so only the latest run
of a window of several can be read whole; each part carries its run's fingerprint as metadata), an input changed
since (its ETag) or is gone, or it is a run this check does not read: of another model, a transform job's (its
answers hold no file and line), or with Parquet parts. A Parquet input object is not read either: the scheduled
check runs without pyarrow, and the command reads what the check reads.

A run's scored rows are held while its inputs are read (a few hundred bytes per row).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import numpy as np

from servestack.inference.service import ServedModel
from servestack.inference.tabular.decode import decode_piece
from servestack.inference.tabular.rows import FORMATS, PARQUET, Progress, block_lines, suffix
from servestack.monitor.records import Captured, CaptureError, Window
from servestack.monitor.table import Table

MANIFESTS = "manifests/"
BLOCK_BYTES = 8 * 1024 * 1024  # an input object is read in blocks of this size, never whole
_PROBABILITY_PREFIX = "proba_"
# A scored row's fields that are not the answer's
_ROW_FIELDS = ("file", "line")


class _Skip(Exception):
    """A run, or one of its inputs, this check leaves out; the message says why."""


def _client(endpoint_url: str | None, region: str | None) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=endpoint_url, region_name=region)


def _split(location: str) -> tuple[str, str]:
    bucket, _, prefix = location.removeprefix("s3://").partition("/")
    if not bucket:
        raise CaptureError(f"--capture {location}: name a bucket, s3://bucket/prefix/")
    return bucket, prefix if not prefix or prefix.endswith("/") else f"{prefix}/"


def is_batch_output(location: str, *, endpoint_url: str | None, region: str | None) -> bool:
    """Whether `location` is a batch deployment's output prefix in S3: it holds run manifests."""
    if not location.startswith("s3://"):
        return False
    bucket, prefix = _split(location)
    listing = _client(endpoint_url, region).list_objects_v2(Bucket=bucket, Prefix=f"{prefix}{MANIFESTS}", MaxKeys=1)
    return int(listing.get("KeyCount", 0)) > 0


def read_batch_runs(
    location: str, model: ServedModel, window: Window, table: Table, *, endpoint_url: str | None, region: str | None
) -> Captured:
    """The rows every run in `window` scored under the output prefix `location` (s3://bucket/prefix/), with their
    predictions, into `table`; each record is one scored row, and a run or input left out is a note."""
    bucket, prefix = _split(location)
    s3 = _client(endpoint_url, region)
    captured = Captured(table)
    for moment, key in _runs(s3, bucket, prefix, window):
        where = f"s3://{bucket}/{key}"
        try:
            manifest = json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
            scored = _scored_rows(s3, bucket, prefix, manifest, model)
        except _Skip as skipped:
            captured.skip(f"a run left out: {skipped}", where)
            continue
        rows = 0
        for entry in manifest.get("inputs") or []:
            wanted = scored.get(str(entry.get("key")))
            if not wanted:
                continue
            try:
                rows += _read_input(s3, bucket, entry, wanted, model, table, captured)
            except _Skip as skipped:
                captured.skip(f"an input left out: {skipped}", f"s3://{bucket}/{entry.get('key')}")
        if rows:
            captured.records += rows
            captured.earliest = min(captured.earliest or moment, moment)
            captured.latest = max(captured.latest or moment, moment)
    return captured


def _runs(s3: Any, bucket: str, prefix: str, window: Window) -> list[tuple[datetime, str]]:
    """(stored at, key) of each run manifest in the window, oldest first."""
    found: list[tuple[datetime, str]] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}{MANIFESTS}"):
        for item in page.get("Contents", []):
            moment = item["LastModified"]
            moment = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
            if item["Key"].endswith(".json") and window.holds(moment):
                found.append((moment, item["Key"]))
    return sorted(found)


def _scored_rows(
    s3: Any, bucket: str, prefix: str, manifest: dict[str, Any], model: ServedModel
) -> dict[str, dict[int, dict[str, Any]]]:
    """The run's output rows by input key and line: each row's answer fields."""
    ran = (manifest.get("model") or {}).get("name")
    if ran != model.manifest.name:
        raise _Skip(f"a run of another model ({ran})")
    if manifest.get("engine") == "transform":
        raise _Skip("a transform job's run: its answers hold no file and line to join them to their rows by")
    if manifest.get("output_format", "jsonl") != "jsonl":
        raise _Skip(f"its parts are {manifest.get('output_format')}, which the check does not read (no pyarrow)")
    run = str(manifest.get("run"))
    scored: dict[str, dict[int, dict[str, Any]]] = {}
    for part in manifest.get("parts") or []:
        if not part.get("rows"):
            continue
        stored = s3.get_object(Bucket=bucket, Key=f"{prefix}{part['key']}")
        if (stored.get("Metadata") or {}).get("run") != run:
            raise _Skip(f"its part {part['key']} was replaced by a later run's (the parts' names are fixed)")
        for line in stored["Body"].read().splitlines():
            if line.strip():
                row = json.loads(line)
                scored.setdefault(str(row["file"]), {})[int(row["line"])] = row
    return scored


def _read_input(
    s3: Any,
    bucket: str,
    entry: dict[str, Any],
    wanted: dict[int, dict[str, Any]],
    model: ServedModel,
    table: Table,
    captured: Captured,
) -> int:
    """The scored rows of one input object, decoded as the run decoded them, into `table` with their predictions;
    how many rows were added."""
    key = str(entry["key"])
    media_type = FORMATS.get(suffix(key))
    if media_type is None or media_type == PARQUET:
        why = "a Parquet object (the check runs without pyarrow)" if media_type == PARQUET else "not a row format"
        raise _Skip(why)
    try:
        stored = s3.get_object(Bucket=bucket, Key=key)
    except Exception as error:  # gone (NoSuchKey) or not this role's to read any more
        raise _Skip(f"it can no longer be read ({_code(error)})") from None
    if str(stored.get("ETag", "")).strip('"') != str(entry.get("etag")):
        stored["Body"].close()
        raise _Skip("it changed since the run (its ETag)")
    lines = np.array(sorted(wanted), dtype=np.int64)
    added = 0
    for piece in block_lines(_blocks(stored["Body"]), key, media_type, Progress()):
        selected = piece.select(np.flatnonzero(np.isin(piece.lines, lines)))
        if not len(selected):
            continue
        decoded = decode_piece(model, selected)
        for _, refusal in decoded.bad:
            captured.skip(f"a scored row the model refuses now ({refusal.message[:160]})", f"s3://{bucket}/{key}")
        if decoded.arrays is None or not len(decoded.good):
            continue
        rows = [wanted[int(line)] for line in selected.lines[decoded.good]]
        table.add_inputs(decoded.arrays)
        if not table.add_answer(_answer(rows)):
            captured.skip("its output rows hold no predictions", f"s3://{bucket}/{key}")
        added += len(rows)
    return added


def _blocks(body: Any) -> Iterator[bytes]:
    try:
        yield from body.iter_chunks(chunk_size=BLOCK_BYTES)
    finally:
        body.close()


def _answer(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Scored rows as one answer of the online modes (`predictions`, `labels`, `probabilities`): the part's fields
    are the answer's, one value per row (servestack/inference/tabular/encode.py)."""
    answer: dict[str, Any] = {"predictions": [row.get("prediction") for row in rows]}
    if any("label" in row for row in rows):
        answer["labels"] = [row.get("label", row.get("prediction")) for row in rows]
    if all(isinstance(row.get("probabilities"), list | dict) for row in rows):
        answer["probabilities"] = [row["probabilities"] for row in rows]
    elif any(name.startswith(_PROBABILITY_PREFIX) for name in rows[0] if name not in _ROW_FIELDS):
        answer["probabilities"] = [
            [value for name, value in row.items() if name.startswith(_PROBABILITY_PREFIX)] for row in rows
        ]
    return answer


def _code(error: Exception) -> str:
    return str(getattr(error, "response", {}).get("Error", {}).get("Code") or type(error).__name__)
