"""Rows the model itself refuses: a batch onnxruntime fails for one row becomes one error row, not a failed chunk.

A row can decode and still be refused by the model: a category its one-hot encoder never saw (scikit-learn's
handle_unknown='error'), which onnxruntime reports for the whole batch and `ServedModel.predict` maps to
`InvalidInput`. Only then are the rows bisected (halves, then quarters, down to single rows) until each has
its prediction or its own error: with k bad rows among n that is about 2*k*log2(n) runs, not n, and a batch
that succeeds costs nothing more than the one run it always was. Any other failure is the server's and still
stops the work.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from servestack.inference.errors import InvalidInput, ServingError
from servestack.inference.grouping import stack
from servestack.inference.runtime import Arrays
from servestack.inference.service import ServedModel
from servestack.inference.tabular.decode import Decoded


def predict_rows(
    model: ServedModel, arrays: Mapping[str, np.ndarray]
) -> tuple[Arrays | None, list[tuple[int, ServingError]]]:
    """The outputs of the rows the model accepts (in order, None when it accepts none) and, ascending, the
    index and error of each row it refuses."""
    try:
        return model.predict(arrays), []
    except InvalidInput as error:
        rows = len(next(iter(arrays.values())))
        if rows <= 1:
            if rows == 0:  # no row to blame: not a row's fault after all
                raise
            return None, [(0, error)]
    accepted: list[Arrays] = []
    refused: list[tuple[int, ServingError]] = []
    middle = rows // 2
    for start, stop in ((0, middle), (middle, rows)):
        outputs, errors = predict_rows(model, {name: value[start:stop] for name, value in arrays.items()})
        if outputs is not None:
            accepted.append(outputs)
        refused.extend((start + row, error) for row, error in errors)
    return (stack(accepted) if accepted else None), refused


def without_refused(decoded: Decoded, refused: list[tuple[int, ServingError]]) -> Decoded:
    """`decoded` with the rows the model refused (indices into its good rows) moved to its bad rows."""
    if not refused:
        return decoded
    keep = np.ones(len(decoded.good), dtype=bool)
    keep[[row for row, _ in refused]] = False
    good = decoded.good[keep]
    arrays = {name: value[keep] for name, value in (decoded.arrays or {}).items()} if len(good) else None
    bad = sorted([*decoded.bad, *((int(decoded.good[row]), error) for row, error in refused)], key=lambda b: b[0])
    ids = (
        [ident for ident, kept in zip(decoded.ids, keep.tolist(), strict=True) if kept]
        if decoded.ids is not None
        else None
    )
    return Decoded(good, arrays, bad, ids)


def refused_by_piece(decoded: list[Decoded], refused: list[tuple[int, ServingError]]) -> list[Decoded]:
    """`without_refused` for each piece of a chunk whose good rows were predicted together, in piece order:
    `refused` indexes the concatenation of the good rows of the pieces that have arrays."""
    pieces: list[Decoded] = []
    start = 0
    for result in decoded:
        if result.arrays is None:
            pieces.append(result)
            continue
        stop = start + len(result.good)
        own = [(row - start, error) for row, error in refused if start <= row < stop]
        pieces.append(without_refused(result, own))
        start = stop
    return pieces
