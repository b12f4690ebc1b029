"""Batch data in and out of a running `local up`, as the developer: `servestack local put-input` uploads files to
a batch deployment's input prefix; `servestack local run-batch NAME --download OUT` merges the run's output
into one file.

The merge reads the run's manifest (`manifests/<run>.json` under the output prefix, else `manifest.json`), its
parts in order and its error file, and writes one row per input row, in input order (the manifest's inputs,
then line): `id` when the input row carries one (a JSON Lines object's `id`, a CSV or Parquet column `id`; a
file read whole as one record, an image say, is its own key), `file`, `line`, the prediction fields, and `error`
(null where the row was scored). `.jsonl`, `.csv` (lists and objects as JSON text) or `.parquet` by the output's
suffix.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from servestack.failures import CommandError, ExitCode
from servestack.inference import media_types
from servestack.local.emulator import state

INPUT_SUFFIXES = (".jsonl", ".ndjson", ".json", ".csv", ".parquet")
DOWNLOAD_FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet"}
ID_FIELD = "id"


def batch_location(about: dict[str, Any], name: str) -> tuple[str, str, str]:
    """(bucket, input prefix, output prefix) of a batch deployment of the running local up."""
    entry = about["deployments"].get(name)
    if entry is None or entry.get("mode") != "batch":
        batch = [n for n, x in about["deployments"].items() if x.get("mode") == "batch"]
        raise CommandError(
            f"{name}: not a batch deployment of the running local up ({', '.join(batch) or 'none'})",
            ExitCode.NOT_FOUND,
        )
    given: dict[str, Any] = entry.get("input") or {}
    task_env: dict[str, str] = (entry.get("task") or {}).get("environment") or {}
    bucket = given.get("bucket") or task_env.get("SERVESTACK_BATCH_BUCKET")
    input_prefix = given.get("input_prefix") or task_env.get("SERVESTACK_BATCH_INPUT_PREFIX")
    output_prefix = given.get("output_prefix") or task_env.get("SERVESTACK_BATCH_OUTPUT_PREFIX")
    if not bucket or input_prefix is None or output_prefix is None:
        raise CommandError(f"{name}: the state file of local up names no input bucket and prefixes for it")
    return str(bucket), str(input_prefix), str(output_prefix)


def s3_client(about: dict[str, Any]) -> Any:
    from botocore.config import Config

    from servestack.local.emulator import sagemaker_runtime

    session, _ = sagemaker_runtime(about)  # the developer's keys and region
    config = Config(s3={"addressing_style": "path"}, retries={"mode": "standard", "max_attempts": 3})
    return session.client("s3", endpoint_url=about["endpoint_url"], config=config)


def put_input(name: str, files: list[Path], *, state_path: Path | None = None) -> int:
    """Upload each file under the deployment's input prefix (its own name as the key, the media type its name
    suggests as its Content-Type); print each object URL. Any file: rows (JSON Lines, CSV, Parquet) for any
    model, and anything else (an image, audio...) as one record each for a model whose `preprocess` hook reads
    it (servestack/inference/tabular/files.py); a model without one leaves those out of its runs."""
    for path in files:
        if not path.is_file():
            raise CommandError(
                f"{path}: no such file; give input files ({', '.join(INPUT_SUFFIXES)}, or any file a preprocess "
                "hook reads)"
            )
    about = state.read(state_path)
    bucket, input_prefix, _ = batch_location(about, name)
    s3 = s3_client(about)
    for path in files:
        key = f"{input_prefix}{path.name}"
        content_type = media_types.guessed_type(path.name)
        s3.upload_file(str(path), bucket, key, ExtraArgs={"ContentType": content_type})
        print(f"s3://{bucket}/{key}", flush=True)
    return 0


def download_format(target: Path) -> str:
    found = DOWNLOAD_FORMATS.get(target.suffix.lower())
    if found is None:
        raise CommandError(
            f"--download {target}: the suffix says the format; use one of {', '.join(sorted(DOWNLOAD_FORMATS))}"
        )
    return found


def _read(s3: Any, bucket: str, key: str) -> bytes:
    body: bytes = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    return body


def run_manifest(s3: Any, manifest_url: str) -> tuple[str, str, dict[str, Any]]:
    """(bucket, output prefix, manifest) of the run that wrote `manifest_url`: its own copy under `manifests/`."""
    bucket, _, key = manifest_url.removeprefix("s3://").partition("/")
    prefix = key.removesuffix("manifest.json")
    latest = json.loads(_read(s3, bucket, key))
    try:
        own = json.loads(_read(s3, bucket, f"{prefix}manifests/{latest['run']}.json"))
    except Exception:  # written by a job from before per-run manifests: the fixed name is this run's
        own = latest
    return bucket, prefix, own


def merged_rows(s3: Any, manifest_url: str) -> list[dict[str, Any]]:
    """Every input row's outcome, in input order, joined to the input's id where one is set."""
    bucket, prefix, manifest = run_manifest(s3, manifest_url)
    if manifest.get("engine") == "transform":
        raise CommandError(
            f"--download: runs of engine: transform are not merged yet; their parts are under s3://{bucket}/{prefix}",
            ExitCode.USAGE,
        )
    order = {entry["key"]: index for index, entry in enumerate(manifest["inputs"])}
    rows: list[dict[str, Any]] = []
    for part in manifest["parts"]:
        body = _read(s3, bucket, prefix + part["key"])
        rows += _part_records(body, part["key"])
    if manifest.get("errors"):
        for line in _read(s3, bucket, prefix + manifest["errors"]["key"]).splitlines():
            if line.strip():
                failed = json.loads(line)
                rows.append({"file": failed["file"], "line": failed["line"], "error": failed["error"]})
    rows.sort(key=lambda row: (order.get(row["file"], len(order)), int(row["line"])))
    ids: dict[tuple[str, int], Any] = {}
    for entry in manifest["inputs"]:
        if not entry["key"].lower().endswith(INPUT_SUFFIXES):  # a file read whole, one record: its key is its id
            ids[(entry["key"], 1)] = entry["key"]
            continue
        ids |= {
            (entry["key"], line): value for line, value in _input_ids(_read(s3, bucket, entry["key"]), entry["key"])
        }
    fields = _field_names(rows)
    shaped = []
    for row in rows:
        out: dict[str, Any] = {ID_FIELD: ids.get((row["file"], int(row["line"])))} if ids else {}
        out |= {"file": row["file"], "line": int(row["line"])}
        out |= {name: row.get(name) for name in fields}
        out["error"] = row.get("error")
        shaped.append(out)
    return shaped


def _field_names(rows: list[dict[str, Any]]) -> list[str]:
    names: dict[str, None] = {}
    for row in rows:
        names |= dict.fromkeys(k for k in row if k not in ("file", "line", "error"))
    return list(names)


def _part_records(body: bytes, key: str) -> list[dict[str, Any]]:
    if key.endswith(".parquet"):
        import pyarrow.parquet as pq

        records: list[dict[str, Any]] = pq.read_table(io.BytesIO(body)).to_pylist()
        return records
    return [json.loads(line) for line in body.splitlines() if line.strip()]


def _input_ids(body: bytes, key: str) -> Iterable[tuple[int, Any]]:
    """(line, id) of each input row that carries an id; lines count from 1, as the parts count them."""
    if key.lower().endswith(".parquet"):
        import pyarrow.parquet as pq

        table = pq.read_table(io.BytesIO(body))
        if ID_FIELD in table.column_names:
            yield from enumerate(table.column(ID_FIELD).to_pylist(), start=1)
        return
    lines = body.decode("utf-8-sig", errors="replace").split("\n")
    if key.lower().endswith(".csv"):
        header = next(csv.reader([lines[0]])) if lines else []
        if ID_FIELD not in [cell.strip() for cell in header]:
            return
        column = [cell.strip() for cell in header].index(ID_FIELD)
        for number, cells in enumerate(csv.reader(lines[1:]), start=2):
            if len(cells) > column:
                yield number, cells[column]
        return
    for number, text in enumerate(lines, start=1):
        if text.lstrip().startswith("{"):
            try:
                row = json.loads(text)
            except ValueError:
                continue
            if isinstance(row, dict) and ID_FIELD in row:
                yield number, row[ID_FIELD]


def write_rows(rows: list[dict[str, Any]], target: Path) -> None:
    kind = download_format(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    if kind == "jsonl":
        target.write_text("".join(json.dumps(row) + "\n" for row in rows))
    elif kind == "csv":
        columns = list(rows[0]) if rows else ["file", "line", "error"]
        with target.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(columns)
            for row in rows:
                writer.writerow([_cell(row.get(c)) for c in columns])
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        errors = [json.dumps(row["error"]) if row.get("error") is not None else None for row in rows]
        table = pa.Table.from_pylist([{**row, "error": text} for row, text in zip(rows, errors, strict=True)])
        pq.write_table(table, target)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list | dict):
        return json.dumps(value)
    return str(value)


def download(about: dict[str, Any], manifest_url: str, target: Path) -> None:
    rows = merged_rows(s3_client(about), manifest_url)
    write_rows(rows, target)
    failed = sum(1 for row in rows if row.get("error") is not None)
    print(f"{target}: {len(rows)} rows ({failed} failed), in input order", file=sys.stderr, flush=True)


__all__ = ["batch_location", "download", "download_format", "merged_rows", "put_input", "write_rows"]
