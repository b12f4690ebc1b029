"""The ONNX graph of a model being pushed: copied with the external data it references, skl2onnx's ZipMap output
rewritten into the probability tensor it wraps, and read for what the manifest needs (class labels, the
categories its string encoders know, whether its trees route missing values, the id ranges of its Gathers).

The `onnx` package (a client-side dependency, never needed to serve) is imported only to read or rewrite the
graph; a model without sequence/map outputs is copied byte for byte (servestack/inference/packaging.py writes
the package around it)."""

from __future__ import annotations

import importlib
import importlib.util
import re
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnxruntime as ort

from servestack.inference.errors import ModelLoadError
from servestack.inference.manifest import PATH_PATTERN
from servestack.inference.package_files import RESERVED_NAMES
from servestack.inference.push_scaler import split_scalers
from servestack.inference.push_sequences import graph_id_ranges

_PACKAGE_PATH = re.compile(PATH_PATTERN)
_ORT_PREFIX = re.compile(r"\[ONNXRuntimeError\] : \d+ : \w+ : (?:Load model from .*? failed:)?")
_ORT_SOURCE = re.compile(r"(?:/\S*)?\b\w+\.(?:cc|h|cpp):\d+ (?:[\w:~<>]+\(.*?\) )?")
MAX_REASON_CHARS = 300

# What to change in the conversion when skl2onnx left its ZipMap on (its default for classifiers).
ZIPMAP_FIX = (
    'convert with `to_onnx(clf, X, options={"zipmap": False})` '
    '(or `options={id(clf): {"zipmap": False}}` for one step of a pipeline)'
)
_CLASS_LABEL_ATTRIBUTES = ("classlabels_strings", "classlabels_int64s", "classlabels_ints")


@dataclass
class Prepared:
    """What preparing the ONNX file found and changed."""

    labels: tuple[str | int, ...] | None = None
    labels_note: str | None = None
    probability_output: str | None = None
    # Set when the graph's trees send missing values down a branch of their own (HistGradientBoosting).
    routes_missing_values: bool = False
    # A category each string input's encoder knows, for a sample request it accepts.
    categories: dict[str, str] = field(default_factory=dict)
    changes: list[str] = field(default_factory=list)
    # The id range of each integer input that indexes a Gather on a constant (servestack/inference/push_sequences.py).
    id_ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    # The external data files the graph reads, by their location (relative to the model), and where they were.
    external_data: dict[str, Path] = field(default_factory=dict)


def onnxruntime_reason(error: BaseException, path: Path, shown: Path) -> str:
    """onnxruntime's message for a model it refused, without its prefix and C++ source location, naming `shown`
    (and its folder) where the message names `path` (and its folder): a scratch copy is never what a user gave."""
    text = " ".join(str(error).split())
    text = _ORT_PREFIX.sub("", text)
    text = _ORT_SOURCE.sub("", text).strip()
    for scratch, user in ((str(path), str(shown)), (str(path.parent), str(shown.parent))):
        text = text.replace(scratch, user)
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


def open_session(model_path: Path, shown: Path | None = None) -> ort.InferenceSession:
    """An onnxruntime session of `model_path`; a refusal names `shown` (the user's file) when given."""
    shown = shown or model_path
    options = ort.SessionOptions()
    options.log_severity_level = 4  # the refusal is raised, naming the user's file: no log line naming the copy
    try:
        return ort.InferenceSession(str(model_path), sess_options=options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises untyped errors for files that are not ONNX models
        raise ModelLoadError(
            f"{shown}: onnxruntime cannot load it as an ONNX model: {onnxruntime_reason(exc, model_path, shown)}",
            field="model",
            value=str(shown),
            allowed="an ONNX model file (.onnx)",
        ) from None


def prepare_model(source: Path, target: Path) -> Prepared:
    """Copy `source` to `target`, with the external data files its graph references (beside it, at the same
    relative locations); rewrite a ZipMap output (`seq(map(...))`) into the probability tensor it wraps,
    keeping the output's name, and a float32 `Scaler` into `Sub` and `Mul` (push_scaler.py); read class labels
    from the graph."""
    # Labels, ZipMap and external data need the graph; without onnx, plain models still package.
    onnx: Any = importlib.import_module("onnx") if importlib.util.find_spec("onnx") is not None else None
    prepared = Prepared()
    model = _parsed(onnx, source) if onnx is not None else None
    if model is not None:
        prepared.external_data = _external_data(onnx, model, source)
    session = open_session(source)
    mapped = [node.name for node in session.get_outputs() if node.type.startswith(("seq(", "map("))]
    del session
    for location, data_file in prepared.external_data.items():
        copied = target.parent / location
        if copied.resolve() != data_file.resolve():
            copied.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(data_file, copied)
    if model is None:
        if mapped:
            raise ModelLoadError(
                f"outputs {mapped} are sequences of maps (skl2onnx's ZipMap); converting them needs the `onnx` "
                f"package (pip install onnx), or {ZIPMAP_FIX}",
                field="outputs",
                value=mapped,
            ) from None
        if source.resolve() != target.resolve():
            shutil.copyfile(source, target)
        return prepared
    prepared.labels, prepared.labels_note = _graph_labels(model)
    prepared.routes_missing_values = _routes_missing_values(onnx, model)
    prepared.categories = _known_categories(onnx, model)
    prepared.id_ranges = graph_id_ranges(model)
    prepared.changes.extend(split_scalers(onnx, model))
    if not mapped and not prepared.changes:
        if source.resolve() != target.resolve():
            shutil.copyfile(source, target)
        return prepared
    for name in mapped:
        prepared.changes.append(_unzip(onnx, model, name))
        prepared.probability_output = name
    target.write_bytes(model.SerializeToString())
    return prepared


def _parsed(onnx: Any, source: Path) -> Any:
    """The graph of `source` without its external data; a file that is not one names itself."""
    try:
        return onnx.load(str(source), load_external_data=False)
    except Exception as exc:  # protobuf's DecodeError, or onnx's own errors: no stable type
        reason = " ".join(str(exc).split())[:MAX_REASON_CHARS] or type(exc).__name__
        raise ModelLoadError(
            f"{source}: not an ONNX model (the onnx package cannot parse it: {reason})",
            field="model",
            value=str(source),
            allowed="an ONNX model file (.onnx), as onnx.save_model or torch.onnx.export writes it",
        ) from None


def _graph_tensors(graph: Any) -> Iterator[Any]:
    """Every tensor of a graph: its initializers and the tensors of its nodes' attributes, subgraphs included."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield from (sparse.values, sparse.indices)
    yield from _node_tensors(graph.node)


def _node_tensors(nodes: Any) -> Iterator[Any]:
    for node in nodes:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("sparse_tensor"):
                yield from (attribute.sparse_tensor.values, attribute.sparse_tensor.indices)
            if attribute.HasField("g"):
                yield from _graph_tensors(attribute.g)
            for subgraph in attribute.graphs:
                yield from _graph_tensors(subgraph)


def external_data_locations(onnx: Any, model: Any) -> dict[str, str]:
    """The external data files the graph reads: location (relative to the model file) -> the first tensor kept
    there. Read from each tensor's `external_data` entries, so the graph is parsed without its data."""
    found: dict[str, str] = {}
    tensors = [*_graph_tensors(model.graph), *(t for f in model.functions for t in _node_tensors(f.node))]
    for tensor in tensors:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = next((entry.value for entry in tensor.external_data if entry.key == "location"), "")
        found.setdefault(location, tensor.name)
    return found


def _external_data(onnx: Any, model: Any, source: Path) -> dict[str, Path]:
    """The external data files of `source`'s graph, each checked to be a file beside it (or below its folder)
    at a location a package can hold; the errors name the user's model and data files."""
    resave = (
        "save the model with its data in one file beside it: onnx.save_model(onnx.load(path), 'model.onnx', "
        "save_as_external_data=True, all_tensors_to_one_file=True, location='model.onnx.data')"
    )
    files: dict[str, Path] = {}
    for location, tensor in external_data_locations(onnx, model).items():
        if not _PACKAGE_PATH.fullmatch(location) or location in RESERVED_NAMES:
            raise ModelLoadError(
                f"{source}: tensor {tensor!r} is kept in external data at {location!r}, which a model package "
                f"cannot hold; {resave}",
                field="external_data",
                value=location,
                allowed=f"a relative path of names of letters, digits, '.', '_', '-' ({PATH_PATTERN}), not a file "
                "name of the package",
            )
        data_file = source.parent / location
        if not data_file.is_file():
            raise ModelLoadError(
                f"{source}: tensor {tensor!r} is kept in external data {location!r}, but {data_file} does not "
                "exist; keep the data file beside the model, where the exporter wrote it",
                field="external_data",
                value=str(data_file),
                allowed="the external data files of the graph, beside the .onnx file",
            )
        files[location] = data_file
    return files


def _unzip(onnx: Any, model: Any, output_name: str) -> str:
    """Replace the ZipMap node producing `output_name` with an Identity of its probability tensor."""
    graph = model.graph
    producers = [node for node in graph.node if output_name in node.output]
    consumers = [node for node in graph.node if output_name in node.input]
    zipmap = producers[0] if len(producers) == 1 else None
    if zipmap is None or zipmap.op_type != "ZipMap" or zipmap.domain != "ai.onnx.ml" or consumers:
        raise ModelLoadError(
            f"output {output_name!r} is a sequence of maps that servestack cannot turn into a tensor "
            f"(it is not the graph's last ZipMap); {ZIPMAP_FIX}",
            field=output_name,
            value="seq(map(...))",
            allowed="tensor outputs",
        )
    classes = len(_attribute(onnx, zipmap, ("classlabels_strings", "classlabels_int64s")) or ()) or None
    position = list(graph.node).index(zipmap)
    graph.node.remove(zipmap)
    graph.node.insert(position, onnx.helper.make_node("Identity", [zipmap.input[0]], [output_name]))
    for index, value in enumerate(graph.output):
        if value.name == output_name:
            replacement = onnx.helper.make_tensor_value_info(output_name, onnx.TensorProto.FLOAT, [None, classes])
            graph.output.remove(value)
            graph.output.insert(index, replacement)
    onnx.checker.check_model(model)
    return (
        f"output {output_name!r}: skl2onnx's ZipMap (a list of {{class: probability}} maps) replaced by the "
        f"probability tensor it wraps, float32 [N, {classes or 'classes'}]"
    )


def _attribute(onnx: Any, node: Any, names: Sequence[str]) -> list[Any] | None:
    for attribute in node.attribute:
        if attribute.name in names:
            value = onnx.helper.get_attribute_value(attribute)
            return [v.decode() if isinstance(v, bytes) else v for v in value]
    return None


def _known_categories(onnx: Any, model: Any) -> dict[str, str]:
    """For each string input that reaches a OneHotEncoder through nodes of one data input (Gather, Identity,
    Reshape, Cast...), the encoder's first category: a value a sample request may hold where "" would be an
    unknown category (an encoder trained with `handle_unknown="error"` refuses it)."""
    producer = {output: node for node in model.graph.node for output in node.output}
    inputs = {value.name for value in model.graph.input}
    found: dict[str, str] = {}
    for node in model.graph.node:
        if node.op_type != "OneHotEncoder" or not node.input:
            continue
        categories = _attribute(onnx, node, ("cats_strings",))
        source = node.input[0]
        for _ in range(8):  # a few steps up: skl2onnx puts a Gather or a Reshape between
            if source in inputs or source not in producer:
                break
            source = producer[source].input[0] if producer[source].input else ""
        if categories and source in inputs:
            found.setdefault(source, str(categories[0]))
    return found


def _routes_missing_values(onnx: Any, model: Any) -> bool:
    """Whether a tree ensemble of the graph sends missing values down a branch of their own
    (`nodes_missing_value_tracks_true`, which HistGradientBoosting's trees set). It says the model was trained
    with missing values, not which columns may hold them (a scaler or encoder may sit in between), so it is
    only a hint to pass --allow-nan."""
    for node in model.graph.node:
        if node.domain == "ai.onnx.ml" and node.op_type.startswith("TreeEnsemble"):
            tracks = _attribute(onnx, node, ("nodes_missing_value_tracks_true",))
            if tracks and any(tracks):
                return True
    return False


def _graph_labels(model: Any) -> tuple[tuple[str | int, ...] | None, str | None]:
    """Class labels from the classifier nodes (and ZipMap) of the graph, if they agree on one list, in the
    order of the probability columns: the classes the model predicts, strings or integers as it was trained."""
    import onnx

    found: list[list[Any]] = []
    for node in model.graph.node:
        if node.domain == "ai.onnx.ml":
            value = _attribute(onnx, node, _CLASS_LABEL_ATTRIBUTES)
            if value:
                found.append(value)
    distinct = {tuple(labels) for labels in found}
    if len(distinct) != 1:
        return None, ("the graph's classifier nodes disagree on their classes" if distinct else None)
    labels = next(iter(distinct))
    if all(isinstance(label, str) for label in labels):
        return tuple(labels), None
    return tuple(int(label) for label in labels), None
