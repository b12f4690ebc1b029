"""Wire formats shared by every mode: JSON (`instances` or named `inputs`), CSV rows and `.npy`.

Decoding turns a body into arrays that match the manifest: this module parses it (`decode_body`) and finds
each input's raw value (`payload_to_arrays`); servestack/inference/input_checks.py validates a whole batch at once as an
array, and only when that fails walks the rows to name the offending element; servestack/inference/fast_paths.py holds
the common bodies' shortcuts, which accept and refuse exactly what that general path does (rows by column
name go through servestack/inference/request_forms.py). The media types and content codings are
servestack/inference/media_types.py's. Answers are built in servestack/inference/answers.py, on the `.npy` and JSON
primitives at the end of this module. The
runtime never sees JSON.

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
import mmap
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

from servestack.inference.errors import InvalidInput, UnsupportedMediaType
from servestack.inference.manifest import Manifest, TensorSpec
from servestack.inference.media_types import CSV, CSV_HEADER, JSON, NPY, READABLE_TYPES

Arrays = dict[str, np.ndarray]


# ---------------------------------------------------------------------------------------------- decoding


def decode_body(body: bytes, content_type: str) -> Any:
    """Parse the body into its natural Python shape: a JSON document, CSV rows of strings, or an ndarray."""
    if content_type == JSON:
        return _parse_json(body)
    if content_type in (CSV, CSV_HEADER):
        return _parse_csv(body)
    if content_type == NPY:
        return parse_npy(body)
    raise unsupported_media_type(content_type)


def unsupported_media_type(content_type: str) -> UnsupportedMediaType:
    """The 415 for a body no codec reads, sent to a model without a `preprocess` hook to read it instead."""
    media_type = content_type.split(";", 1)[0].strip()  # a raw body's type keeps its parameters (service.py)
    return UnsupportedMediaType(
        f"Content-Type: {media_type!r} is not supported",
        field="Content-Type",
        value=media_type,
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


NPY_MAGIC = b"\x93NUMPY"
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
_NPY_DIM_DIGITS = len(str(_NPY_MAX_DIM))  # 13: a longer dimension is past the limit, whatever its digits


# An .npy body: the request's bytes, or a large body's file mapped read-only (servestack/adapters/body.py).
NpyBody = bytes | mmap.mmap


def parse_npy(body: NpyBody) -> np.ndarray:
    """A view of the body as the array its header describes. np.save's usual header is matched directly (np.load
    parses it with Python's tokenizer, which costs more than inferring a small batch); other headers go through
    numpy's own header reader, which evaluates literals only, and never through np.load, which would allocate
    whatever shape the header claims before knowing whether the bytes are there."""
    if body[:6] != NPY_MAGIC or len(body) < 10:
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
        known = parse_npy_header(body, start, end)
        if end <= NPY_MEMO_HEADER_BYTES and len(_NPY_READ_HEADERS) < NPY_HEADER_MEMO_LIMIT:
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
NPY_HEADER_MEMO_LIMIT = 1024
NPY_MEMO_HEADER_BYTES = 256


def parse_npy_header(body: NpyBody, start: int, end: int) -> tuple[np.dtype[Any], bool, tuple[int, ...], int]:
    header = _NPY_HEADER.match(body, start, end)
    if header is not None and header.group(1).decode() in NPY_DTYPES:
        descr, fortran_order = header.group(1).decode(), False
        dims = [dim.strip() for dim in header.group(2).split(b",")]
        if any(len(dim) > _NPY_DIM_DIGITS for dim in dims):  # never int() a 5,000-digit dimension (ValueError)
            raise InvalidInput(
                "body: .npy shape has a dimension of more than 13 digits",
                field="body",
                value="shape",
                allowed=f"at most {_NPY_MAX_DIMS} dimensions of 0..{_NPY_MAX_DIM}",
            )
        shape = tuple(int(dim) for dim in dims if dim)
    else:
        descr, fortran_order, shape = _read_npy_header(body[:end])
    if len(shape) > _NPY_MAX_DIMS or any(not 0 <= dim <= _NPY_MAX_DIM for dim in shape):
        raise InvalidInput(
            f"body: .npy shape {list(shape)[:8]} is not an array shape",
            field="body",
            value=f"shape {list(shape)[:8]}",
            allowed=f"at most {_NPY_MAX_DIMS} dimensions of 0..{_NPY_MAX_DIM}",
        )
    return np.dtype(descr), fortran_order, shape, math.prod(shape)


def _read_npy_header(header: bytes) -> tuple[str, bool, tuple[int, ...]]:
    stream = io.BytesIO(header)
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


# ---------------------------------------------------------------------------------------------- .npy and JSON writing
# The wire-format primitives of answers (servestack/inference/answers.py builds the answers themselves).


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
        if len(_NPY_HEADERS) < NPY_HEADER_MEMO_LIMIT:
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
