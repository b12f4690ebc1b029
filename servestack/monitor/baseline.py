"""The baseline `servestack monitor` compares traffic with: rows the model was trained on (`--baseline FILE`), or
the sample its package carries (`models push --sample`), decoded and predicted by the model itself.

Both sides of the comparison go through the same code: the baseline's rows become request bodies
(`dataframe_split` chunks, or the file's own request), which `ServedModel.decode` reads as it reads captured
traffic, and the model's answers to them are the baseline's predictions and class balance. A file may hold
more columns than the model takes (the label, an id): only the model's are kept.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from servestack.inference import media_types
from servestack.inference.columns import column_names, columns_of
from servestack.inference.errors import ServingError
from servestack.inference.manifest import SAMPLE_REQUEST
from servestack.inference.sample_files import BASELINE_STEM, Sample, sample_request
from servestack.inference.service import ServedModel
from servestack.monitor.table import Table

BASELINE_FORMS = ".csv with a header row, .parquet, .jsonl of row objects, or .json (a request body or a list of rows)"
CHUNK_ROWS = 2000  # rows per request body the baseline is read in: the decoder's own batch limit is larger


class BaselineError(ValueError):
    """A baseline the command cannot read; the message names the file and what it takes."""


def read_baseline(path: Path, model: ServedModel, table: Table) -> None:
    """Every row of the file into `table`: its columns, and the model's predictions for them."""
    for request in _requests(path, model):
        try:
            add_request(json.dumps(request).encode(), model, table)
        except ServingError as error:  # the rows of a chunk are numbered from its start: name the file instead
            raise BaselineError(f"--baseline {path}: the model refuses a row: {error.message}") from None


def read_package_sample(package_dir: Path, model: ServedModel, table: Table) -> None:
    """The package's baseline: the whole `--sample` file push kept (`baseline.<suffix>`, listed with its
    checksum), else the few rows of its sample request."""
    kept = [entry.name for entry in model.manifest.files if entry.name.startswith(f"{BASELINE_STEM}.")]
    if kept:
        read_baseline(package_dir / kept[0], model, table)
        return
    sample = package_dir / SAMPLE_REQUEST
    if not sample.is_file():
        raise BaselineError(f"{package_dir} carries no {SAMPLE_REQUEST}: pass --baseline FILE (the training rows)")
    add_request(sample.read_bytes(), model, table)


def add_request(body: bytes, model: ServedModel, table: Table) -> None:
    arrays = model.decode(body, media_types.JSON)
    table.add_inputs(arrays)
    table.add_answer(json.loads(model.answer(model.predict(arrays), media_types.JSON).body))


def _requests(path: Path, model: ServedModel) -> Iterator[dict[str, Any]]:
    suffix = path.suffix.lower()
    if not path.is_file():
        raise BaselineError(f"--baseline {path}: no such file")
    if suffix == ".json":
        yield _json_request(path)
        return
    if suffix == ".csv":
        names, rows, text = _csv_rows(path)
    elif suffix in (".jsonl", ".ndjson"):
        names, rows, text = _json_lines_rows(path)
    elif suffix in (".parquet", ".pq"):
        names, rows, text = _parquet_rows(path)
    else:
        raise BaselineError(f"--baseline {path.name}: {suffix or 'no suffix'} is not read; give {BASELINE_FORMS}")
    if not rows:
        raise BaselineError(f"--baseline {path}: holds no rows")
    names, rows = _model_columns(path, model, names, rows)
    for start in range(0, len(rows), CHUNK_ROWS):
        yield sample_request(Sample(None, names, rows[start : start + CHUNK_ROWS], text), columns_of(model.manifest))


def _json_request(path: Path) -> dict[str, Any]:
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise BaselineError(f"--baseline {path}: not JSON ({error})") from None
    if isinstance(loaded, list):
        return {"instances": loaded}
    if not isinstance(loaded, dict):
        raise BaselineError(f"--baseline {path}: holds neither a request body nor a list of rows")
    return loaded


def _csv_rows(path: Path) -> tuple[list[str], list[list[Any]], bool]:
    try:
        with path.open(encoding="utf-8-sig", newline="") as stream:
            reader = csv.reader(stream, strict=True)
            header = next(reader, None)
            rows: list[list[Any]] = [cells for cells in reader if cells and (len(cells) > 1 or cells[0].strip())]
    except (csv.Error, UnicodeDecodeError) as error:
        raise BaselineError(f"--baseline {path}: not readable CSV ({error})") from None
    if header is None:
        raise BaselineError(f"--baseline {path}: needs a header row naming the columns")
    for number, cells in enumerate(rows, start=2):
        if len(cells) != len(header):
            raise BaselineError(f"--baseline {path}: line {number} has {len(cells)} cells, the header {len(header)}")
    return [name.strip() for name in header], rows, True


def _json_lines_rows(path: Path) -> tuple[list[str], list[list[Any]], bool]:
    records: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if line.strip():
                try:
                    record = json.loads(line)
                except ValueError as error:
                    raise BaselineError(f"--baseline {path}: line {number} is not JSON ({error})") from None
                if not isinstance(record, dict):
                    raise BaselineError(f"--baseline {path}: line {number} is not a row object")
                records.append(record)
    return _from_records(records)


def _parquet_rows(path: Path) -> tuple[list[str], list[list[Any]], bool]:
    try:
        import pyarrow.parquet as parquet
    except ImportError:
        raise BaselineError("--baseline: reading Parquet needs pyarrow (pip install 'servestack[parquet]')") from None
    try:
        records = parquet.read_table(path).to_pylist()
    except Exception as error:  # pyarrow raises its own error types for a file that is not Parquet
        raise BaselineError(f"--baseline {path}: not readable Parquet ({str(error)[:200]})") from None
    return _from_records(records)


def _from_records(records: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]], bool]:
    names = [str(name) for name in records[0]] if records else []

    def value(record: dict[str, Any], name: str) -> Any:
        found = record.get(name)
        return None if isinstance(found, float) and math.isnan(found) else found  # NaN: JSON's null

    return names, [[value(record, name) for name in names] for record in records], False


def _model_columns(
    path: Path, model: ServedModel, names: list[str], rows: list[list[Any]]
) -> tuple[list[str], list[list[Any]]]:
    """Only the model's columns, in the model's order; a column it takes that the file lacks is refused."""
    wanted = column_names(model.manifest)
    if not wanted:
        return names, rows
    missing = [name for name in wanted if name not in names]
    if missing:
        raise BaselineError(f"--baseline {path}: has no column {missing[0]!r}; the model takes the columns {wanted}")
    positions = [names.index(name) for name in wanted]
    return wanted, [[row[position] for position in positions] for row in rows]
