"""`models push --sample FILE`: example rows in any form a user has them, read into a sample request.

- `.json`: a request body (`instances`, `inputs`, `dataframe_split`, `dataframe_records`, or an object in a
  preprocess hook's own form) or a bare list of rows;
- `.jsonl` / `.ndjson`: JSON Lines, one row object per line;
- `.csv`: rows under a header row naming the columns;
- `.parquet` / `.pq`: a table with named columns (needs pyarrow, the `parquet` extra).

The file also names the columns of a model whose one input is `[N, k]` (the header, the objects' keys). Rows
read from CSV are text until the model's columns say which cells are numbers (`sample_request`). The sample
request is an example, not an evaluation set: its first MAX_SAMPLE_ROWS rows are stored, because a serverless
deployment's pre-traffic hook carries the request and its answer in its environment (at most 3,500 bytes of the
4 KB Lambda allows for all variables). `models optimize --eval FILE` takes the evaluation rows.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servestack.inference.errors import InvalidInput
from servestack.inference.manifest import ColumnSpec

MAX_SAMPLE_ROWS = 5
# The whole --sample file, kept as the package's monitoring baseline (servestack/inference/packaging.py's
# `baseline_files`) up to this size: every deployment ships the package.
BASELINE_STEM = "baseline"
BASELINE_SUFFIXES = (".csv", ".jsonl", ".ndjson", ".parquet", ".pq")
BASELINE_MAX_BYTES = 8 * 1024 * 1024
SAMPLE_FORMS = ".json (a request or a list of rows), .jsonl of row objects, .csv with a header row, or .parquet"
_REQUEST_KEYS = ("instances", "inputs", "dataframe_split", "dataframe_records")
_MISSING_CELLS = frozenset({"", "nan", "NaN", "NAN", "null", "NA"})


@dataclass(frozen=True)
class Sample:
    """`request`: a complete request body (a `.json` file); else `names` and `rows` (in `names` order), whose
    values are CSV text when `text`."""

    request: dict[str, Any] | None
    names: list[str] | None
    rows: list[list[Any]] | None = None
    text: bool = False


def read_sample(path: Path) -> Sample:
    suffix = path.suffix.lower()
    if not path.is_file():
        raise InvalidInput(f"--sample: {path}: no such file", field="sample", value=str(path))
    if suffix == ".json":
        return _json_sample(path)
    if suffix in (".jsonl", ".ndjson"):
        return _json_lines_sample(path)
    if suffix == ".csv":
        return _csv_sample(path)
    if suffix in (".parquet", ".pq"):
        return _parquet_sample(path)
    raise InvalidInput(
        f"--sample: {path.name}: {suffix or 'no suffix'} is not a sample format",
        field="sample",
        value=path.name,
        allowed=SAMPLE_FORMS,
    )


def _refused(path: Path, why: str) -> InvalidInput:
    return InvalidInput(f"--sample: {path}: {why}", field="sample", value=str(path), allowed=SAMPLE_FORMS)


def _json_sample(path: Path) -> Sample:
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise _refused(path, f"not JSON ({exc})") from None
    if isinstance(loaded, list):
        loaded = {"instances": loaded}
    if not isinstance(loaded, dict):  # an object in another form is for a preprocess hook: the model decides
        raise _refused(path, f"holds neither rows nor a request ({', '.join(_REQUEST_KEYS)}, or a hook's object)")
    return Sample(loaded, _names_in(loaded))


def _names_in(request: dict[str, Any]) -> list[str] | None:
    """The column names a request gives: a split's columns, or the keys of the first row object."""
    split = request.get("dataframe_split")
    if isinstance(split, dict) and isinstance(split.get("columns"), list):
        return [str(name) for name in split["columns"]]
    rows = request.get("dataframe_records", request.get("instances"))
    if isinstance(rows, list) and rows and isinstance(rows[0], dict):
        return [str(name) for name in rows[0]]
    return None


def _json_lines_sample(path: Path) -> Sample:
    records: list[Any] = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except ValueError as exc:
                raise _refused(path, f"line {number} is not JSON ({exc})") from None
            if not isinstance(records[-1], dict):
                raise _refused(path, f'line {number} is not a row object ({{"<column>": value, ...}})')
            if len(records) == MAX_SAMPLE_ROWS:
                break
    return _from_records(path, records)


def _from_records(path: Path, records: list[dict[str, Any]]) -> Sample:
    if not records:
        raise _refused(path, "holds no rows")
    names = [str(name) for name in records[0]]
    rows: list[list[Any]] = []
    for number, record in enumerate(records, start=1):
        if sorted(record) != sorted(names):
            raise _refused(path, f"row {number} has the columns {sorted(record)}, the first row {sorted(names)}")
        rows.append([_json_value(record[name]) for name in names])
    return Sample(None, names, rows)


def _json_value(value: Any) -> Any:
    """NaN is stored as `null`: standard JSON, which every client parses (and the model reads as NaN)."""
    return None if isinstance(value, float) and math.isnan(value) else value


def _csv_sample(path: Path) -> Sample:
    try:
        with path.open(encoding="utf-8-sig", newline="") as stream:
            reader = csv.reader(stream, strict=True)
            header = next(reader, None)
            rows = []
            for cells in reader:
                if cells and (len(cells) > 1 or cells[0].strip()):
                    rows.append(cells)
                if len(rows) == MAX_SAMPLE_ROWS:
                    break
    except (csv.Error, UnicodeDecodeError) as exc:
        raise _refused(path, f"not readable CSV ({exc})") from None
    if header is None or not rows:
        raise _refused(path, "needs a header row naming the columns, then at least one row")
    names = [name.strip() for name in header]
    for number, cells in enumerate(rows, start=2):
        if len(cells) != len(names):
            raise _refused(path, f"line {number} has {len(cells)} cells, the header {len(names)}")
    return Sample(None, names, rows, text=True)


def _parquet_sample(path: Path) -> Sample:
    try:
        import pyarrow.parquet as parquet
    except ImportError:
        raise _refused(path, "reading Parquet needs pyarrow (pip install 'servestack[parquet]')") from None
    try:
        table = parquet.read_table(path).slice(0, MAX_SAMPLE_ROWS)
    except Exception as exc:  # pyarrow raises its own error types for a file that is not Parquet
        raise _refused(path, f"not readable Parquet ({str(exc)[:200]})") from None
    return _from_records(path, table.to_pylist())


def sample_request(sample: Sample, columns: tuple[ColumnSpec, ...]) -> dict[str, Any]:
    """The sample as a request: a `.json` file's request as it is; rows as `dataframe_split`, CSV cells typed by
    the columns of the same name (numbers, `null` for an empty or NaN cell, text for a string column)."""
    if sample.request is not None:
        return sample.request
    assert sample.names is not None
    assert sample.rows is not None
    rows = sample.rows
    if sample.text:
        dtypes = {column.name: column.dtype for column in columns}
        kinds = [dtypes.get(name, "string") for name in sample.names]
        rows = [[_typed(cell, kind) for cell, kind in zip(cells, kinds, strict=True)] for cells in rows]
    return {"dataframe_split": {"columns": sample.names, "data": rows}}


def _typed(cell: str, dtype: str) -> Any:
    """A CSV cell as the JSON value its column takes; a cell that is not one stays text, for the model's own
    check to name it."""
    text = cell.strip()
    try:
        if dtype.startswith("float"):
            return None if text in _MISSING_CELLS else float(text)
        if dtype.startswith(("int", "uint")):
            return int(text)
    except ValueError:
        return cell
    if dtype == "bool" and text.lower() in ("true", "false", "1", "0"):
        return text.lower() in ("true", "1")
    return cell
