"""Predict many independent requests with as few onnxruntime calls as their shapes allow.

The async worker decodes each queued job on its own, then calls `predict_grouped`: jobs whose inputs have
the same names, dtypes and row shapes are stacked into one batch, run once, and split back by row count.
A failure in a stacked batch is retried job by job, so one bad job never fails its neighbours.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from servestack.inference.errors import ServingError
from servestack.inference.runtime import Arrays
from servestack.inference.service import ServedModel
from servestack.inference.split_reader import PlannedArrays, Signature


def signature(arrays: Mapping[str, np.ndarray]) -> Signature:
    """What must be equal for two inputs to be stacked: names, dtypes and the shape after the batch axis."""
    if type(arrays) is PlannedArrays:  # a `dataframe_split` body's columns: known per model, not per request
        return arrays.plan.signature  # type: ignore[return-value]  # a plan with PlannedArrays has one
    if len(arrays) == 1:  # most models take one input: no sort, no generator (the micro-batcher asks per request)
        for name, array in arrays.items():
            return ((name, array.dtype, array.shape[1:]),)  # the dtype itself: cheaper than building its `.str`
    # A list display, not a generator: the batcher asks once per request of a model of several inputs (columns).
    return tuple([(name, (array := arrays[name]).dtype, array.shape[1:]) for name in sorted(arrays)])


def stack(inputs: Sequence[Mapping[str, np.ndarray]]) -> Arrays:
    """Inputs of one signature, concatenated along the batch axis."""
    first = inputs[0]
    if type(first) is PlannedArrays and all(type(arrays) is PlannedArrays for arrays in inputs):
        return _stack_planned(first, inputs)  # type: ignore[arg-type]  # each is PlannedArrays, checked just above
    return {name: np.concatenate([arrays[name] for arrays in inputs]) for name in first}


def _stack_planned(first: PlannedArrays, inputs: Sequence[PlannedArrays]) -> Arrays:
    """`stack` of a `dataframe_split` body's columns (one model's, so one plan): each float group's columns joined
    as one `[k, rows, 1]` array, whose views are the columns (each contiguous), the other columns one by one;
    the same arrays as column by column, in the same order."""
    plan = first.plan
    joined: Arrays = {}
    for at, names in enumerate(plan.block_names):
        joined.update(zip(names, np.concatenate([arrays.blocks[at] for arrays in inputs], axis=1), strict=True))
    for name in plan.other_names:
        joined[name] = np.concatenate([arrays[name] for arrays in inputs])
    return {name: joined[name] for name in first}


def split(outputs: Mapping[str, np.ndarray], row_counts: Sequence[int]) -> list[Arrays]:
    """Outputs of a stacked batch, cut back into one slice per input (views, no copies)."""
    pieces: list[Arrays] = []
    start = 0
    if len(outputs) == 2:  # a classifier's label and probabilities: a dict display, not a comprehension per input
        (first, first_value), (second, second_value) = outputs.items()
        for rows in row_counts:
            stop = start + rows
            pieces.append({first: first_value[start:stop], second: second_value[start:stop]})
            start = stop
        return pieces
    for rows in row_counts:
        stop = start + rows
        pieces.append({name: value[start:stop] for name, value in outputs.items()})
        start = stop
    return pieces


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
    try:
        outputs = model.predict(stack([inputs[i] for i in chunk]))
    except ServingError:
        for index in chunk:  # isolate the culprit
            _run(model, inputs, [index], results)
        return
    for index, piece in zip(chunk, split(outputs, [_rows(inputs[i]) for i in chunk]), strict=True):
        results[index] = piece
