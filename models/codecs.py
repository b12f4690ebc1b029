"""Wire formats shared by every mode: JSON (`instances` or named `inputs`), CSV rows and `.npy`.

Decoding turns a body into arrays that match the manifest, validating a whole batch at once as an array;
only when that fails do we walk the rows to name the offending element (rows by column name go through
models/request_forms.py). Answers are built in models/answers.py, on the `.npy` and JSON primitives at the end
of this module. The runtime never sees JSON.

Decoding is bounded whatever the body holds, and every malformed body is an `InvalidInput` (or another
`ServingError`), never another exception:
- size: the transports cap the body; a `Content-Encoding` is decoded only up to that cap (`decode_content`);
- values: a body holding more values than `max_batch_rows` rows of the model can is refused before parsing
  (`check_value_count`: every JSON or CSV value but the first follows a comma, so counting commas bounds them);
- depth: orjson refuses nesting past 1,024 levels, and the fallback parser's RecursionError is caught;
- `.npy`: the header is parsed without `np.load`, the dtype must be one of `NPY_DTYPES`, and the shape must
  account for the body's bytes exactly and fit the model's signature before any array is allocated (the
  array is a view of the body until it is cast);
- numbers: CSV cells are plain ASCII decimals (`1_0`, `١٢` or `true` are not numbers, though Python's
  float() reads the first two), and JSON `true`/`false` are never read as 1/0 by a numeric input.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import warnings
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import orjson

from models.errors import InvalidInput, NotAcceptable, PayloadTooLarge, UnsupportedMediaType, short_repr
from models.manifest import Manifest, TensorSpec

JSON = "application/json"
CSV = "text/csv"
NPY = "application/x-npy"
READABLE_TYPES = (JSON, CSV, NPY)
WRITABLE_TYPES = (JSON, CSV, NPY)
# Variants a parameter asks for (RFC 4180's `header`; ours, `probabilities=by-label`): the request and answer
# types a request carries through every mode (an async job records them), each read or written as its base type.
CSV_HEADER = "text/csv; header=present"
JSON_BY_LABEL = "application/json; probabilities=by-label"
ANSWER_TYPES = (*WRITABLE_TYPES, CSV_HEADER, JSON_BY_LABEL)

Arrays = dict[str, np.ndarray]


class Encoded(NamedTuple):
    """A response body and its media type (a tuple: built for every answer, it costs a tuple's allocation)."""

    body: bytes
    media_type: str


def media_type_of(header: str | None) -> str:
    """`application/json; charset=utf-8` -> `application/json`; a missing header means JSON."""
    if not header:
        return JSON
    return header.split(";", 1)[0].strip().lower() or JSON


def request_type_of(header: str | None) -> str:
    """`media_type_of`, keeping `header=present` of a CSV type: `CSV_HEADER`, whose first row names the columns."""
    media_type = media_type_of(header)
    if media_type == CSV and header is not None and _has_parameter(header, "header", "present"):
        return CSV_HEADER
    return media_type


def answer_type_of(accept: str | None) -> str:
    """`negotiate`, keeping what a parameter of the chosen type asks for: `text/csv; header=present` (a header
    row naming the columns) -> `CSV_HEADER`; `application/json; probabilities=by-label` -> `JSON_BY_LABEL`."""
    chosen = negotiate(accept)
    if accept is None or ";" not in accept or chosen == NPY:
        return chosen
    for part in accept.split(",")[:MAX_ACCEPT_RANGES]:
        if part.split(";", 1)[0].strip().lower() != chosen:
            continue
        if chosen == CSV and _has_parameter(part, "header", "present"):
            return CSV_HEADER
        if chosen == JSON and _has_parameter(part, "probabilities", "by-label"):
            return JSON_BY_LABEL
    return chosen


def _has_parameter(header: str, name: str, value: str) -> bool:
    for parameter in header.split(";")[1:]:
        key, _, found = parameter.partition("=")
        if key.strip().lower() == name and found.strip().strip('"').lower() == value:
            return True
    return False


_QVALUE = re.compile(r"0(?:\.\d{0,3})?|1(?:\.0{0,3})?")
MAX_ACCEPT_RANGES = 32


def negotiate(accept: str | None) -> str:
    """The type to answer in: the writable type with the highest quality in `Accept` (RFC 9110 12.5.1), the
    earlier-listed one on a tie, JSON first among those a wildcard covers. `q=0` means "not this type"; no
    header means JSON."""
    if not accept or not accept.strip():
        return JSON
    ranges: list[tuple[str, float]] = []
    for part in accept.split(",")[:MAX_ACCEPT_RANGES]:
        media_range, *parameters = part.split(";")
        quality = 1.0
        for parameter in parameters:
            key, _, value = parameter.partition("=")
            if key.strip().lower() == "q":
                value = value.strip()
                quality = float(value) if _QVALUE.fullmatch(value) else 0.0  # a malformed q accepts nothing
        ranges.append((media_range.strip().lower() or "*/*", quality))
    best: tuple[float, int, int] | None = None
    chosen = None
    for preference, media_type in enumerate(WRITABLE_TYPES):
        major = media_type.split("/", 1)[0]
        # The most specific range that matches decides the type's quality (RFC 9110 12.5.1).
        for pattern in (media_type, f"{major}/*", "*/*"):
            matches = [(quality, order) for order, (name, quality) in enumerate(ranges) if name == pattern]
            if matches:
                quality, order = max(matches, key=lambda match: (match[0], -match[1]))
                rank = (quality, -order, -preference)
                if quality > 0 and (best is None or rank > best):
                    best, chosen = rank, media_type
                break
    if chosen is None:
        raise NotAcceptable(
            f"Accept: {accept!r} names no type this server can write",
            field="Accept",
            value=accept,
            allowed=", ".join(WRITABLE_TYPES),
        )
    return chosen


# ---------------------------------------------------------------------------------------------- content coding

CONTENT_CODINGS = ("gzip", "x-gzip", "deflate", "identity")


def decode_content(body: bytes, encoding: str | None, limit: int) -> bytes:
    """Undo `Content-Encoding` (gzip or deflate, one of them), never producing more than `limit` bytes: a
    small bomb that inflates past the limit is refused with 413 as soon as it does. Anything else is 415."""
    codings = [c.strip().lower() for c in (encoding or "").split(",") if c.strip() and c.strip().lower() != "identity"]
    if not codings:
        return body
    if len(codings) > 1 or codings[0] not in CONTENT_CODINGS:
        raise UnsupportedMediaType(
            f"Content-Encoding: {encoding!r} is not supported",
            field="Content-Encoding",
            value=encoding,
            allowed="gzip or deflate (one coding), or identity",
        )
    # 47 = 32 + 15: zlib detects a gzip or zlib header itself; raw deflate (no header) is -15.
    wbits = 47 if codings[0] != "deflate" or body[:1] == b"\x78" else -15
    inflater = zlib.decompressobj(wbits)
    try:
        decoded = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise InvalidInput(
            f"body: not valid {codings[0]} data ({exc})",
            field="Content-Encoding",
            value=encoding,
            allowed=f"a body compressed with {codings[0]}",
        ) from None
    if len(decoded) > limit:
        raise PayloadTooLarge(
            f"body: decompresses to more than {limit} bytes",
            field="body",
            value=f"> {limit} bytes decoded",
            allowed=f"<= {limit} bytes after decoding",
        )
    if not inflater.eof or inflater.unused_data:
        raise InvalidInput(
            f"body: {codings[0]} data is truncated or followed by other bytes",
            field="Content-Encoding",
            value=encoding,
            allowed=f"one complete {codings[0]} stream",
        )
    return decoded


# ---------------------------------------------------------------------------------------------- decoding


def decode_body(body: bytes, content_type: str) -> Any:
    """Parse the body into its natural Python shape: a JSON document, CSV rows of strings, or an ndarray."""
    if content_type == JSON:
        return _parse_json(body)
    if content_type in (CSV, CSV_HEADER):
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
        malformed = InvalidInput(f"body: malformed JSON ({strict_error})", field="body", allowed="a JSON document")
        if b"NaN" not in body and b"Infinity" not in body:
            raise malformed from None
        # Python's json module writes NaN/Infinity literals; parse them so validation can name the element.
        try:
            return json.loads(body)
        except RecursionError:
            raise InvalidInput(
                "body: JSON nested too deeply", field="body", allowed="a JSON document nested < 1000 levels"
            ) from None
        except (ValueError, UnicodeDecodeError):
            raise malformed from None


def _parse_csv(body: bytes) -> list[list[str]]:
    """Rows of cells. Only `\n` and `\r\n` end a row (str.splitlines would also split on `\x1c`, `\u2028`...,
    turning one line into two rows); quoted cells are unquoted; a leading byte order mark is dropped."""
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InvalidInput("body: CSV must be UTF-8 text", field="body", allowed="UTF-8 CSV rows") from None
    try:
        rows = list(csv.reader(io.StringIO(text, newline=""), strict=True))
    except csv.Error as exc:
        raise InvalidInput(
            f"body: malformed CSV ({exc})", field="body", allowed="comma-separated numbers, optionally quoted"
        ) from None
    return [row for row in rows if row and (len(row) > 1 or row[0].strip())]


_NPY_MAGIC = b"\x93NUMPY"
# The dtypes an .npy body may carry: booleans, integers and floats of the sizes numpy has, in either byte
# order. Nothing else (objects, strings, structured records, `<i3`...) is read.
NPY_DTYPES = frozenset(
    [f"|{kind}1" for kind in "biu"]
    + [f"{order}{kind}{size}" for order in "<>" for kind in "iu" for size in (2, 4, 8)]
    + [f"{order}f{size}" for order in "<>" for size in (2, 4, 8)]
)
# The same as dtypes: testing a dtype costs less than building its `.str`.
NPY_DTYPE_SET = frozenset(np.dtype(descr) for descr in NPY_DTYPES)
_NPY_ALLOWED = "numpy .npy of bool, int, uint or float (no object, string or structured dtype)"
# What np.save writes for a plain C-ordered array, e.g. {'descr': '<f4', 'fortran_order': False, 'shape': (32, 64), }
_NPY_HEADER = re.compile(rb"\{'descr': '([<>|][biuf]\d)', 'fortran_order': False, 'shape': \(([\d, ]*)\), \}")
_NPY_MAX_DIMS = 32
_NPY_MAX_DIM = 1 << 40


def _parse_npy(body: bytes) -> np.ndarray:
    """A view of the body as the array its header describes. np.save's usual header is matched directly (np.load
    parses it with Python's tokenizer, which costs more than inferring a small batch); other headers go through
    numpy's own header reader, which evaluates literals only, and never through np.load, which would allocate
    whatever shape the header claims before knowing whether the bytes are there."""
    if body[:6] != _NPY_MAGIC or len(body) < 10:
        raise InvalidInput("body: not an .npy array (no \\x93NUMPY magic)", field="body", allowed=_NPY_ALLOWED)
    if body[6] == 1:
        start = 10
    elif body[6] == 2 and len(body) >= 12:
        start = 12
    else:
        raise InvalidInput(f"body: .npy format version {body[6]} is not read", field="body", allowed=".npy 1.0 or 2.0")
    end = start + int.from_bytes(body[8:start], "little")
    if end > len(body):
        raise InvalidInput("body: .npy header is truncated", field="body", allowed=_NPY_ALLOWED)
    header_bytes = body[:end]
    known = _NPY_READ_HEADERS.get(header_bytes)
    if known is None:
        known = _read_header(body, start, end)
        if end <= _NPY_MEMO_HEADER_BYTES and len(_NPY_READ_HEADERS) < _NPY_HEADER_MEMO_LIMIT:
            _NPY_READ_HEADERS[header_bytes] = known
    dtype, fortran_order, shape, count = known
    descr = dtype.str
    if len(body) - end != count * dtype.itemsize:  # Python integers: a lying shape cannot overflow this
        raise InvalidInput(
            f"body: .npy header says shape {list(shape)} of {descr} ({count * dtype.itemsize} bytes), "
            f"the body carries {len(body) - end} bytes after it",
            field="body",
            value=f"shape {list(shape)}",
            allowed="a shape that matches the data",
        )
    flat = np.frombuffer(body, dtype=dtype, count=count, offset=end) if count else np.empty(0, dtype=dtype)
    return flat.reshape(shape, order="F" if fortran_order else "C")


# Headers already read and found valid (dtype, order, shape, count): a client sends the same few shapes over
# and over, so each distinct header is parsed once. Bounded: at most 1,024 headers of at most 256 bytes (np.save
# pads to 64 or 128); the body's size is still checked against the header every time.
_NPY_READ_HEADERS: dict[bytes, tuple[np.dtype[Any], bool, tuple[int, ...], int]] = {}
_NPY_HEADER_MEMO_LIMIT = 1024
_NPY_MEMO_HEADER_BYTES = 256


def _read_header(body: bytes, start: int, end: int) -> tuple[np.dtype[Any], bool, tuple[int, ...], int]:
    header = _NPY_HEADER.match(body, start, end)
    if header is not None and header.group(1).decode() in NPY_DTYPES:
        descr, fortran_order = header.group(1).decode(), False
        shape = tuple(int(dim) for dim in header.group(2).split(b",") if dim.strip())
    else:
        descr, fortran_order, shape = _read_npy_header(body)
    if len(shape) > _NPY_MAX_DIMS or any(not 0 <= dim <= _NPY_MAX_DIM for dim in shape):
        raise InvalidInput(
            f"body: .npy shape {list(shape)[:8]} is not an array shape",
            field="body",
            value=f"shape {list(shape)[:8]}",
            allowed=f"at most {_NPY_MAX_DIMS} dimensions of 0..{_NPY_MAX_DIM}",
        )
    return np.dtype(descr), fortran_order, shape, math.prod(shape)


def _read_npy_header(body: bytes) -> tuple[str, bool, tuple[int, ...]]:
    stream = io.BytesIO(body)
    try:
        version = np.lib.format.read_magic(stream)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran_order, dtype = read(stream, max_header_size=10_000)
    except Exception as exc:  # numpy tokenizes and literal-evaluates the header text: ValueError,
        # SyntaxError, tokenize.TokenError, RecursionError... whatever a hostile header provokes is the body's fault
        raise InvalidInput(
            f"body: not a readable .npy array ({str(exc)[:200]})", field="body", allowed=_NPY_ALLOWED
        ) from None
    if dtype.str not in NPY_DTYPES or dtype.fields is not None or dtype.subdtype is not None:
        raise InvalidInput(
            f"body: .npy dtype {dtype.str!r} is not read", field="body", value=dtype.str, allowed=_NPY_ALLOWED
        )
    return dtype.str, bool(fortran_order), tuple(int(dim) for dim in shape)


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


MAX_VALUES_FREE_SHAPE = 1 << 24


def max_values(manifest: Manifest, max_batch_rows: int) -> int:
    """The most values a valid request for `manifest` can carry: `max_batch_rows` rows of every input. An
    input with a free row dimension has no such bound; then MAX_VALUES_FREE_SHAPE (16 Mi values) is."""
    per_row = 0
    for spec in manifest.inputs:
        if any(size is None for size in spec.row_shape):
            return MAX_VALUES_FREE_SHAPE
        per_row += math.prod(size for size in spec.row_shape if size is not None)
    return max(1, max_batch_rows * per_row)


def check_value_count(body: bytes, limit: int) -> None:
    """Refuse, before parsing, a JSON or CSV body with more than `limit` values: each value after the first
    follows a comma, so a body with `limit` commas holds too many. Only a body longer than `limit` bytes can
    hold that many commas, so the common small body costs one comparison."""
    if len(body) > limit and body.count(b",") >= limit:
        raise PayloadTooLarge(
            f"body: more than {limit} values, more than a batch of this model can hold",
            field="body",
            value=f"> {limit} values",
            allowed=f"<= {limit} values (the row limit times the values in a row)",
        )


def may_hold_booleans(body: bytes) -> bool:
    """Whether a JSON body has `true` or `false` in it: numpy would read those as 1 and 0 in a list of
    numbers, so such a body takes the path that checks every element."""
    return b"true" in body or b"false" in body


def fast_instances(
    payload: Any, manifest: Manifest, *, max_batch_rows: int, may_hold_booleans: bool = True
) -> Arrays | None:
    """The common request, `{"instances": [[numbers...], ...]}` for a one-input model with fixed numeric rows,
    checked in one pass. Anything else, or anything wrong, returns None: `validate_inputs` then decides,
    and names the problem. Both accept and refuse exactly the same bodies (tests/unit/test_codecs.py).
    `may_hold_booleans`: the body has `true`/`false` in it (see `may_hold_booleans()`); then None."""
    if type(payload) is not dict or len(payload) != 1 or len(manifest.inputs) != 1 or may_hold_booleans:
        return None
    value = payload.get("instances")
    spec = manifest.inputs[0]
    if type(value) is not list or not 0 < len(value) <= max_batch_rows or spec.dtype == "string":
        return None
    try:
        array = np.asarray(value)
    except (ValueError, OverflowError):
        return None
    target = spec.numpy_dtype
    if array.dtype.kind not in _NUMERIC_KINDS[target.kind] or array.shape[1:] != spec.shape[1:]:
        return None
    if array.dtype.kind == "f" and (manifest.allow_non_finite or not _finite_in(array, target)):
        return None
    return {spec.name: array.astype(target, copy=False)}


def fast_npy(array: np.ndarray, manifest: Manifest, *, max_batch_rows: int) -> Arrays | None:
    """The common `.npy` request, a batch of the one input's row shape in a numeric dtype of its kind, checked
    in one pass and cast without a copy when the dtype is already the model's (the array stays a view of the
    body). Anything else, or anything wrong, returns None: `validate_inputs` then decides and names the
    problem, so both accept and refuse exactly the same bodies (tests/unit/test_codecs.py)."""
    if len(manifest.inputs) != 1 or array.ndim == 0:
        return None
    spec = manifest.inputs[0]
    target = spec.numpy_dtype
    if (
        spec.dtype == "string"
        or not 0 < array.shape[0] <= max_batch_rows
        or array.shape[1:] != spec.shape[1:]
        or array.dtype.kind not in _NUMERIC_KINDS[target.kind]
    ):
        return None
    if array.dtype.kind == "f" and (manifest.allow_non_finite or not _finite_in(array, target)):
        return None
    return {spec.name: array.astype(target, copy=False)}


@dataclass(frozen=True, slots=True)
class RowsPlan:
    """What the body-level fast paths (`fast_json_body`, `fast_npy_body`) need to know of a model, worked out
    once per loaded model: its one input's name, dtype and fixed row shape, and the row limit."""

    name: str
    dtype: np.dtype[Any]
    row_shape: tuple[int, ...]
    max_rows: int
    max_square: float  # the dtype's largest value, squared: what a sum of squares of fitting values stays within
    # .npy headers already read for this model: header bytes -> (shape, bytes after the header), or None for a
    # header the fast path leaves to the general one (another dtype, order or row shape). Bounded.
    npy_headers: dict[bytes, tuple[tuple[int, ...], int] | None]


def rows_plan(manifest: Manifest, max_batch_rows: int) -> RowsPlan | None:
    """The plan for a one-input model of float32 or float64 rows of a fixed shape that does not take non-finite
    values (almost every tabular or image model); None for any other (it takes the general path)."""
    if len(manifest.inputs) != 1 or manifest.allow_non_finite:
        return None
    spec = manifest.inputs[0]
    row_shape = spec.row_shape
    if spec.dtype not in ("float32", "float64") or any(size is None for size in row_shape):
        return None
    fixed_row_shape = tuple(size for size in row_shape if size is not None)
    dtype = spec.numpy_dtype
    largest = float(np.finfo(dtype).max)
    return RowsPlan(spec.name, dtype, fixed_row_shape, max_batch_rows, largest * largest, {})  # float64: inf


# Every byte a JSON body of numbers can hold besides its one key and its braces: a body of at most
# _SCREEN_BYTES that is `{"instances": <numbers and lists>}` is `{"instancs":}` once these are deleted (the
# key's "e" goes with the exponents). The key itself is checked after parsing.
_JSON_NUMBER_BYTES = b"0123456789.,[]+-eE \t\n\r"
_INSTANCES_SKELETON = b'{"instancs":}'
_SCREEN_BYTES = 4096
# The cast in `fast_json_body` overflows a JSON number past float32's range to infinity. numpy only warns about
# that; here the warning is an error, so the fast path hands such a body to the general path, which names the
# value. (Every other cast in this module is checked before it is made: none of them may overflow, and under
# pytest every warning is an error anyway.)
warnings.filterwarnings("error", message="overflow encountered in cast", category=RuntimeWarning,
                        module=re.escape(__name__) + r"\Z")  # fmt: skip


def fast_json_body(body: bytes, plan: RowsPlan) -> Arrays | None:
    """`{"instances": [[numbers...], ...]}` straight from the body's bytes to the model's dtype, for a model with
    a `RowsPlan`: one screen of the bytes proves that every value is a number (no string, boolean or null,
    which numpy would convert or take for a number), so the rows go to numpy in one call, already in the
    model's dtype, with no second pass to find their kind. JSON numbers are finite (orjson refuses NaN,
    Infinity and numbers past float64's range), so the only value left to refuse is one past float32's range:
    its cast raises (the warning filter above). Anything else, or anything wrong,
    returns None: the general path then decides and names the problem; both accept and refuse exactly the
    same bodies, with the same values (tests/unit/test_codecs.py)."""
    if len(body) <= _SCREEN_BYTES:
        if body.translate(None, _JSON_NUMBER_BYTES) != _INSTANCES_SKELETON:
            return None
    elif body.count(b'"') != 2 or b"true" in body or b"false" in body or b"null" in body:
        return None
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if type(payload) is not dict or len(payload) != 1:
        return None
    rows = payload.get("instances")
    if type(rows) is not list or not 0 < len(rows) <= plan.max_rows:
        return None
    try:
        array = np.asarray(rows, dtype=plan.dtype)
    except (ValueError, TypeError, RuntimeWarning):  # ragged or nested wrongly; a value past float32's range
        return None
    if array.shape[1:] != plan.row_shape:
        return None
    return {plan.name: array}


def fast_npy_body(body: bytes, plan: RowsPlan) -> Arrays | None:
    """An `.npy` body of the model's own dtype and row shape (C order), read in place: the header is looked up
    among those this model has read before, the values are checked in one call. Anything else returns None,
    and the general path (`decode_body` and `fast_npy` or `validate_inputs`) decides."""
    if len(body) < 10 or not body.startswith(_NPY_MAGIC) or body[6] != 1:
        return None
    end = 10 + (body[8] | body[9] << 8)  # .npy 1.0: the header's length, two bytes little-endian
    header = body[:end]
    if header in plan.npy_headers:
        known = plan.npy_headers[header]
    else:
        known = _planned_npy_header(body, end, plan)
        if end <= _NPY_MEMO_HEADER_BYTES and len(plan.npy_headers) < _NPY_HEADER_MEMO_LIMIT:
            plan.npy_headers[header] = known
    if known is None or len(body) - end != known[1]:
        return None
    array: np.ndarray = np.ndarray(known[0], plan.dtype, body, end)  # a read-only view of the body
    squares = float(np.vdot(array, array))  # NaN or infinity for a non-finite value (see `_finite_in`)
    if not math.isfinite(squares) or squares > plan.max_square:  # or not sure: the general path checks each
        return None
    return {plan.name: array}


def _planned_npy_header(body: bytes, end: int, plan: RowsPlan) -> tuple[tuple[int, ...], int] | None:
    if end > len(body):
        return None
    try:
        dtype, fortran_order, shape, count = _read_header(body, 10, end)
    except InvalidInput:
        return None
    if (
        dtype != plan.dtype
        or fortran_order
        or len(shape) != len(plan.row_shape) + 1  # a 0-d array has no rows (and no shape[0])
        or shape[1:] != plan.row_shape
        or not 0 < shape[0] <= plan.max_rows
    ):
        return None
    return shape, count * dtype.itemsize


def validate_inputs(
    raw: Mapping[str, tuple[str, Any]], manifest: Manifest, *, max_batch_rows: int, may_hold_booleans: bool = True
) -> Arrays:
    """Turn raw values into arrays of the manifest's dtype and shape, or raise `InvalidInput`. Row counts and
    shapes are checked before anything is converted. `may_hold_booleans=False` only when the body is known to
    have no JSON `true`/`false` in it."""
    expected = {spec.name: spec for spec in manifest.inputs}
    if raw.keys() != expected.keys():
        unknown = sorted(set(raw) - set(expected))
        missing = sorted(set(expected) - set(raw))
        raise InvalidInput(
            f"inputs: unknown {unknown[:8]} / missing {missing}",
            field="inputs",
            value=sorted(raw)[:8],
            allowed=str(sorted(expected)),
        )
    arrays = {
        name: _to_array(field, value, expected[name], manifest, max_batch_rows, may_hold_booleans)
        for name, (field, value) in raw.items()
    }
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
    return arrays


_NUMERIC_KINDS = {"f": "fiu", "i": "iu", "u": "u", "b": "b"}
_SEQUENCES = (list, np.ndarray)


def _check_rows(field: str, rows: int, max_rows: int) -> None:
    if rows > max_rows:
        raise InvalidInput(
            f"batch of {rows} rows is over the limit",
            field="instances" if field == "csv" else field,
            value=rows,
            allowed=f"1..{max_rows} rows",
        )


def _to_array(
    field: str, value: Any, spec: TensorSpec, manifest: Manifest, max_rows: int, may_hold_booleans: bool
) -> np.ndarray:
    """Validate one input as a whole array; walk the elements only to explain a failure."""
    if field == "csv":
        return _csv_to_array(value, spec, manifest, max_rows)
    if not isinstance(value, _SEQUENCES):
        raise InvalidInput(
            f"{field}: expected a list of rows, got {type(value).__name__}",
            field=field,
            value=value,
            allowed=f"rows of shape {_shape_text(spec.row_shape)}",
        )
    target = spec.numpy_dtype
    if isinstance(value, np.ndarray):  # .npy (or a hook's array): dtype and shape first, then the one copy
        _check_rows(field, value.shape[0] if value.ndim else 1, max_rows)
        if spec.dtype == "string" and value.dtype.kind in "UO":  # a hook's strings, any `<U` width or objects
            return _string_array(field, value, spec)
        if spec.dtype == "string" or value.dtype.kind not in _NUMERIC_KINDS[target.kind]:
            raise InvalidInput(
                f"{field}: an array of {value.dtype.name}; input {spec.name!r} takes {spec.dtype}",
                field=field,
                value=value.dtype.name,
                allowed=f"{spec.dtype} (or a dtype that converts to it without loss of kind)",
            )
        _check_shape(field, value, spec)
        return _cast(field, value, target, manifest)
    _check_rows(field, len(value), max_rows)
    try:
        array = np.asarray(value)
    except (ValueError, OverflowError):  # ragged or too deep: numpy refuses to build the array
        raise _explain(field, value, spec) from None
    if array.dtype == object:
        raise _explain(field, value, spec)
    if spec.dtype == "string":
        if array.dtype.kind != "U":
            raise _explain(field, value, spec)
        array = array.astype(object)
    elif array.dtype.kind not in _NUMERIC_KINDS[target.kind]:
        raise _explain(field, value, spec)
    _check_shape(field, array, spec)
    if may_hold_booleans and target.kind != "b" and array.dtype.kind in "iuf":
        # np.asarray([1, True]) is [1, 1]: a boolean among numbers must be found by looking at each element.
        problem = _find_problem(field, value, spec)
        if problem is not None:
            raise problem
    if spec.dtype != "string":
        array = _cast(field, array, target, manifest)
    return array


def _string_array(field: str, value: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """A string input from an array of `str` (any width) or of objects that are all `str`, as the object array
    onnxruntime takes."""
    _check_shape(field, value, spec)
    if value.dtype.kind == "U":
        return value.astype(object)
    flat = value.reshape(-1)
    kinds = set(map(type, flat.tolist()))
    if not kinds <= {str}:
        index = next(i for i, item in enumerate(flat.tolist()) if type(item) is not str)
        where = field + "".join(f"[{i}]" for i in np.unravel_index(index, value.shape))
        raise InvalidInput(
            f"{where}: {short_repr(flat[index])} ({type(flat[index]).__name__}) is not allowed; "
            f"input {spec.name!r} takes strings",
            field=where,
            value=flat[index],
            allowed="string strings",
        )
    return value


# A CSV cell is a plain ASCII decimal: float() alone would also take `1_0`, `١٢` and ` ∞`-like spellings.
_CSV_NUMBER = re.compile(
    r"[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|nan|inf|infinity)", re.IGNORECASE | re.ASCII
)


def is_csv_number(cell: str) -> bool:
    """Whether a CSV cell is a number the CSV codec reads."""
    return _CSV_NUMBER.fullmatch(cell.strip(" \t")) is not None


def _csv_to_array(rows: list[list[str]], spec: TensorSpec, manifest: Manifest, max_rows: int) -> np.ndarray:
    if spec.dtype == "string" or spec.numpy_dtype.kind != "f":
        raise InvalidInput(
            f"CSV carries numbers; input {spec.name!r} takes {spec.dtype}",
            field="Content-Type",
            value=CSV,
            allowed="application/json or application/x-npy",
        )
    _check_rows("csv", len(rows), max_rows)
    width = spec.row_shape[0] if len(spec.row_shape) == 1 else None
    if width is None and rows:
        width = len(rows[0])
    values: list[list[float]] = []
    for line_number, cells in enumerate(rows, start=1):
        if len(cells) != width:
            raise InvalidInput(
                f"csv line {line_number}: {len(cells)} columns, the model takes {width}",
                field=f"csv line {line_number}",
                value=f"{len(cells)} columns",
                allowed=f"{width} columns",
            )
        row: list[float] = []
        for column_number, cell in enumerate(cells, start=1):
            text = cell.strip(" \t")
            if _CSV_NUMBER.fullmatch(text) is None:
                raise InvalidInput(
                    f"csv line {line_number}, column {column_number}: {text[:40]!r} is not a number",
                    field=f"csv line {line_number} column {column_number}",
                    value=text,
                    allowed=f"{spec.dtype} numbers (ASCII decimal, e.g. -1.5e3)",
                )
            row.append(float(text))
        values.append(row)
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


_SQUARE_SUMMED = frozenset("fd")  # float32 and float64 arrays: `np.vdot` sums their squares in their own dtype


def _finite_in(array: np.ndarray, target: np.dtype[Any]) -> bool:
    """Every value finite and within `target`'s range (NaN fails the comparison), so the cast that follows
    can neither overflow to infinity nor warn. False may also mean "not sure": callers then take the path
    that checks value by value, so this only has to be right when it says True."""
    limit = _FLOAT_MAX.get(target.char)
    if limit is None:
        limit = _FLOAT_MAX[target.char] = float(np.finfo(target).max) if target.kind == "f" else np.inf
    if array.size == 0:
        return True
    square_limit = limit * limit
    if square_limit != np.inf and array.dtype.char in _SQUARE_SUMMED:
        # One call instead of two reductions (each costs more than a small request's whole arithmetic): a sum
        # of squares is at least its largest square, and NaN or an overflow makes it fail, so a sum within
        # limit**2 proves every value within +-limit (float64 rounding is ~1e-16 relative, far inside the
        # half-ulp margin of a float32 cast). A sum past it proves nothing: the caller checks value by value.
        return float(np.vdot(array, array)) <= square_limit
    # Two reductions and no temporary: np.abs(array) would allocate a copy of the batch first. The extremes are
    # compared as Python floats: compared as numpy scalars of a narrower dtype (float16, or float32 against
    # float64's limit), the limit would be cast to that dtype, which overflows (a warning, an error here).
    smallest = float(np.minimum.reduce(array, axis=None))
    largest = float(np.maximum.reduce(array, axis=None))
    return -limit <= smallest and largest <= limit


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
    """Raise for the first value outside `target`'s range; return if there is none (`_finite_in` may say
    False when only unsure)."""
    limit = float(np.finfo(target).max)
    beyond = np.argwhere(np.abs(array) > limit)
    if not len(beyond):
        return
    index = tuple(int(i) for i in beyond[0])
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
    problem = _find_problem(field, value, spec)
    if problem is not None:
        return problem
    lengths = sorted({len(row) for row in value if isinstance(row, list)})
    return InvalidInput(
        f"{field}: rows of different lengths {lengths[:8]}",
        field=field,
        value=lengths[:8],
        allowed=f"rows of shape {_shape_text(spec.row_shape)}",
    )


def _find_problem(field: str, value: Any, spec: TensorSpec) -> InvalidInput | None:
    """The first element, in row order, that is not what `spec` takes; None when every element is."""
    wanted = "strings" if spec.dtype == "string" else ("integers" if spec.numpy_dtype.kind in "iu" else "numbers")
    row_shape = spec.row_shape

    def walk(node: Any, path: str, depth: int) -> InvalidInput | None:
        if depth < len(spec.shape):
            if not isinstance(node, _SEQUENCES):
                return InvalidInput(
                    f"{path}: expected a list, got {type(node).__name__} {short_repr(node)}",
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
        if spec.dtype == "string":
            ok = isinstance(node, str)
        elif spec.numpy_dtype.kind == "b":
            ok = isinstance(node, bool | np.bool_)
        else:
            ok = isinstance(node, int | float | np.number) and not isinstance(node, bool)
            if isinstance(node, int) and not -(2**63) <= node < 2**64:
                ok = False  # beyond any integer dtype
        if spec.numpy_dtype.kind in "iu" and isinstance(node, float):
            ok = False
        if not ok:
            return InvalidInput(
                f"{path}: {short_repr(node)} ({type(node).__name__}) is not allowed; "
                f"input {spec.name!r} takes {wanted}",
                field=path,
                value=node,
                allowed=f"{spec.dtype} {wanted}",
            )
        return None

    return walk(value, field, 0)


def _dim_text(size: int | None) -> str:
    return "any" if size is None else str(size)


def _shape_text(shape: Sequence[int | None]) -> str:
    return "[" + ", ".join(_dim_text(size) for size in shape) + "]"


# ---------------------------------------------------------------------------------------------- .npy and JSON writing
# The wire-format primitives of answers (models/answers.py builds the answers themselves).


# A header per distinct (dtype, shape): shapes repeat from request to request (bounded, like app.py's memos).
_NPY_HEADERS: dict[tuple[np.dtype[Any], tuple[int, ...]], bytes] = {}


def npy_header(array: np.ndarray) -> bytes:
    """The `.npy` 1.0 header np.save writes for a C-ordered `array`, built by numpy's own writer once per
    dtype and shape (np.save costs more than inferring a small batch: it re-derives and re-pads the header
    text on every call)."""
    key = (array.dtype, array.shape)  # the dtype itself: hashing it costs less than building its `.str`
    header = _NPY_HEADERS.get(key)
    if header is None:
        stream = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            stream, {"descr": array.dtype.str, "fortran_order": False, "shape": array.shape}
        )
        header = stream.getvalue()
        if len(_NPY_HEADERS) < _NPY_HEADER_MEMO_LIMIT:
            _NPY_HEADERS[key] = header
    return header


def encode_npy(arrays: Sequence[np.ndarray]) -> bytes:
    """`.npy` arrays back to back, each its header then its buffer: a C-contiguous array goes into the join as
    it is (it is a bytes-like object: its memory, no `tobytes` copy); the one copy is into the body bytes the
    server sends."""
    parts: list[bytes | np.ndarray] = []
    for array in arrays:
        contiguous = array if array.flags.c_contiguous else np.ascontiguousarray(array)  # a copy only for a view
        parts.append(npy_header(contiguous))
        parts.append(contiguous)
    return b"".join(parts)  # type: ignore[arg-type]  # numpy's stubs do not declare its buffer protocol


def json_default(value: Any) -> Any:
    """orjson writes numeric arrays itself and hands the rest here: string outputs (object arrays, e.g. a
    classifier trained on class names) become lists."""
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
