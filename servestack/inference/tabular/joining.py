"""Rows decoded apart, joined into one batch: the pieces of a chunk (each block or file decoded on its own), or the
files of a piece (each one request to the hook).

Rows of a sequence input decoded apart may differ in length (`[N, 3]` from one file, `[N, 5]` from the next):
where the manifest declares the input's pad value (`models push --pad input_ids=0`), the shorter are padded at
their end to the longest, as the rows of one request are (servestack/inference/input_checks.py `padded_rows`).
Anything else that does not match the first item (another row shape, dtype or set of inputs) cannot be in the
batch: its rows are refused, naming what differs and the flag that would pad it, and the others are scored.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from servestack.inference.errors import InvalidInput, ServingError
from servestack.inference.manifest import Manifest
from servestack.inference.runtime import Arrays


def join(manifest: Manifest, items: Sequence[Arrays]) -> tuple[Arrays | None, list[tuple[int, ServingError]]]:
    """The items that fit the first's inputs concatenated along the batch axis (padded where the manifest
    allows), and the index and reason of each item that does not, ascending. None when no item is given."""
    if not items:
        return None, []
    first = items[0]
    fits = [0]
    refused: list[tuple[int, ServingError]] = []
    for index in range(1, len(items)):
        problem = _mismatch(manifest, first, items[index])
        if problem is None:
            fits.append(index)
        else:
            refused.append((index, problem))
    kept = [items[index] for index in fits]
    if len(kept) == 1:
        return dict(kept[0]), refused
    joined: Arrays = {}
    for name in first:
        arrays = [arrays[name] for arrays in kept]
        longest = max(array.shape[1] for array in arrays) if first[name].ndim == 2 else None
        if longest is not None and any(array.shape[1] != longest for array in arrays):
            sequence = manifest.sequence_of(name)
            assert sequence is not None  # `_mismatch` let it through for its pad value
            assert sequence.pad is not None
            arrays = [_padded(array, longest, sequence.pad) for array in arrays]
        joined[name] = np.concatenate(arrays)
    return joined, refused


def _padded(array: np.ndarray, length: int, pad: float) -> np.ndarray:
    if array.shape[1] == length:
        return array
    return np.pad(array, ((0, 0), (0, length - array.shape[1])), constant_values=np.asarray(pad, dtype=array.dtype))


def _mismatch(manifest: Manifest, first: Arrays, other: Arrays) -> InvalidInput | None:
    """Why `other`'s rows cannot join `first`'s in one batch, or None when they can."""
    if other.keys() != first.keys():
        return InvalidInput(
            f"rows of inputs {sorted(other)} cannot join a batch of inputs {sorted(first)}",
            field="inputs",
            value=sorted(other),
            allowed=f"the inputs {sorted(first)}",
        )
    for name, array in other.items():
        expected = first[name]
        if array.dtype != expected.dtype or array.ndim != expected.ndim:
            return InvalidInput(
                f"input {name!r}: rows of {array.dtype} {list(array.shape[1:])} cannot join a batch of "
                f"{expected.dtype} {list(expected.shape[1:])}",
                field=name,
                value=f"{array.dtype} {list(array.shape[1:])}",
                allowed=f"{expected.dtype} {list(expected.shape[1:])}",
            )
        if array.shape[1:] == expected.shape[1:]:
            continue
        sequence = manifest.sequence_of(name)
        if array.ndim == 2 and sequence is not None and sequence.pad is not None:
            continue
        return InvalidInput(
            f"input {name!r}: rows of shape {list(array.shape[1:])} cannot join a batch of {list(expected.shape[1:])}: "
            f"a batch pads sequences of different lengths only where the manifest declares a pad value "
            f"(servestack models push --pad {name}=<value>)",
            field=name,
            value=list(array.shape[1:]),
            allowed=f"rows of shape {list(expected.shape[1:])}, or a pad value for {name!r}",
        )
    return None
