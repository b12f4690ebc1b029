"""`models push`: the named columns a package records, from the model's inputs and what the user gives
(`--columns`, a sample file's header, `--allow-nan`), with refusals that say what is allowed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from servestack.inference.errors import InvalidInput
from servestack.inference.manifest import ColumnSpec, TensorSpec


@dataclass(frozen=True)
class ColumnNames:
    """Column names for a `[N, k]` input and where they came from (`--columns`, or the sample file)."""

    names: Sequence[str]
    source: str


def named_columns(
    inputs: Sequence[TensorSpec], names: ColumnNames | None, allow_nan: bool | Sequence[str]
) -> tuple[ColumnSpec, ...] | None:
    """The manifest's columns: one per input when every input is `[N, 1]` (skl2onnx's DataFrame conversion);
    for a single `[N, k]` input, the k names given; else None (a tensor model). NaN where `allow_nan` says."""
    if all(len(spec.shape) == 2 and spec.shape[1] == 1 for spec in inputs):
        if names is not None and names.source == "--columns" and list(names.names) != [s.name for s in inputs]:
            raise InvalidInput(
                f"--columns: the model's inputs are its columns already: {[spec.name for spec in inputs]}",
                field="columns",
                value=",".join(names.names),
                allowed="leave --columns out (or give the input names, in order)",
            )
        found = tuple(ColumnSpec(spec.name, spec.dtype, spec.name) for spec in inputs)
    elif len(inputs) == 1 and len(inputs[0].shape) == 2 and inputs[0].shape[1] is not None and names is not None:
        spec, width = inputs[0], inputs[0].shape[1]
        if len(names.names) != width or len(set(names.names)) != width:
            raise InvalidInput(
                f"{names.source}: {len(names.names)} column names {list(names.names)[:8]} for input {spec.name!r} "
                f"of {width} columns",
                field="columns",
                value=",".join(names.names)[:200],
                allowed=f"{width} distinct names, in the input's column order",
            )
        found = tuple(ColumnSpec(name, spec.dtype, spec.name, index) for index, name in enumerate(names.names))
    else:
        if names is not None and names.source == "--columns":
            shapes = {spec.name: list(spec.shape) for spec in inputs}
            raise InvalidInput(
                f"--columns: names the columns of one [N, k] input; this model's inputs are {shapes}",
                field="columns",
                value=",".join(names.names)[:200],
                allowed="a model with a single [N, k] input, or [N, 1] inputs (named already)",
            )
        if allow_nan:
            raise InvalidInput(
                "--allow-nan: this model has no named columns; name them with --columns (or --sample FILE)",
                field="allow-nan",
                value=allow_nan if isinstance(allow_nan, bool) else ",".join(allow_nan),
                allowed="a model with a single [N, k] input and --columns, or [N, 1] inputs",
            )
        return None
    return _with_nan(found, allow_nan)


def _with_nan(columns: tuple[ColumnSpec, ...], allow_nan: bool | Sequence[str]) -> tuple[ColumnSpec, ...]:
    floats = [column.name for column in columns if column.dtype.startswith("float")]
    wanted = set(floats) if allow_nan is True else set(allow_nan or ())
    for name in sorted(wanted):
        if name not in floats:
            problem = "is not a column" if name not in {c.name for c in columns} else "is not a float column"
            raise InvalidInput(
                f"--allow-nan: {name!r} {problem}; NaN is for float columns: {floats}",
                field="allow-nan",
                value=name,
                allowed=", ".join(floats) or "(this model has no float column)",
            )
    if allow_nan is True and not floats:
        raise InvalidInput(
            "--allow-nan: this model has no float column to hold NaN",
            field="allow-nan",
            value="(all)",
            allowed=", ".join(c.name for c in columns),
        )
    return tuple(msgspec.structs.replace(c, allow_nan=True) if c.name in wanted else c for c in columns)
