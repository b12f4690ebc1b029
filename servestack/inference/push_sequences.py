"""The sequence inputs of a package being pushed: their pad value, maximum length and id range (`models push
--pad input_ids=0 --max-length input_ids=512 --id-range input_ids=0:30522`), and the id ranges read from the
graph.

What is read from the graph, and what is not: an integer `[N, L]` input that is the indices of a Gather on a
constant (an initializer), directly or through Cast/Identity, can only look up rows `0..size-1` of that
constant's gathered axis (a BERT classifier's `input_ids` on its word embedding of the vocabulary's size), so
its id range is `[0, size)`; when it feeds several such Gathers, the smallest. Negative indices, which ONNX's
Gather also takes, are refused: no tokenizer writes them. The maximum length is not read from the graph: where
the graph fixes L, the shape check already holds a row to it, and a position table indexed by a Range over the
input's shape is too many patterns to follow reliably; pass `--max-length` (onnxruntime's refusal of a longer
row still comes back as a 400, servestack/inference/runtime.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from servestack.inference.errors import InvalidInput
from servestack.inference.manifest import TensorSpec

# Nodes that pass indices through unchanged in value: followed from an input to the Gather that reads it.
_PASS_THROUGH = frozenset({"Cast", "Identity"})


@dataclass(frozen=True)
class SequenceOptions:
    """What `models push` was told about sequence inputs, by input name; `ids` ranges are `[low, high)`."""

    pad: Mapping[str, int] = field(default_factory=dict)
    max_length: Mapping[str, int] = field(default_factory=dict)
    ids: Mapping[str, tuple[int, int]] = field(default_factory=dict)


def parse_assignments(values: Sequence[str], flag: str) -> dict[str, str]:
    """`NAME=VALUE` arguments (repeatable, or comma separated) -> {name: value}; an InvalidInput names the flag."""
    parsed: dict[str, str] = {}
    for text in (part.strip() for value in values for part in value.split(",")):
        if not text:
            continue
        name, equals, value = text.partition("=")
        if not equals or not name.strip() or not value.strip() or name.strip() in parsed:
            raise InvalidInput(
                f"{flag}: {text!r} is not INPUT=VALUE (each input once)", field=flag, value=text, allowed="INPUT=VALUE"
            )
        parsed[name.strip()] = value.strip()
    return parsed


def _integer(text: str, flag: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InvalidInput(
            f"{flag} {name}={text}: not an integer", field=flag, value=text, allowed="an integer"
        ) from None


def sequence_options(pad: Sequence[str], max_length: Sequence[str], id_range: Sequence[str]) -> SequenceOptions:
    """The CLI's `--pad`, `--max-length` and `--id-range` arguments as options (`--id-range input_ids=0:30522`:
    ids 0 to 30521)."""
    ranges: dict[str, tuple[int, int]] = {}
    for name, text in parse_assignments(id_range, "--id-range").items():
        low, colon, high = text.partition(":")
        if not colon:
            raise InvalidInput(
                f"--id-range {name}={text}: not LOW:HIGH", field="--id-range", value=text, allowed="LOW:HIGH"
            )
        ranges[name] = (_integer(low, "--id-range", name), _integer(high, "--id-range", name))
    return SequenceOptions(
        pad={name: _integer(value, "--pad", name) for name, value in parse_assignments(pad, "--pad").items()},
        max_length={
            name: _integer(value, "--max-length", name)
            for name, value in parse_assignments(max_length, "--max-length").items()
        },
        ids=ranges,
    )


def graph_id_ranges(model: Any) -> dict[str, tuple[int, int]]:
    """`[0, size)` for each graph input that is the indices of Gathers on constants (see the module's doc)."""
    constants = {tensor.name: list(tensor.dims) for tensor in model.graph.initializer}
    graph_inputs = {value.name for value in model.graph.input} - set(constants)
    consumers: dict[str, list[Any]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    ranges: dict[str, tuple[int, int]] = {}
    for name in graph_inputs:
        sizes: list[int] = []
        reached, frontier = {name}, [name]
        while frontier:
            for node in consumers.get(frontier.pop(), []):
                if node.op_type in _PASS_THROUGH and node.output[0] not in reached:
                    reached.add(node.output[0])
                    frontier.append(node.output[0])
                elif node.op_type == "Gather" and node.domain in ("", "ai.onnx") and len(node.input) == 2:
                    dims = constants.get(node.input[0])
                    if node.input[1] in reached and dims:
                        axis = next((attribute.i for attribute in node.attribute if attribute.name == "axis"), 0)
                        sizes.append(dims[axis])
        if sizes and min(sizes) > 0:
            ranges[name] = (0, min(sizes))
    return ranges


def sequence_inputs(
    inputs: Sequence[TensorSpec], options: SequenceOptions, graph_ranges: Mapping[str, tuple[int, int]]
) -> list[dict[str, Any]]:
    """The manifest's `sequences` entries: every input an option names (an unknown name is an InvalidInput), and
    every integer `[N, L]` input the graph bounds. An `--id-range` wins over the graph's."""
    by_name = {spec.name: spec for spec in inputs}
    for flag, named in (("--pad", options.pad), ("--max-length", options.max_length), ("--id-range", options.ids)):
        unknown = sorted(set(named) - set(by_name))
        if unknown:
            raise InvalidInput(
                f"{flag}: {unknown} are not inputs of the model",
                field=flag,
                value=unknown,
                allowed=str(sorted(by_name)),
            )
    bounded = {
        name
        for name, spec in by_name.items()
        if len(spec.row_shape) == 1 and spec.dtype.startswith(("int", "uint")) and name in graph_ranges
    }
    entries: list[dict[str, Any]] = []
    for spec in inputs:
        name = spec.name
        if name not in {*options.pad, *options.max_length, *options.ids, *bounded}:
            continue
        entry: dict[str, Any] = {"input": name}
        if name in options.pad:
            entry["pad"] = options.pad[name]
        if name in options.max_length:
            entry["max_length"] = options.max_length[name]
        ids = options.ids.get(name) or (graph_ranges[name] if name in bounded else None)
        if ids is not None:
            entry["ids"] = list(ids)
        entries.append(entry)
    return entries
