"""The shortcuts of the common request bodies, for a model with one numeric input of fixed rows.

`{"instances": [[numbers...], ...]}` and a `.npy` array are the bodies almost every request to a tabular or
image model carries. Each shortcut proves cheaply that the body is plainly valid (every value a number, the
shape and dtype the model's, every value finite and in range) and converts it in one numpy call; anything
else makes it decline (None), and the general path (servestack/inference/codecs.py,
servestack/inference/input_checks.py) decides and names the problem. Both accept and refuse exactly the same bodies,
with the same values
(tests/unit/test_codecs.py). The value-count bound every JSON and CSV body is held to before parsing is here
too (`check_value_count`).
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from servestack.inference.codecs import (
    NPY_HEADER_MEMO_LIMIT,
    NPY_MAGIC,
    NPY_MEMO_HEADER_BYTES,
    Arrays,
    parse_npy_header,
)
from servestack.inference.errors import InvalidInput, PayloadTooLarge
from servestack.inference.input_checks import NUMERIC_KINDS, finite_in
from servestack.inference.manifest import Manifest

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
    if manifest.sequences:  # padding and id bounds: the general path applies them
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
    if array.dtype.kind not in NUMERIC_KINDS[target.kind] or array.shape[1:] != spec.shape[1:]:
        return None
    if array.dtype.kind == "f" and (manifest.allow_non_finite or not finite_in(array, target)):
        return None
    return {spec.name: array.astype(target, copy=False)}


def fast_npy(array: np.ndarray, manifest: Manifest, *, max_batch_rows: int) -> Arrays | None:
    """The common `.npy` request, a batch of the one input's row shape in a numeric dtype of its kind, checked
    in one pass and cast without a copy when the dtype is already the model's (the array stays a view of the
    body). Anything else, or anything wrong, returns None: `validate_inputs` then decides and names the
    problem, so both accept and refuse exactly the same bodies (tests/unit/test_codecs.py)."""
    if len(manifest.inputs) != 1 or array.ndim == 0 or manifest.sequences:  # bounds: the general path
        return None
    spec = manifest.inputs[0]
    target = spec.numpy_dtype
    if (
        spec.dtype == "string"
        or not 0 < array.shape[0] <= max_batch_rows
        or array.shape[1:] != spec.shape[1:]
        or array.dtype.kind not in NUMERIC_KINDS[target.kind]
    ):
        return None
    if array.dtype.kind == "f" and (manifest.allow_non_finite or not finite_in(array, target)):
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
    if len(manifest.inputs) != 1 or manifest.allow_non_finite or manifest.sequences:
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
    if len(body) < 10 or not body.startswith(NPY_MAGIC) or body[6] != 1:
        return None
    end = 10 + (body[8] | body[9] << 8)  # .npy 1.0: the header's length, two bytes little-endian
    header = body[:end]
    known = plan.npy_headers.get(header, _UNSEEN)  # one lookup: a header's hash is not cached between requests
    if known is _UNSEEN:
        known = _planned_npy_header(body, end, plan)
        if end <= NPY_MEMO_HEADER_BYTES and len(plan.npy_headers) < NPY_HEADER_MEMO_LIMIT:
            plan.npy_headers[header] = known
    if known is None or len(body) - end != known[1]:
        return None
    array: np.ndarray = np.ndarray(known[0], plan.dtype, body, end)  # a read-only view of the body
    squares = float(np.vdot(array, array))  # NaN or infinity for a non-finite value (see `finite_in`)
    if not math.isfinite(squares) or squares > plan.max_square:  # or not sure: the general path checks each
        return None
    return {plan.name: array}


_UNSEEN: Any = object()  # a header not read before (`npy_headers` holds None for one the fast path leaves)


def _planned_npy_header(body: bytes, end: int, plan: RowsPlan) -> tuple[tuple[int, ...], int] | None:
    if end > len(body):
        return None
    try:
        dtype, fortran_order, shape, count = parse_npy_header(body, 10, end)
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
