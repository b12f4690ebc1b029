"""Predict many independent requests with as few onnxruntime calls as their shapes allow.

The async worker decodes each queued job on its own, then calls `predict_grouped`: jobs whose inputs have
the same names, dtypes and row shapes are stacked into one batch, run once, and split back by row count.
A failure in a stacked batch is retried job by job, so one bad job never fails its neighbours.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from models.errors import ServingError
from models.runtime import Arrays
from models.service import ServedModel

Signature = tuple[tuple[str, str, tuple[int, ...]], ...]


def signature(arrays: Arrays) -> Signature:
    """What must be equal for two inputs to be stacked: names, dtypes and the shape after the batch axis."""
    return tuple(sorted((name, str(a.dtype), tuple(a.shape[1:])) for name, a in arrays.items()))


def predict_grouped(
    model: ServedModel, inputs: Sequence[Arrays], *, max_rows: int = 4096
) -> list[Arrays | ServingError]:
    """One result per input, in order: its outputs, or the `ServingError` its prediction raised."""
    results: list[Arrays | ServingError | None] = [None] * len(inputs)
    groups: dict[Signature, list[int]] = {}
    for index, arrays in enumerate(inputs):
        groups.setdefault(signature(arrays), []).append(index)
    for members in groups.values():
        for chunk in _by_rows(members, inputs, max_rows):
            _run(model, inputs, chunk, results)
    return [r if r is not None else ServingError("no result") for r in results]


def _rows(arrays: Arrays) -> int:
    return int(next(iter(arrays.values())).shape[0]) if arrays else 0


def _by_rows(members: list[int], inputs: Sequence[Arrays], max_rows: int) -> list[list[int]]:
    chunks: list[list[int]] = [[]]
    rows = 0
    for index in members:
        n = _rows(inputs[index])
        if chunks[-1] and rows + n > max_rows:
            chunks.append([])
            rows = 0
        chunks[-1].append(index)
        rows += n
    return chunks


def _run(
    model: ServedModel, inputs: Sequence[Arrays], chunk: list[int], results: list[Arrays | ServingError | None]
) -> None:
    if len(chunk) == 1:
        try:
            results[chunk[0]] = model.predict(inputs[chunk[0]])
        except ServingError as error:
            results[chunk[0]] = error
        return
    names = list(inputs[chunk[0]])
    stacked = {name: np.concatenate([inputs[i][name] for i in chunk]) for name in names}
    try:
        outputs = model.predict(stacked)
    except ServingError:
        for index in chunk:  # isolate the culprit
            _run(model, inputs, [index], results)
        return
    start = 0
    for index in chunk:
        stop = start + _rows(inputs[index])
        results[index] = {name: value[start:stop] for name, value in outputs.items()}
        start = stop
