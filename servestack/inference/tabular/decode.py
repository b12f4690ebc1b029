"""Rows to model inputs: a whole block at once when it holds plain numbers, else line by line.

The fast path takes a block of JSON array lines (`[1.5,-2,3e4]`) or CSV number lines for a model with one
fixed-width float input. It is a shortcut, never a second dialect: it runs only when a vectorized scan shows
the block can hold nothing the line-by-line path would refuse or read differently, and it produces the same
float values (both parse to the correctly rounded float64, then cast). Anything else (a quote, a space that
does not follow a comma, a blank or bracket out of place, a number JSON does not allow such as `01`, `.5` or
`+1`, an integer of 2**53 or more, a value that does not fit the input's dtype) sends the whole block to the
line-by-line path, which names each bad row. tests/unit/test_tabular.py checks both paths agree on random
lines.

Parsing: pyarrow's CSV reader (C++, ~3x faster than any numpy reader here) when pyarrow is installed (the
containers), else orjson over the whole block (the Lambda bundle, which leaves pyarrow out to stay small).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from servestack.inference import codecs, fast_paths, media_types
from servestack.inference.columns import columns_of
from servestack.inference.errors import InvalidInput, ServingError
from servestack.inference.manifest import TensorSpec
from servestack.inference.runtime import Arrays
from servestack.inference.service import ServedModel
from servestack.inference.tabular.files import decode_files
from servestack.inference.tabular.joining import join
from servestack.inference.tabular.named import decode_named
from servestack.inference.tabular.parquet_tensors import tensor_records
from servestack.inference.tabular.rows import Lines, Piece, Records, Refused, record_too_long


@dataclass(frozen=True)
class Decoded:
    """`good`: indices (ascending) of the rows that decoded into `arrays`; `bad`: (row index, why), ascending."""

    good: np.ndarray
    arrays: Arrays | None
    bad: list[tuple[int, ServingError]]
    ids: list[Any] | None = None  # with an id column: each good row's id, in the order of `good`


def decode_piece(
    model: ServedModel, piece: Piece, max_record_bytes: int | None = None, id_column: str | None = None
) -> Decoded:
    """The piece's rows as model inputs; with `max_record_bytes`, a line longer than it is an error row. A model
    with named columns (servestack/inference/columns.py) reads rows by column name
    (servestack/inference/tabular/named.py); with
    `id_column`, each good row's value of that column comes back in `ids`."""
    if isinstance(piece, Refused):
        return Decoded(np.empty(0, dtype=np.int64), None, list(enumerate(piece.errors)))
    if isinstance(piece, Lines) and piece.whole:  # a whole file, for the hook: no line limit applies
        good, arrays, bad = decode_files(model, piece)
        # A file has no columns: with an id column, its id is the object's key (as `file` is).
        return Decoded(good, arrays, bad, [piece.source] * len(good) if id_column is not None else None)
    if max_record_bytes is not None and isinstance(piece, Lines):
        lengths = piece.ends - piece.starts
        if int(lengths.max(initial=0)) > max_record_bytes:
            return _without_long_lines(model, piece, lengths, max_record_bytes, id_column)
    if isinstance(piece, Lines) and id_column is None:
        fast = fast_lines(model, piece)
        if fast is not None:
            return Decoded(np.arange(len(piece)), fast, [])
    if columns_of(model.manifest) and model.hooks.preprocess is None:
        named = decode_named(model, piece, id_column)
        if named is not None:
            return Decoded(*named)
    if isinstance(piece, Records):
        return decode_records(model, piece)
    return slow_lines(model, piece)


def _without_long_lines(
    model: ServedModel, lines: Lines, lengths: np.ndarray, limit: int, id_column: str | None
) -> Decoded:
    """Lines over `limit` as error rows (never parsed), the others decoded as usual."""
    short = lengths <= limit
    kept = np.flatnonzero(short)
    rest = decode_piece(model, lines.select(kept), None, id_column)
    bad = [(int(kept[index]), error) for index, error in rest.bad]
    bad += [(int(index), record_too_long(int(lengths[index]), limit)) for index in np.flatnonzero(~short)]
    bad.sort(key=lambda pair: pair[0])
    return Decoded(kept[rest.good], rest.arrays, bad, rest.ids)


# ------------------------------------------------------------------------------------------ the fast path

_OPEN, _CLOSE, _NEWLINE = 91, 93, 10
_JSON_BYTES = b"0123456789.eE+-,[]\n"
_CSV_BYTES = b"0123456789.eE+-,\n"
_EXACT_INTEGERS = float(2**53)  # every integer below this is exact in float64 (and so reads the same either way)


def float_rows_input(model: ServedModel) -> TensorSpec | None:
    """The model's one input when it takes rows of a fixed number of floats and no preprocess hook reads the
    payload first: the only inputs the fast path decodes."""
    manifest = model.manifest
    if model.hooks.preprocess is not None or len(manifest.inputs) != 1:
        return None
    spec = manifest.inputs[0]
    if spec.dtype == "string" or spec.numpy_dtype.kind != "f" or len(spec.row_shape) != 1:
        return None
    return spec if spec.row_shape[0] is not None else None


def fast_lines(model: ServedModel, lines: Lines) -> Arrays | None:
    """The block's rows as one array, or None when the line-by-line path must decide."""
    spec = float_rows_input(model)
    if spec is None or lines.media_type not in (media_types.JSON, media_types.CSV) or not len(lines):
        return None
    width = int(spec.row_shape[0] or 0)
    body = lines.joined()
    if b" " in body:  # `1.0, 2.0` (Python's json.dumps) is common; any other space goes the slow way
        if body.count(b" ") != body.count(b", "):
            return None
        body = body.replace(b", ", b",")
    is_json = lines.media_type == media_types.JSON
    if body.translate(None, _JSON_BYTES if is_json else _CSV_BYTES):
        return None  # a byte the plain-number alphabet does not have: quotes, letters, NUL...
    arr = np.frombuffer(body, dtype=np.uint8)
    values: np.ndarray | None
    if is_json:
        if not _one_array_per_line(arr, len(lines)):
            return None
        if arrow_csv() is not None:
            values = _parse_arrow(body.translate(None, b"[]"), len(lines), width) if _json_numbers_exact(arr) else None
        else:
            values = _parse_orjson(body, len(lines), width)
    else:
        values = _parse_arrow(body, len(lines), width) if arrow_csv() is not None else None
    if values is None or not _fits(values, spec):
        return None
    return {spec.name: values.astype(spec.numpy_dtype, copy=False)}


def _one_array_per_line(arr: np.ndarray, rows: int) -> bool:
    """Each line is `[`...`]` with no other bracket: so no line can hold two rows, half a row or a nested one."""
    ends = np.flatnonzero(arr == _NEWLINE)
    if len(ends) != rows - 1:
        return False
    starts = np.concatenate(([0], ends + 1))
    ends = np.concatenate((ends, [len(arr)]))
    if np.any(ends <= starts):
        return False
    return (
        bool(np.all(arr[starts] == _OPEN))
        and bool(np.all(arr[ends - 1] == _CLOSE))
        and int(np.count_nonzero(arr == _OPEN)) == rows
        and int(np.count_nonzero(arr == _CLOSE)) == rows
    )


def _json_numbers_exact(arr: np.ndarray) -> bool:
    """Every value between the brackets is a JSON number (RFC 8259 section 6:
    `-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?`) as far as neighbouring bytes can tell, and none is the
    integer `-0` (orjson reads it as 0, the CSV reader as -0.0). What neighbours cannot tell (`1.2.3`, `1e5e5`)
    the CSV reader refuses itself.

    Each rule is about a byte, the one before it and the two after it (`_number_rules_broken`), so the check is
    one table lookup per byte: every byte becomes its class (4 bits), each run of four classes one 16-bit
    code, and a table of the 65,536 codes says which break a rule. That is a few whole-array numpy passes,
    about 3x faster than finding the non-digit bytes and testing each rule on them."""
    classes = np.empty(len(arr) + 3, dtype=np.uint8)  # classes[i + 1] is arr[i]'s; newlines around
    classes[0] = _C_NEWLINE
    classes[-2:] = _C_NEWLINE
    np.take(_BYTE_CLASS, arr, out=classes[1:-2])
    pairs = classes[:-1] << 4
    pairs |= classes[1:]
    quads = pairs[:-2].astype(np.uint16) << 8
    quads |= pairs[2:]
    return not bool(_broken_quads().take(quads).any())


# Byte classes for `_json_numbers_exact`; a byte outside the plain-number alphabet never gets there.
_C_NEWLINE, _C_OPEN, _C_CLOSE, _C_COMMA, _C_DOT, _C_EXPONENT, _C_PLUS, _C_MINUS, _C_ZERO, _C_DIGIT = range(10)
_BYTE_CLASS = np.full(256, _C_NEWLINE, dtype=np.uint8)
for _byte, _class in {b"[": _C_OPEN, b"]": _C_CLOSE, b",": _C_COMMA, b".": _C_DOT, b"e": _C_EXPONENT,
                      b"E": _C_EXPONENT, b"+": _C_PLUS, b"-": _C_MINUS, b"0": _C_ZERO}.items():  # fmt: skip
    _BYTE_CLASS[_byte[0]] = _class
_BYTE_CLASS[ord("1") : ord("9") + 1] = _C_DIGIT


def _number_rules_broken(before: np.ndarray, this: np.ndarray, after: np.ndarray, after_next: np.ndarray) -> np.ndarray:
    """For each run of byte classes `before this after after_next`: whether it breaks a rule of JSON numbers at
    `this` (array in, array out, so the table of every code is built in one pass at import)."""
    digit_before, digit_after = (before == _C_ZERO) | (before == _C_DIGIT), (after == _C_ZERO) | (after == _C_DIGIT)
    digit_after_next = (after_next == _C_ZERO) | (after_next == _C_DIGIT)
    separator, separator_before = (this == _C_OPEN) | (this == _C_COMMA), (before == _C_OPEN) | (before == _C_COMMA)
    sign_after = (after == _C_PLUS) | (after == _C_MINUS)
    exponent_before = before == _C_EXPONENT
    # `-01`, and the integer `-0` (a separator or the closing bracket right after it)
    signed_zero = (after == _C_ZERO) & (digit_after_next | (after_next == _C_COMMA) | (after_next == _C_CLOSE))
    broken: np.ndarray = (
        (separator & ~((after == _C_MINUS) | digit_after))  # an empty value, `.5`, `+1`, `e5`
        | (separator & (after == _C_ZERO) & digit_after_next)  # a leading zero: `01`
        | ((this == _C_DOT) & ~(digit_before & digit_after))  # `1.`, `1.e5`
        | ((this == _C_EXPONENT) & ~(digit_before & (digit_after | sign_after)))
        | ((this == _C_PLUS) & ~(exponent_before & digit_after))
        | ((this == _C_MINUS) & ~((separator_before | exponent_before) & digit_after))
        | ((this == _C_MINUS) & separator_before & signed_zero)
    )
    return broken


@functools.cache
def _broken_quads() -> np.ndarray:
    """Whether each of the 65,536 runs of four byte classes breaks a rule: made on a job's first JSON text rather
    than at import, where every job paid its ~3 ms, Parquet jobs too."""
    codes = np.arange(1 << 16)
    return _number_rules_broken(codes >> 12, (codes >> 8) & 15, (codes >> 4) & 15, codes & 15)


_ARROW: list[Any] = []


def arrow_csv() -> Any:
    """pyarrow.csv when pyarrow is installed, else None (looked up once)."""
    if not _ARROW:
        try:
            import pyarrow.csv as arrow_csv_module
        except ImportError:
            arrow_csv_module = None
        _ARROW.append(arrow_csv_module)
    return _ARROW[0]


def _parse_arrow(body: bytes, rows: int, width: int) -> np.ndarray | None:
    import pyarrow as pa

    csv = arrow_csv()
    names = [f"c{i}" for i in range(width)]
    try:
        table = csv.read_csv(
            pa.py_buffer(body),
            # One thread: a chunk is a few MB, and the job overlaps reading, inference and writing already.
            read_options=csv.ReadOptions(column_names=names, use_threads=False, block_size=max(len(body) + 1, 1 << 20)),
            parse_options=csv.ParseOptions(quote_char=False, ignore_empty_lines=False),
            convert_options=csv.ConvertOptions(
                column_types={name: pa.float64() for name in names},
                null_values=[],
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None  # a row of another width, a value that is not a number: the slow path names it
    if table.num_rows != rows or table.num_columns != width:
        return None
    values = np.empty((rows, width), dtype=np.float64)
    for index, column in enumerate(table.columns):
        values[:, index] = column.to_numpy()
    return values


def _parse_orjson(body: bytes, rows: int, width: int) -> np.ndarray | None:
    try:
        parsed = orjson.loads(b"[" + body.replace(b"\n", b",") + b"]")
    except orjson.JSONDecodeError:
        return None
    if len(parsed) != rows:
        return None
    try:
        values = np.asarray(parsed, dtype=np.float64)
    except (ValueError, TypeError, OverflowError):
        return None
    return values if values.shape == (rows, width) else None


def _fits(values: np.ndarray, spec: TensorSpec) -> bool:
    """Finite, within the input dtype's range and below 2**53 (NaN fails every comparison)."""
    if not values.size:
        return False
    largest = float(np.abs(values).max())
    return largest <= float(np.finfo(spec.numpy_dtype).max) and largest < _EXACT_INTEGERS


# ------------------------------------------------------------------------------------------ line by line


@dataclass(frozen=True)
class _Parsed:
    index: int
    payload: Any  # JSON: the line's one instance; CSV: its one row of cells
    booleans: bool


def _parse_line(index: int, raw: bytes, media_type: str) -> _Parsed:
    """One line as exactly one row, or `InvalidInput` saying why not."""
    decoded = codecs.decode_body(raw, media_type)
    if media_type == media_types.CSV:
        if len(decoded) != 1:
            raise InvalidInput(
                f"line holds {len(decoded)} CSV rows; each line is one row",
                field="line",
                value=f"{len(decoded)} rows",
                allowed="one row of comma-separated numbers per line",
            )
        return _Parsed(index, decoded[0], False)
    return _Parsed(index, decoded, fast_paths.may_hold_booleans(raw))


def _decode_rows(model: ServedModel, parsed: list[_Parsed], media_type: str) -> Arrays:
    """The rows as one batch; raises unless it decodes to exactly one array row per input row."""
    payload: Any = [p.payload for p in parsed]
    if media_type != media_types.CSV:
        payload = {"instances": payload}
    arrays = model.decode_payload(payload, media_type, may_hold_booleans=any(p.booleans for p in parsed))
    counts = {int(array.shape[0]) for array in arrays.values()}
    if counts != {len(parsed)}:
        raise InvalidInput(
            f"{len(parsed)} lines decoded to {sorted(counts)} rows; each line must be exactly one row",
            field="line",
            value=sorted(counts),
            allowed="one row per line",
        )
    return arrays


def slow_lines(model: ServedModel, lines: Lines) -> Decoded:
    """Each line parsed on its own, then the good ones decoded as one batch; when the batch is refused, rows
    are decoded one by one to find the bad ones."""
    parsed: list[_Parsed] = []
    bad: list[tuple[int, ServingError]] = []
    for index in range(len(lines)):
        try:
            parsed.append(_parse_line(index, lines.raw(index), lines.media_type))
        except ServingError as error:
            bad.append((index, error))
    if not parsed:
        return Decoded(np.empty(0, dtype=np.int64), None, bad)
    try:
        arrays = _decode_rows(model, parsed, lines.media_type)
        return Decoded(np.array([p.index for p in parsed], dtype=np.int64), arrays, bad)
    except ServingError:
        pass
    good: list[tuple[int, Arrays]] = []
    for item in parsed:
        try:
            good.append((item.index, _decode_rows(model, [item], lines.media_type)))
        except ServingError as error:
            bad.append((item.index, error))
    # Rows each fine alone may still not batch together (sequences of different lengths and no pad value): the
    # ones that fit the first good row's shape are scored, the others refused by name (joining.py).
    good_arrays, unfit = join(model.manifest, [arrays for _, arrays in good])
    refused = {position for position, _ in unfit}
    bad += [(good[position][0], error) for position, error in unfit]
    bad.sort(key=lambda pair: pair[0])
    kept = [index for position, (index, _) in enumerate(good) if position not in refused]
    return Decoded(np.array(kept, dtype=np.int64), good_arrays, bad)


def decode_records(model: ServedModel, records: Records) -> Decoded:
    """A Parquet record batch of the model's inputs by tensor (servestack/inference/tabular/parquet_tensors.py)."""
    return Decoded(*tensor_records(model, records))
