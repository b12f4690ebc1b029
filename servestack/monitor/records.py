"""Captured traffic: the records data capture writes, read from a local folder or an S3 prefix, filtered by time,
and decoded with the model's own decoder.

A record is one JSON object per line (JSON Lines), as SageMaker's data capture writes it:

    {"captureData": {"endpointInput": {"observedContentType": ..., "mode": "INPUT", "data": ..., "encoding": ...},
                     "endpointOutput": {"observedContentType": ..., "mode": "OUTPUT", "data": ..., "encoding": ...}},
     "eventMetadata": {"eventId": ..., "inferenceTime": "2026-12-03T16:45:00.123Z"}, "eventVersion": "0",
     "servestack": {"deployment": ..., "mode": ..., "model": ..., "version": ..., ...}}

`encoding` is JSON or CSV (`data` is the text) or BASE64 (`data` is the bytes, base64). Records servestack's
core writes carry the `servestack` block and hold `{"inputs": {"<column>": [...]}}`, where a column kept out
for personal data is absent; SageMaker's own records (a realtime endpoint in AWS) hold the request body as it
came, in any form the model takes. Both go through `ServedModel.decode`, so each reads as the server read it.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from servestack.inference import media_types
from servestack.inference.columns import columns_of
from servestack.inference.errors import ServingError
from servestack.inference.service import ServedModel
from servestack.monitor.table import Table

CAPTURE_SUFFIXES = (".jsonl",)
_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
# What a column left out of a core record is decoded as: a value of its type, never counted (`Table.add_inputs`).
_PLACEHOLDERS: dict[str, Any] = {"string": "", "bool": False}


class CaptureError(ValueError):
    """A `--since`/`--until` or `--capture` the command cannot use; the message says what it takes."""


def parse_time(text: str, now: datetime) -> datetime:
    """An ISO 8601 time (no zone: UTC) or a span back from `now`: `90s`, `30m`, `24h`, `7d`, `2w`."""
    relative = _RELATIVE.match(text.strip())
    if relative:
        return now - timedelta(**{_UNITS[relative.group(2)]: float(relative.group(1))})
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise CaptureError(
            f"{text!r} is not a time: give an ISO 8601 time (2026-12-03T16:00:00Z) or a span back from now "
            "(30m, 24h, 7d)"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Window:
    since: datetime | None = None
    until: datetime | None = None

    def holds(self, moment: datetime) -> bool:
        return (self.since is None or moment >= self.since) and (self.until is None or moment < self.until)


def capture_lines(location: str, *, endpoint_url: str | None, region: str | None) -> Iterator[tuple[str, str]]:
    """(where, line) for every line of every capture file under `location`: a .jsonl file, a folder (searched
    recursively) or `s3://bucket/prefix/`, files in name order (SageMaker names them by time)."""
    if location.startswith("s3://"):
        yield from _s3_lines(location, endpoint_url=endpoint_url, region=region)
        return
    path = Path(location)
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(CAPTURE_SUFFIXES))
    else:
        raise CaptureError(f"--capture {location}: no such file or folder; give a folder of .jsonl capture files "
                           "or s3://bucket/prefix/")  # fmt: skip
    for file in files:
        with file.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                yield f"{file}:{number}", line


def _s3_lines(location: str, *, endpoint_url: str | None, region: str | None) -> Iterator[tuple[str, str]]:
    import boto3

    bucket, _, prefix = location.removeprefix("s3://").partition("/")
    if not bucket:
        raise CaptureError(f"--capture {location}: name a bucket, s3://bucket/prefix/")
    s3 = boto3.client("s3", endpoint_url=endpoint_url, region_name=region)
    keys = [
        item["Key"]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for item in page.get("Contents", [])
        if item["Key"].endswith(CAPTURE_SUFFIXES)
    ]
    for key in sorted(keys):
        text = s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode("utf-8")
        for number, line in enumerate(text.splitlines(), start=1):
            yield f"s3://{bucket}/{key}:{number}", line


@dataclass
class Captured:
    """What was read: records in the window, the table of their columns and predictions, and why any other
    record was left out (reason -> count, and the first place each reason was met)."""

    table: Table
    records: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    first_seen: dict[str, str] = field(default_factory=dict)
    earliest: datetime | None = None  # the inference times of the records read: the window the data covers
    latest: datetime | None = None

    def skip(self, reason: str, where: str) -> None:
        self.skipped[reason] += 1
        self.first_seen.setdefault(reason, where)

    def notes(self) -> list[str]:
        return [
            f"{count} record(s) left out: {reason} (first: {self.first_seen[reason]})"
            for reason, count in self.skipped.most_common()
        ]


def read_capture(lines: Iterator[tuple[str, str]], model: ServedModel, window: Window, table: Table) -> Captured:
    """Decode every record of `lines` in `window` into `table`; a record outside it, of another model, or one
    the model refuses is counted and left out, never fatal."""
    captured = Captured(table)
    for where, line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            moment = datetime.fromisoformat(record["eventMetadata"]["inferenceTime"])
            data = record["captureData"]
            request = data["endpointInput"]
        except (ValueError, KeyError, TypeError):
            captured.skip("not a capture record (captureData.endpointInput, eventMetadata.inferenceTime)", where)
            continue
        moment = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
        if not window.holds(moment):
            continue
        about = record.get("servestack")
        if isinstance(about, dict) and about.get("model") not in (None, model.manifest.name):
            captured.skip(f"a record of another model ({about.get('model')})", where)
            continue
        try:
            body, content_type = captured_body(request)
            body, absent = _fill_absent(body, content_type, model) if isinstance(about, dict) else (body, frozenset())
            arrays = model.decode(body, content_type)
        except ServingError as error:
            captured.skip(f"the model refuses its input ({error.message[:160]})", where)
            continue
        except (ValueError, KeyError, TypeError) as error:
            captured.skip(f"an unreadable input ({str(error)[:160]})", where)
            continue
        table.add_inputs(arrays, absent)
        captured.records += 1
        captured.earliest = min(captured.earliest or moment, moment)
        captured.latest = max(captured.latest or moment, moment)
        if not _read_answer(data.get("endpointOutput"), table):
            captured.skip("its answer holds no predictions (an error, a hook's own form, or .npy)", where)
    return captured


def captured_body(capture: dict[str, Any]) -> tuple[bytes, str]:
    """A captured request or answer's bytes and its media type (as the server read it)."""
    data, encoding = capture["data"], str(capture.get("encoding", "JSON")).upper()
    body = base64.b64decode(data, validate=True) if encoding == "BASE64" else str(data).encode("utf-8")
    return body, media_types.request_type_of(capture.get("observedContentType"))


def _fill_absent(body: bytes, content_type: str, model: ServedModel) -> tuple[bytes, frozenset[str]]:
    """A core record's columnar `inputs` lacking columns (kept out for personal data): those columns filled with
    a value of their type so that the rest decodes as the server decoded it; the filled ones are named, and
    left out of the table."""
    columns = columns_of(model.manifest)
    if content_type != media_types.JSON or not columns:
        return body, frozenset()
    payload = json.loads(body)
    named = payload.get("inputs") if isinstance(payload, dict) and len(payload) == 1 else None
    if not isinstance(named, dict) or not named or not set(named) < {column.name for column in columns}:
        return body, frozenset()
    rows = len(next(iter(named.values())))
    absent = [column for column in columns if column.name not in named]
    for column in absent:
        named[column.name] = [_PLACEHOLDERS.get(column.dtype, 0)] * rows
    return json.dumps(payload).encode(), frozenset(column.name for column in absent)


def _read_answer(capture: Any, table: Table) -> bool:
    if not isinstance(capture, dict) or "data" not in capture:
        return False
    try:
        body, media_type = captured_body(capture)
    except (ValueError, TypeError):
        return False
    if media_type == media_types.JSON:
        try:
            answer = json.loads(body)
        except ValueError:
            return False
        return isinstance(answer, dict) and table.add_answer(answer)
    if media_type in (media_types.CSV, media_types.CSV_HEADER):
        rows = [row for row in csv.reader(io.StringIO(body.decode("utf-8", "replace"))) if row]
        return table.add_csv_answer(rows)
    return False
