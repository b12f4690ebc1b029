"""The rows `servestack models optimize` measures on and calibrates with: a JSON Lines file, or the package's
own sample request.

A rows file holds one row per line: what one element of a request's `"instances"` holds for a one-input model
(the form batch input files take), or an object keyed by input name for a model with several inputs (each
value one row of that input), optionally wrapped as `{"instance": <row>, "label": <class>}`. The sample is
`sample-request.json` as `models push` wrote it, in any form a request may take. Both go through the same
decoding as a request (and the package's `preprocess` hook, if any), so the arrays measured are the arrays
served: a dict of input name to array, whatever the inputs' types.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from servestack.inference.manifest import Manifest
    from servestack.inference.registry import ModelRegistry
    from servestack.inference.service import ServedModel

SAMPLE_FILE = "sample-request.json"
# Rows decoded per call: well under the serving default of 10,000 rows per request.
CHUNK_ROWS = 1000
ROW_FORM = (
    'one row per line: [..] (as in "instances"), or {"<input>": [..], ...} for a model with several inputs; '
    'either may be wrapped as {"instance": <row>, "label": <class>}'
)


@dataclass(frozen=True)
class Rows:
    """Decoded rows: input arrays per chunk, the label of every row when all rows carry one, and what to call
    row i in a message (`line 17 of eval.jsonl`, `row 3 of sample-request.json`)."""

    source: str
    chunks: list[dict[str, np.ndarray]]
    labels: list[Any] | None
    numbers: list[int]
    unit: str = "line"

    @property
    def count(self) -> int:
        return sum(len(next(iter(chunk.values()))) for chunk in self.chunks)

    def where(self, index: int) -> str:
        return f"{self.unit} {self.numbers[index]} of {self.source}"

    def first(self, rows: int) -> dict[str, np.ndarray]:
        """`rows` rows (the first ones, repeated when there are fewer), as one batch."""
        import numpy as np

        names = list(self.chunks[0])
        joined = {name: np.concatenate([chunk[name] for chunk in self.chunks]) for name in names}
        available = len(joined[names[0]])
        index = np.arange(rows) % available
        return {name: np.ascontiguousarray(values[index]) for name, values in joined.items()}


def invalid(message: str, field: str, value: Any = None, allowed: str | None = None) -> Exception:
    from servestack.inference.errors import InvalidInput

    return InvalidInput(message, field=field, value=value, allowed=allowed)


# ------------------------------------------------------------------------------------------ rows files


def parse_rows_file(path: Path) -> tuple[list[bytes], list[Any] | None, list[int]]:
    """Each line's row as JSON text, the labels (None when no line has one) and the line numbers."""
    import orjson

    try:
        text = path.read_bytes()
    except OSError as exc:
        raise invalid(f"{path}: {exc.strerror or exc}", field=str(path), allowed="a readable JSON Lines file") from None
    rows: list[bytes] = []
    labels: list[Any] = []
    numbers: list[int] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise invalid(
                f"{path.name} line {number}: not JSON ({exc})", field=f"{path.name} line {number}", allowed=ROW_FORM
            ) from None
        if isinstance(value, dict) and "instance" in value and set(value) <= {"instance", "label"}:
            rows.append(orjson.dumps(value["instance"]))
            labels.append(value.get("label"))
        else:
            rows.append(line.strip())
            labels.append(None)
        numbers.append(number)
    if not rows:
        raise invalid(f"{path.name}: no rows", field=path.name, value="empty", allowed=ROW_FORM)
    labelled = [label is not None for label in labels]
    if any(labelled) and not all(labelled):
        missing = numbers[labelled.index(False)]
        raise invalid(
            f"{path.name} line {missing}: has no label while other lines have one",
            field=f"{path.name} line {missing}",
            allowed="a label on every line (accuracy) or on none (agreement with the float model)",
        )
    return rows, (labels if all(labelled) else None), numbers


def rows_body(manifest: Manifest, rows: list[bytes], source: str, numbers: list[int]) -> bytes:
    """A request body holding `rows`: `{"instances": [...]}` for a one-input model; for several inputs, rows
    keyed by input name, turned into the columnar `{"inputs": {name: [row, ...]}}`."""
    if len(manifest.inputs) == 1:
        return b'{"instances":[' + b",".join(rows) + b"]}"
    import orjson

    names = [spec.name for spec in manifest.inputs]
    columns: dict[str, list[Any]] = {name: [] for name in names}
    for number, raw in zip(numbers, rows, strict=True):
        row = orjson.loads(raw)
        if not isinstance(row, dict) or set(row) != set(names):
            keys = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise invalid(
                f"{source} line {number}: a row of {manifest.key} is an object with one value per input",
                field=f"{source} line {number}",
                value=keys,
                allowed=f"an object with the keys {names}",
            )
        for name in names:
            columns[name].append(row[name])
    return orjson.dumps({"inputs": columns})


def decode_rows(
    model: ServedModel, source: str, rows: list[bytes], numbers: list[int], labels: list[Any] | None
) -> Rows:
    """Rows through the request decoder, in chunks; a bad row is reported with its line number."""
    from servestack.inference import media_types
    from servestack.inference.errors import ServingError

    manifest = model.manifest
    chunks: list[dict[str, np.ndarray]] = []
    for start in range(0, len(rows), CHUNK_ROWS):
        part, part_numbers = rows[start : start + CHUNK_ROWS], numbers[start : start + CHUNK_ROWS]
        try:
            chunks.append(model.decode(rows_body(manifest, part, source, part_numbers), media_types.JSON))
        except ServingError:
            for row, line in zip(part, part_numbers, strict=True):
                try:
                    model.decode(rows_body(manifest, [row], source, [line]), media_types.JSON)
                except ServingError as error:
                    raise invalid(
                        f"{source} line {line}: {error.message}",
                        field=f"{source} line {line}",
                        value=error.value,
                        allowed=error.allowed,
                    ) from None
            raise
    return Rows(source, chunks, labels, numbers)


# ------------------------------------------------------------------------------------------ the sample


def sample_request(registry: ModelRegistry, name: str, version: str) -> bytes | None:
    """The bytes of the package's `sample-request.json`, if it has one."""
    return registry.store.read(f"{registry.prefix}{name}/{version}/{SAMPLE_FILE}")


def decode_sample(model: ServedModel, body: bytes) -> Rows:
    """The sample request's rows, decoded as a request in any form the model accepts."""
    from servestack.inference import media_types
    from servestack.inference.errors import ServingError

    try:
        arrays = model.decode(body, media_types.JSON)
    except ServingError as error:
        raise invalid(
            f"{model.manifest.key}: its {SAMPLE_FILE} is refused by the model: {error.message}",
            field=SAMPLE_FILE,
            value=error.value,
            allowed="pass --eval rows.jsonl (and --calibration for static-int8)",
        ) from None
    count = len(next(iter(arrays.values())))
    return Rows(SAMPLE_FILE, [arrays], None, list(range(1, count + 1)), unit="row")
