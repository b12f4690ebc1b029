"""Arrow arrays to numpy and back without pyarrow's pandas bridge, for a batch job's common columns.

`Array.to_numpy`, `ChunkedArray.to_numpy` and `pa.array(ndarray)` go through pyarrow's pandas bridge, which
imports pandas wherever it is installed (a project's virtual environment, a user's own image) to ask whether the
value is a pandas object. In a batch job that import was the largest single cost of the first chunk: ~0.4 CPU s,
on every run. A column of fixed-width numbers needs none of it: its values buffer is the numpy array's memory, so
these read and write it directly (zero-copy), and every other type goes the usual way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def numpy_dtype(arrow_type: Any) -> np.dtype[Any] | None:
    """The numpy dtype whose values are laid out as `arrow_type`'s (signed and unsigned integers, floats); None
    for any other type (booleans are bits in Arrow, bytes in numpy)."""
    known = _DTYPES.get(arrow_type, _UNKNOWN)
    if known is not _UNKNOWN:
        return known  # type: ignore[return-value]  # a dtype or None, as stored below
    dtype = _numpy_dtype(arrow_type)
    if len(_DTYPES) < 64:  # a job's columns have a few types; a hostile file's many are worked out each time
        _DTYPES[arrow_type] = dtype
    return dtype


# `numpy_dtype` by Arrow type: asked for every column of every batch (a 1,000,000-row job of 30 columns in
# batches of 50,000: 600 times, of a type or two).
_DTYPES: dict[Any, np.dtype[Any] | None] = {}
_UNKNOWN = object()


def _numpy_dtype(arrow_type: Any) -> np.dtype[Any] | None:
    import pyarrow as pa

    if pa.types.is_floating(arrow_type):
        kind = "f"
    elif pa.types.is_signed_integer(arrow_type):
        kind = "i"
    elif pa.types.is_unsigned_integer(arrow_type):
        kind = "u"
    else:
        return None
    return np.dtype(f"{kind}{arrow_type.bit_width // 8}")


def numbers(array: Any) -> np.ndarray:
    """The values of an Arrow array (or a chunked array) as numpy: a read-only view of a fixed-width numeric
    array's values buffer, else `to_numpy`. A null's value is whatever the buffer holds there: callers fill or
    refuse nulls first."""
    if hasattr(array, "chunks"):  # a ChunkedArray: one view per chunk, joined only when there are several
        parts = [numbers(chunk) for chunk in array.chunks]
        if len(parts) == 1:
            return parts[0]
        dtype = numpy_dtype(array.type)
        return np.concatenate(parts) if parts else np.empty(0, dtype=dtype or np.float64)
    dtype = numpy_dtype(array.type)
    if dtype is None:
        return np.asarray(array.to_numpy(zero_copy_only=False))
    values: np.ndarray = np.frombuffer(
        array.buffers()[1], dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize
    )
    return values


def from_numbers(values: np.ndarray) -> Any:
    """A 1-D numpy array of integers or floats as an Arrow array without nulls, sharing its memory when it is
    contiguous; booleans and other dtypes go through `pa.array`."""
    import pyarrow as pa

    if values.ndim != 1 or values.dtype.kind not in "iuf" or values.dtype.byteorder == ">":
        return pa.array(values)
    contiguous = np.ascontiguousarray(values)
    return pa.Array.from_buffers(
        pa.from_numpy_dtype(contiguous.dtype), len(contiguous), [None, pa.py_buffer(contiguous)]
    )


def strings(values: Sequence[str]) -> Any:
    """An Arrow string array of `values` (a dictionary's names): offsets and bytes built by numpy, not by
    `pa.array`."""
    import pyarrow as pa

    encoded = [value.encode() for value in values]
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    total = int(lengths.sum())
    if total >= 2**31:  # past a string array's 32-bit offsets: pyarrow's own conversion splits it into chunks
        return pa.array(list(values), type=pa.string())
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    data = b"".join(encoded)
    return pa.Array.from_buffers(pa.string(), len(lengths), [None, pa.py_buffer(offsets), pa.py_buffer(data)])
