"""Capture records as data capture writes them (JSON Lines, SageMaker's record shape), for the monitor's tests:
each request answered by the real model package, so that the captured answers are the server's own bytes.

Four kinds of record, in turn: servestack's core records (`{"inputs": {column: [...]}}` and a `servestack`
block; every third one without the `proline` column, as when a column is kept out for personal data) and
SageMaker's own (the body as the client sent it: `dataframe_split`, row objects as `instances`, CSV with a
header row).
"""

from __future__ import annotations

import csv
import io
import json
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from servestack.inference.service import ServedModel

LEFT_OUT = "proline"


def _core(columns: dict[str, list[Any]], record: int) -> tuple[str, str, str]:
    kept = {name: values for name, values in columns.items() if not (record % 3 == 0 and name == LEFT_OUT)}
    return json.dumps({"inputs": kept}), "application/json", "JSON"


def _split(columns: dict[str, list[Any]], _record: int) -> tuple[str, str, str]:
    names = list(columns)
    rows = [list(row) for row in zip(*columns.values(), strict=True)]
    return json.dumps({"dataframe_split": {"columns": names, "data": rows}}), "application/json", "JSON"


def _instances(columns: dict[str, list[Any]], _record: int) -> tuple[str, str, str]:
    rows = [dict(zip(columns, row, strict=True)) for row in zip(*columns.values(), strict=True)]
    return json.dumps({"instances": rows}), "application/json", "JSON"


def _csv(columns: dict[str, list[Any]], _record: int) -> tuple[str, str, str]:
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows(zip(*columns.values(), strict=True))
    return text.getvalue(), "text/csv", "CSV"


FORMS = (_core, _split, _instances, _csv)


def write_capture(
    folder: Path,
    model: ServedModel,
    table: dict[str, Sequence[Any]],
    *,
    start: datetime,
    batch_rows: int = 6,
    deployment: str = "wine-api",
) -> int:
    """Write `table`'s rows (column -> values) as records of `batch_rows` rows, one minute apart from `start`,
    into hourly files under `folder` as SageMaker lays them out (`yyyy/mm/dd/hh/<uuid>.jsonl`); the records."""
    rows = len(next(iter(table.values())))
    files: dict[Path, list[str]] = {}
    for record, first in enumerate(range(0, rows, batch_rows)):
        columns = {name: _plain(values[first : first + batch_rows]) for name, values in table.items()}
        data, content_type, encoding = FORMS[record % len(FORMS)](columns, record)
        # The request as the client sent it, every column in: a record leaves a column out, the request never did.
        sent, sent_type, _ = _split(columns, record)
        answer = model.infer(sent.encode(), sent_type, "application/json").body.decode()
        moment = start + timedelta(minutes=record)
        line: dict[str, Any] = {
            "captureData": {
                "endpointInput": {
                    "observedContentType": content_type,
                    "mode": "INPUT",
                    "data": data,
                    "encoding": encoding,
                },
                "endpointOutput": {
                    "observedContentType": "application/json",
                    "mode": "OUTPUT",
                    "data": answer,
                    "encoding": "JSON",
                },
            },
            "eventMetadata": {
                "eventId": str(uuid.uuid4()),
                "inferenceTime": moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z",
            },
            "eventVersion": "0",
        }
        if FORMS[record % len(FORMS)] is _core:
            line["servestack"] = {
                "deployment": deployment,
                "mode": "serverless",
                "model": model.manifest.name,
                "version": model.manifest.version,
                "variant": None,
                "job_id": None,
            }
        hour = folder / moment.strftime("%Y/%m/%d/%H") / "capture.jsonl"
        files.setdefault(hour, []).append(json.dumps(line))
    for path, lines in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return (rows + batch_rows - 1) // batch_rows


def _plain(values: Any) -> list[Any]:
    """numpy values as JSON's: floats rounded to float32's precision as a client would send them."""
    array = np.asarray(values)
    if array.dtype.kind == "f":
        return [float(f"{value:.6g}") for value in array.tolist()]
    return [value.item() if isinstance(value, np.generic) else value for value in array.tolist()]
