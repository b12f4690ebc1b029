"""Wire formats shared by every mode: JSON (`instances` or named `inputs`), CSV rows and `.npy`.

Decoding turns a body into arrays that match the manifest, validating a whole batch at once as an array;
only when that fails do we walk the rows to name the offending element. Encoding turns model outputs into
the response type the caller accepts. The runtime never sees JSON.
"""

from __future__ import annotations

import io
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from models.errors import InvalidInput, NotAcceptable, UnsupportedMediaType
from models.manifest import Manifest, TensorSpec

JSON = "application/json"
CSV = "text/csv"
NPY = "application/x-npy"
READABLE_TYPES = (JSON, CSV, NPY)
WRITABLE_TYPES = (JSON, CSV, NPY)

Arrays = dict[str, np.ndarray]


@dataclass(frozen=True, slots=True)
class Encoded:
    body: bytes
    media_type: str


def media_type_of(header: str | None) -> str:
    """`application/json; charset=utf-8` -> `application/json`; a missing header means JSON."""
    if not header:
        return JSON
    return header.split(";", 1)[0].strip().lower() or JSON


def negotiate(accept: str | None) -> str:
    """Pick the first type in `Accept` that we can write; no header or a wildcard means JSON."""
    if not accept:
        return JSON
    for part in accept.split(","):
        media_type = part.split(";", 1)[0].strip().lower()
        if media_type in WRITABLE_TYPES:
            return media_type
        if media_type in ("*/*", "application/*", ""):
            return JSON
        if media_type == "text/*":
            return CSV
    raise NotAcceptable(
        f"Accept: {accept!r} names no type this server can write",
        field="Accept",
        value=accept,
        allowed=", ".join(WRITABLE_TYPES),
    )


# ---------------------------------------------------------------------------------------------- decoding


def decode_body(body: bytes, content_type: str) -> Any:
    """Parse the body into its natural Python shape: a JSON document, CSV rows of strings, or an ndarray."""
    if content_type == JSON:
        return _parse_json(body)
    if content_type == CSV:
        return _parse_csv(body)
    if content_type == NPY:
        return _parse_npy(body)
    raise UnsupportedMediaType(
        f"Content-Type: {content_type!r} is not supported",
        field="Content-Type",
        value=content_type,
        allowed=", ".join(READABLE_TYPES),
    )


def _parse_json(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as strict_error:
        # Python's json module writes NaN/Infinity literals; parse them so validation can name the element.
        try:
            return json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise InvalidInput(
                f"body: malformed JSON ({strict_error})", field="body", allowed="a JSON document"
            ) from None


def _parse_csv(body: bytes) -> list[list[str]]:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput("body: CSV must be UTF-8 text", field="body", allowed="UTF-8 CSV rows") from None
    return [line.split(",") for line in text.splitlines() if line.strip()]


_NPY_MAGIC = b"\x93NUMPY"
# What np.save writes for a plain C-ordered array, e.g. {'descr': '<f4', 'fortran_order': False, 'shape': (32, 64), }
_NPY_HEADER = re.compile(rb"\{'descr': '([<>|=]?[biuf]\d{1,2})', 'fortran_order': False, 'shape': \(([\d, ]*)\), \}")


def _parse_npy(body: bytes) -> np.ndarray:
    """Read the common case (a C-ordered numeric array) straight from the buffer; np.load parses the header
    with Python's tokenizer, which costs more than inferring a small batch. Anything else goes to np.load."""
    if body[:6] == _NPY_MAGIC and len(body) >= 10:
        major = body[6]
        size_bytes = 2 if major == 1 else 4
        start = 8 + size_bytes
        end = start + int.from_bytes(body[8:start], "little")
        header = _NPY_HEADER.match(body, start, end)
        if header is not None:
            dtype = np.dtype(header.group(1).decode())
            shape = tuple(int(dim) for dim in header.group(2).split(b",") if dim.strip())
            if len(body) - end == math.prod(shape) * dtype.itemsize:
                return np.frombuffer(body, dtype=dtype, offset=end).reshape(shape)
    return _parse_npy_slowly(body)


def _parse_npy_slowly(body: bytes) -> np.ndarray:
    try:
        # allow_pickle=False: an .npy body is data, never code.
        loaded = np.load(io.BytesIO(body), allow_pickle=False)
    except ValueError as exc:
        raise InvalidInput(
            f"body: not a readable .npy array ({exc})", field="body", allowed="numpy .npy, no object dtype"
        ) from None
    except (OSError, EOFError) as exc:
        raise InvalidInput(f"body: not a readable .npy array ({exc})", field="body", allowed="numpy .npy") from None
    if not isinstance(loaded, np.ndarray):
        raise InvalidInput("body: an .npz archive, not one .npy array", field="body", allowed="numpy .npy")
    return loaded


def payload_to_arrays(payload: Any, content_type: str, manifest: Manifest) -> dict[str, tuple[str, Any]]:
    """Map a decoded payload to `{input name: (field path for errors, raw value)}`."""
    if content_type == CSV:
        return {_single_input(manifest, "CSV").name: ("csv", payload)}
    if content_type == NPY:
        return {_single_input(manifest, ".npy").name: ("body", payload)}
    if not isinstance(payload, dict):
        raise InvalidInput(
            f"body: expected a JSON object, got {type(payload).__name__}",
            field="body",
            value=type(payload).__name__,
            allowed='{"instances": [[...], ...]} or {"inputs": {"<name>": [...]}}',
        )
    if ("instances" in payload) == ("inputs" in payload):
        raise InvalidInput(
            "body: give exactly one of 'instances' or 'inputs'",
            field="body",
            value=sorted(payload)[:5],
            allowed='{"instances": [[...], ...]} or {"inputs": {"<name>": [...]}}',
        )
    if "instances" in payload:
        return {_single_input(manifest, "'instances'").name: ("instances", payload["instances"])}
    named = payload["inputs"]
    if not isinstance(named, dict):
        raise InvalidInput(
            "inputs: expected an object of input name to rows",
            field="inputs",
            value=type(named).__name__,
            allowed=f"an object with keys {[spec.name for spec in manifest.inputs]}",
        )
    return {name: (f"inputs.{name}", value) for name, value in named.items()}


def _single_input(manifest: Manifest, form: str) -> TensorSpec:
    if len(manifest.inputs) != 1:
        names = [spec.name for spec in manifest.inputs]
        raise InvalidInput(
            f"{form} needs a single-input model; {manifest.key} has inputs {names}: send JSON 'inputs'",
            field="body",
            value=form,
            allowed='{"inputs": {"<name>": [...]}}',
        )
    return manifest.inputs[0]


def fast_instances(payload: Any, manifest: Manifest, *, max_batch_rows: int) -> Arrays | None:
    """The common request, `{"instances": [[numbers...], ...]}` for a one-input model with fixed numeric rows,
    checked in one pass. Anything else, or anything wrong, returns None: `validate_inputs` then decides,
    and names the problem. Both accept and refuse exactly the same bodies (tests/unit/test_codecs.py)."""
    if type(payload) is not dict or len(payload) != 1 or len(manifest.inputs) != 1:
        return None
    value = payload.get("instances")
    spec = manifest.inputs[0]
    if type(value) is not list or not 0 < len(value) <= max_batch_rows or spec.dtype == "string":
        return None
    try:
        array = np.asarray(value)
    except ValueError:
        return None
    target = spec.numpy_dtype
    if array.dtype.kind not in _NUMERIC_KINDS[target.kind] or array.shape[1:] != spec.shape[1:]:
        return None
    if array.dtype.kind == "f" and (manifest.allow_non_finite or not _finite_in(array, target)):
        return None
    return {spec.name: array.astype(target, copy=False)}


def validate_inputs(raw: Mapping[str, tuple[str, Any]], manifest: Manifest, *, max_batch_rows: int) -> Arrays:
    """Turn raw values into arrays of the manifest's dtype and shape, or raise `InvalidInput`."""
    expected = {spec.name: spec for spec in manifest.inputs}
    if raw.keys() != expected.keys():
        unknown = sorted(set(raw) - set(expected))
        missing = sorted(set(expected) - set(raw))
        raise InvalidInput(
            f"inputs: unknown {unknown} / missing {missing}",
            field="inputs",
            value=sorted(raw),
            allowed=str(sorted(expected)),
        )
    arrays = {name: _to_array(field, value, expected[name], manifest) for name, (field, value) in raw.items()}
    batch_sizes = {name: array.shape[0] for name, array in arrays.items()}
    if len(batch_sizes) > 1 and len(set(batch_sizes.values())) > 1:
        raise InvalidInput(
            f"inputs: every input needs the same number of rows, got {batch_sizes}",
            field="inputs",
            value=batch_sizes,
            allowed="equal row counts",
        )
    rows = next(iter(batch_sizes.values()))
    if rows == 0:
        raise InvalidInput("empty batch: send at least one row", field="instances", value=[], allowed="1 or more rows")
    if rows > max_batch_rows:
        raise InvalidInput(
            f"batch of {rows} rows is over the limit",
            field="instances",
            value=rows,
            allowed=f"1..{max_batch_rows} rows",
        )
    return arrays


_NUMERIC_KINDS = {"f": "fiu", "i": "iu", "u": "u", "b": "b"}
_SEQUENCES = (list, np.ndarray)


def _to_array(field: str, value: Any, spec: TensorSpec, manifest: Manifest) -> np.ndarray:
    """Validate one input as a whole array; walk the elements only to explain a failure."""
    if field == "csv":
        return _csv_to_array(value, spec, manifest)
    if not isinstance(value, _SEQUENCES):
        raise InvalidInput(
            f"{field}: expected a list of rows, got {type(value).__name__}",
            field=field,
            value=value,
            allowed=f"rows of shape {_shape_text(spec.row_shape)}",
        )
    try:
        array = np.asarray(value)
    except ValueError:  # ragged nesting: numpy refuses to build the array
        raise _explain(field, value, spec) from None
    if array.dtype == object:
        raise _explain(field, value, spec)
    target = spec.numpy_dtype
    if spec.dtype == "string":
        if array.dtype.kind != "U":
            raise _explain(field, value, spec)
        array = array.astype(object)
    elif array.dtype.kind not in _NUMERIC_KINDS[target.kind]:
        raise _explain(field, value, spec)
    _check_shape(field, array, spec)
    if spec.dtype != "string":
        array = _cast(field, array, target, manifest)
    return array


def _csv_to_array(rows: list[list[str]], spec: TensorSpec, manifest: Manifest) -> np.ndarray:
    width = spec.row_shape[0] if len(spec.row_shape) == 1 else None
    values: list[list[float]] = []
    for line_number, cells in enumerate(rows, start=1):
        if width is not None and len(cells) != width:
            raise InvalidInput(
                f"csv line {line_number}: {len(cells)} columns, the model takes {width}",
                field=f"csv line {line_number}",
                value=f"{len(cells)} columns",
                allowed=f"{width} columns",
            )
        row: list[float] = []
        for column_number, cell in enumerate(cells, start=1):
            try:
                row.append(float(cell))
            except ValueError:
                raise InvalidInput(
                    f"csv line {line_number}, column {column_number}: {cell.strip()!r} is not a number",
                    field=f"csv line {line_number} column {column_number}",
                    value=cell.strip(),
                    allowed=f"{spec.dtype} numbers",
                ) from None
        values.append(row)
    if spec.dtype == "string" or np.dtype(spec.dtype).kind not in "f":
        raise InvalidInput(
            f"CSV carries numbers; input {spec.name!r} takes {spec.dtype}",
            field="Content-Type",
            value=CSV,
            allowed="application/json or application/x-npy",
        )
    array = np.asarray(values, dtype=np.float64).reshape(len(values), -1) if values else np.empty((0,))
    if array.size:
        _check_shape("csv", array, spec)
        array = _cast("csv", array, spec.numpy_dtype, manifest)
    return array


def _check_shape(field: str, array: np.ndarray, spec: TensorSpec) -> None:
    if array.shape[1:] == spec.shape[1:] and array.shape[0] > 0:  # the common case: every row dimension fixed
        return
    if array.ndim == len(spec.shape) - 1 and array.ndim >= 1 and array.size > 0:
        raise InvalidInput(
            f"{field}: got a single row of shape {list(array.shape)}; send a list of rows, e.g. [[...]]",
            field=field,
            value=f"shape {list(array.shape)}",
            allowed=f"rows of shape {_shape_text(spec.row_shape)}",
        )
    if array.shape[:1] == (0,):
        return
    if array.ndim != len(spec.shape) or any(
        expected is not None and expected != actual for expected, actual in zip(spec.shape, array.shape, strict=False)
    ):
        where = field
        if array.ndim == len(spec.shape):
            for axis, (expected, actual) in enumerate(zip(spec.row_shape, array.shape[1:], strict=True), start=1):
                if expected is not None and expected != actual:
                    where = f"{field}[0]" if axis == 1 else field
                    raise InvalidInput(
                        f"{where}: each row needs {expected} values on axis {axis}, got {actual}",
                        field=where,
                        value=actual,
                        allowed=f"{expected} (rows of shape {_shape_text(spec.row_shape)})",
                    )
        raise InvalidInput(
            f"{field}: shape {list(array.shape)} does not fit the model input {spec.name!r}",
            field=field,
            value=f"shape {list(array.shape)}",
            allowed=f"[batch, {', '.join(_dim_text(d) for d in spec.row_shape)}]",
        )


_FLOAT_MAX: dict[str, float] = {}


def _finite_in(array: np.ndarray, target: np.dtype[Any]) -> bool:
    """Every value finite and within `target`'s range (NaN fails the comparison), in one reduction; so the
    cast that follows can neither overflow to infinity nor warn."""
    limit = _FLOAT_MAX.get(target.char)
    if limit is None:
        limit = _FLOAT_MAX[target.char] = float(np.finfo(target).max) if target.kind == "f" else np.inf
    return array.size == 0 or bool(np.abs(array).max() <= limit)


def _cast(field: str, array: np.ndarray, target: np.dtype[Any], manifest: Manifest) -> np.ndarray:
    """Cast to the model's dtype; floats must be finite and fit it, unless the manifest allows non-finite."""
    if array.dtype.kind == "f" and target.kind == "f":
        if manifest.allow_non_finite:
            with np.errstate(over="ignore"):  # the model asked for infinities; overflow is one way to get them
                return array.astype(target, copy=False)
        if not _finite_in(array, target):
            _check_finite(field, array)
            _check_range(field, array, target)
    return array.astype(target, copy=False)


def _check_range(field: str, array: np.ndarray, target: np.dtype[Any]) -> None:
    limit = float(np.finfo(target).max)
    index = tuple(int(i) for i in np.argwhere(np.abs(array) > limit)[0])
    path = field + "".join(f"[{i}]" for i in index)
    raise InvalidInput(
        f"{path}: {float(array[index])!r} does not fit {target.name}",
        field=path,
        value=float(array[index]),
        allowed=f"finite numbers within +-{limit:.4g}",
    )


def _check_finite(field: str, array: np.ndarray) -> None:
    finite = np.isfinite(array)
    if not finite.all():
        index = tuple(int(i) for i in np.argwhere(~finite)[0])
        path = field + "".join(f"[{i}]" for i in index)
        raise InvalidInput(
            f"{path}: {float(array[index])!r} is not allowed; this model takes finite numbers only",
            field=path,
            value=str(array[index]),
            allowed="finite numbers (no NaN or Infinity)",
        )


def _explain(field: str, value: Any, spec: TensorSpec) -> InvalidInput:
    """Find the first element that stops `value` from being an array of `spec`, and say what it is."""
    wanted = "strings" if spec.dtype == "string" else ("integers" if spec.numpy_dtype.kind in "iu" else "numbers")
    row_shape = spec.row_shape

    def walk(node: Any, path: str, depth: int) -> InvalidInput | None:
        if depth < len(spec.shape):
            if not isinstance(node, _SEQUENCES):
                return InvalidInput(
                    f"{path}: expected a list, got {type(node).__name__} {node!r}",
                    field=path,
                    value=node,
                    allowed=f"rows of shape {_shape_text(row_shape)}",
                )
            expected = spec.shape[depth] if depth > 0 else None
            if expected is not None and len(node) != expected:
                return InvalidInput(
                    f"{path}: {len(node)} values, the model takes {expected}",
                    field=path,
                    value=len(node),
                    allowed=f"{expected} values",
                )
            for index, child in enumerate(node):
                problem = walk(child, f"{path}[{index}]", depth + 1)
                if problem is not None:
                    return problem
            return None
        ok = (
            isinstance(node, str)
            if spec.dtype == "string"
            else isinstance(node, int | float | np.number) and not isinstance(node, bool)
        )
        if spec.numpy_dtype.kind in "iu" and isinstance(node, float):
            ok = False
        if not ok:
            return InvalidInput(
                f"{path}: {node!r} ({type(node).__name__}) is not allowed; input {spec.name!r} takes {wanted}",
                field=path,
                value=node,
                allowed=f"{spec.dtype} {wanted}",
            )
        return None

    problem = walk(value, field, 0)
    if problem is not None:
        return problem
    lengths = sorted({len(row) for row in value if isinstance(row, list)})
    return InvalidInput(
        f"{field}: rows of different lengths {lengths}",
        field=field,
        value=lengths,
        allowed=f"rows of shape {_shape_text(row_shape)}",
    )


def _dim_text(size: int | None) -> str:
    return "any" if size is None else str(size)


def _shape_text(shape: Sequence[int | None]) -> str:
    return "[" + ", ".join(_dim_text(size) for size in shape) + "]"


# ---------------------------------------------------------------------------------------------- encoding


def default_response(manifest: Manifest, outputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Predictions, probabilities and class labels when the manifest names them; other outputs by name."""
    primary, probabilities = manifest.primary_output, manifest.probability_output
    response: dict[str, Any] = {"model": manifest.name, "version": manifest.version, "predictions": outputs[primary]}
    if probabilities is not None:
        response["probabilities"] = outputs[probabilities]
    if manifest.labels is not None:
        response["labels"] = _label_names(manifest.labels, np.asarray(outputs[primary]).reshape(-1))
    if len(outputs) > (2 if probabilities is not None else 1):
        extra = {name: value for name, value in outputs.items() if name not in (primary, probabilities)}
        if not {"predictions", "probabilities"}.intersection(extra):
            response["outputs"] = extra
    return response


def _label_names(labels: tuple[str, ...], predictions: np.ndarray) -> list[str]:
    count = len(labels)
    return [labels[i] if isinstance(i, int) and 0 <= i < count else str(i) for i in predictions.tolist()]


def encode_response(fields: Mapping[str, Any], media_type: str) -> Encoded:
    """Write the response fields in the negotiated type. CSV and .npy carry the `predictions` field."""
    if media_type == JSON:
        return Encoded(orjson.dumps(fields, option=orjson.OPT_SERIALIZE_NUMPY, default=json_default), JSON)
    predictions = np.asarray(fields.get("predictions"))
    if media_type == NPY:
        buffer = io.BytesIO()
        np.save(buffer, predictions, allow_pickle=False)
        return Encoded(buffer.getvalue(), NPY)
    table = predictions.reshape(predictions.shape[0], -1) if predictions.ndim else predictions.reshape(1, 1)
    probabilities = fields.get("probabilities")
    if probabilities is not None:
        # String predictions (class names) keep their text: the row becomes objects instead of floats.
        cell = np.float64 if table.dtype.kind in "biuf" else object
        table = np.hstack([table.astype(cell), np.asarray(probabilities).astype(cell)])
    lines = (",".join(_csv_cell(v) for v in row) for row in table)
    return Encoded(("\n".join(lines) + "\n").encode(), CSV)


def json_default(value: Any) -> Any:
    """orjson writes numeric arrays itself and hands the rest here: string outputs (object arrays, e.g. a
    classifier trained on class names) become lists."""
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _csv_cell(value: Any) -> str:
    if isinstance(value, float | np.floating) and float(value).is_integer():
        return str(int(value))
    return str(value.item() if isinstance(value, np.generic) else value)
