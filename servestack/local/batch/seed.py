"""The sample input `local up` puts under a batch deployment's input prefix, so that `local run-batch` has rows
to score at once, and its removal once the prefix holds the user's own input.

Seeded only when the prefix is empty, marked (`x-amz-meta-servestack-seeded`), and removed before a run whose
prefix holds anything else (`local run-batch`, each run of the local scheduler, and `local up` starting again):
a seeded row never ends up in the results of a user's input, and a prefix the user filled is never written to.
(Seeding under another prefix would keep the sample out of the user's way too, but the schedule reads its one
input prefix: the first run would find nothing to score.)

The rows come from the model's `sample-request.json` in any request form (`instances` of rows or row objects,
`dataframe_records`, `dataframe_split`, `inputs` by column or by tensor); a sample that gives no rows seeds nothing, and
says why, rather than stopping `local up`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

SEED_KEY = "servestack-sample.jsonl"
MARK = "servestack-seeded"


def sample_rows(document: Any) -> list[Any] | None:
    """The rows of a sample request, one JSON value (a list, or an object of column or input to value) per row;
    None when the request is not in a form whose rows a batch line can hold."""
    if not isinstance(document, dict):
        return None
    rows: Any = None
    if isinstance(document.get("instances"), list):
        rows = document["instances"]
    elif isinstance(document.get("dataframe_records"), list):
        rows = document["dataframe_records"]
    elif isinstance(document.get("dataframe_split"), dict):
        split = document["dataframe_split"]
        names, data = split.get("columns"), split.get("data")
        if isinstance(names, list) and isinstance(data, list) and all(isinstance(row, list) for row in data):
            rows = [dict(zip(names, row, strict=False)) for row in data]
    elif isinstance(document.get("inputs"), dict):
        # By column (one value per row) or by tensor (one list per row: a row object of the named inputs, which a
        # batch line holds as a request's `instances` does, ragged sequences padded as there).
        columns = document["inputs"]
        values = list(columns.values())
        by_column = all(isinstance(v, list) and v and not isinstance(v[0], list | dict) for v in values)
        by_tensor = all(isinstance(v, list) and v and all(isinstance(row, list) for row in v) for v in values)
        if values and (by_column or by_tensor) and len({len(v) for v in values}) == 1:
            rows = [dict(zip(columns, row, strict=True)) for row in zip(*values, strict=True)]
    if not isinstance(rows, list) or not rows or not all(isinstance(row, list | dict) for row in rows):
        return None
    return rows


def seed_batch_input(s3: Any, bucket: str, prefix: str, sample: Path) -> str | None:
    """A small JSON Lines file of the model's sample rows under `prefix`, marked as seeded, when the prefix is
    empty; its key, or None when nothing was seeded (the prefix holds input, or the sample gives no rows)."""
    key = f"{prefix}{SEED_KEY}"
    listed = [
        str(item["Key"]) for item in s3.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=2).get("Contents", [])
    ]
    if listed:
        # Seeded by an earlier start and still alone there (the emulator's data is kept across restarts): it is
        # still local up's, so `local run-batch` must still retire it once the user's input arrives.
        alone = listed == [key] and s3.head_object(Bucket=bucket, Key=key).get("Metadata", {}).get(MARK) is not None
        return key if alone else None
    try:
        rows = sample_rows(json.loads(sample.read_text()))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        rows = None
    if rows is None:
        print(f"{sample}: no rows a batch line can hold; {prefix} is not seeded", file=sys.stderr)
        return None
    body = "".join(json.dumps(row) + "\n" for row in rows).encode()
    s3.put_object(Bucket=bucket, Key=key, Body=body, Metadata={MARK: "sample-request"})
    return key


def retire_seeded_input(s3: Any, bucket: str, prefix: str) -> list[str]:
    """Delete the seeded sample under `prefix` when the prefix holds anything else (the user's input); the keys
    deleted."""
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1000).get("Contents", [])
    keys = [str(item["Key"]) for item in listed]
    seeded = f"{prefix}{SEED_KEY}"
    if seeded not in keys or len(keys) == 1:
        return []
    metadata = s3.head_object(Bucket=bucket, Key=seeded).get("Metadata", {})
    if metadata.get(MARK) is None:
        return []  # the user's own object of that name
    s3.delete_object(Bucket=bucket, Key=seeded)
    print(f"s3://{bucket}/{seeded}: local up's sample removed, the prefix holds other input", file=sys.stderr)
    return [seeded]
