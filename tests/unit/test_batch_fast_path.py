"""The batch job's vectorized decoding of a block of JSON lines (servestack/inference/tabular/decode.py `fast_lines`)
against the line-by-line path: over generated lines of near-numbers, whenever the fast path takes a block it decodes
exactly the values the line-by-line path decodes, and it never takes a block with a line that path refuses."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from servestack.inference import media_types
from servestack.inference.service import ModelRepository, ServedModel
from servestack.inference.settings import ServingSettings
from servestack.inference.tabular.decode import fast_lines, slow_lines
from servestack.inference.tabular.rows import split_lines

WIDTH = 30  # breast-cancer: rows of 30 floats

GOOD = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False, width=32).map(lambda v: f"{v:.6g}"),
    st.integers(-1000, 1000).map(str),
)
# The near-numbers a vectorized check could let through: leading zeros, `-0`, `1.`, `.5`, `1e`, `+1`, `1e+`,
# `--1`, `1.2.3`, empty values; and some good ones written unusually.
ODD = st.sampled_from(
    ["-0", "-0.0", "01", "-01", "1.", ".5", "1e", "+1", "1e+", "1e-5", "2E+3", "--1", "1.2.3", "", "-", "0.0", "1e5e5",
     "00.5", "-.5", "1-2", "1e5.5", "0e0", "-0e1"]
)  # fmt: skip
ROWS = st.lists(st.lists(GOOD, min_size=WIDTH, max_size=WIDTH), min_size=1, max_size=6)
# At most two values of the block replaced by odd ones (most blocks then still reach the fast path's checks).
ODDITIES = st.lists(st.tuples(st.integers(0, 5), st.integers(0, WIDTH - 1), ODD), max_size=2)


@pytest.fixture(scope="module")
def model() -> ServedModel:
    repository = ModelRepository(ServingSettings(warmup=False))
    repository.load_all()
    return repository.get("breast-cancer")


def line(values: list[str]) -> str:
    return "[" + ",".join(values) + "]"


@given(ROWS, ODDITIES)
def test_the_fast_path_decodes_what_the_line_by_line_path_decodes(
    model: ServedModel, rows: list[list[str]], oddities: list[tuple[int, int, str]]
) -> None:
    # GIVEN a block of JSON lines of numbers, a few of them replaced by near-numbers
    for row, column, value in oddities:
        rows[row % len(rows)][column] = value
    body = "\n".join(line(values) for values in rows).encode()
    lines = split_lines("x.jsonl", media_types.JSON, body, 1, file_start=True)
    # WHEN both paths decode it
    fast = fast_lines(model, lines)
    slow = slow_lines(model, lines)
    # THEN the fast path takes a block only when every line is good, with the same values
    if fast is not None:
        assert slow.bad == []
        assert slow.arrays is not None
        np.testing.assert_array_equal(fast["input"], slow.arrays["input"])
        assert fast["input"].tobytes() == slow.arrays["input"].tobytes()  # -0.0 and 0.0 too
        assert fast["input"].dtype == slow.arrays["input"].dtype


def test_a_block_of_plain_floats_takes_the_fast_path(model: ServedModel) -> None:
    # GIVEN lines of plain floats (the common case) / WHEN decoded / THEN the fast path takes them
    rows = np.random.default_rng(3).uniform(-5, 5, (50, WIDTH)).astype(np.float32)
    body = "\n".join(line([f"{v:.5g}" for v in row]) for row in rows.tolist()).encode()
    fast = fast_lines(model, split_lines("x.jsonl", media_types.JSON, body, 1, file_start=True))
    assert fast is not None
    assert fast["input"].shape == (50, WIDTH)
