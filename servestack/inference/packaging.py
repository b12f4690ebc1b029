"""Write a model package from any ONNX file: the manifest comes from the file's own signature.

`build_package` is what `servestack models push` runs: copy the model (turning skl2onnx's ZipMap output into
a plain tensor), derive the manifest (inputs, outputs, which output is the prediction and which the
probabilities, class labels when the graph has them, the named columns of a tabular model), and write
`sample-request.json` / `sample-response.json` by running the package through the same pipeline every mode
serves it with.

The package carries its files: the ONNX external data the graph references (found beside the `.onnx` file,
where `onnx.save_model` and `torch.onnx.export` write it) and the files the user names (`--file`: a
vocabulary, labels, a tokenizer's folder), each listed in the manifest with its sha256 and size.

The `onnx` package (a client-side dependency, never needed to serve) is imported only to read or rewrite
the graph; a model without sequence/map outputs is copied byte for byte.

Errors name the user's own files: the package is built in a scratch folder, and a failure there (onnxruntime's
message, a hook's import, the sample's run) is reported with the path the user gave, never the scratch one.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import onnxruntime as ort

from servestack.inference.errors import InvalidInput, ModelLoadError, ServingError
from servestack.inference.manifest import (
    HOOKS_FILE,
    MANIFEST_FILE,
    PATH_PATTERN,
    Manifest,
    TensorSpec,
    sha256_of,
)
from servestack.inference.package_files import (
    RESERVED_NAMES,
    checked_requirements,
    copy_files,
    gather_files,
    named_for_user,
)
from servestack.inference.push_columns import ColumnNames, named_columns
from servestack.inference.push_images import ImageOptions, image_spec, with_pillow
from servestack.inference.push_images import sample_request as image_sample_request
from servestack.inference.push_outputs import class_outputs
from servestack.inference.push_samples import write_samples
from servestack.inference.push_sequences import SequenceOptions, graph_id_ranges, sequence_inputs
from servestack.inference.push_tokenizer import check_vocabulary, read_tokenizer, with_tokenizer
from servestack.inference.sample_files import (
    BASELINE_MAX_BYTES,
    BASELINE_STEM,
    BASELINE_SUFFIXES,
    Sample,
    read_sample,
    sample_request,
)

_PACKAGE_PATH = re.compile(PATH_PATTERN)

_ORT_TYPES = {
    "tensor(float)": "float32",
    "tensor(double)": "float64",
    "tensor(float16)": "float16",
    "tensor(int64)": "int64",
    "tensor(int32)": "int32",
    "tensor(int8)": "int8",
    "tensor(uint8)": "uint8",
    "tensor(bool)": "bool",
    "tensor(string)": "string",
}
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


@dataclass(frozen=True)
class BuiltPackage:
    manifest: Manifest
    directory: Path
    changes: tuple[str, ...]
    labels_source: str  # "--labels", "the graph" or "none"
    labels_note: str | None
    routes_missing_values: bool = False  # the graph's trees handle missing values: a hint to pass --allow-nan


def _spec(node: Any) -> TensorSpec:
    if node.type not in _ORT_TYPES:
        hint = f"; {ZIPMAP_FIX}" if node.type.startswith(("seq(map(", "map(")) else ""
        raise ModelLoadError(
            f"tensor {node.name!r} has type {node.type}, which servestack cannot serve{hint}",
            field=node.name,
            value=node.type,
            allowed=", ".join(sorted(_ORT_TYPES)),
        )
    shape = tuple(size if isinstance(size, int) and size > 0 else None for size in node.shape)
    return msgspec.convert({"name": node.name, "dtype": _ORT_TYPES[node.type], "shape": shape}, TensorSpec)


# onnxruntime's messages: `[ONNXRuntimeError] : 1 : FAIL : Load model from PATH failed:/onnxruntime_src/...cc:256
# onnxruntime::Model::Model(...) Unsupported model IR version: 14, ...`: what matters is the last part.
_ORT_PREFIX = re.compile(r"\[ONNXRuntimeError\] : \d+ : \w+ : (?:Load model from .*? failed:)?")
_ORT_SOURCE = re.compile(r"(?:/\S*)?\b\w+\.(?:cc|h|cpp):\d+ (?:[\w:~<>]+\(.*?\) )?")
MAX_REASON_CHARS = 300


def onnxruntime_reason(error: BaseException, path: Path, shown: Path) -> str:
    """onnxruntime's message for a model it refused, without its prefix and C++ source location, naming `shown`
    (and its folder) where the message names `path` (and its folder): a scratch copy is never what a user gave."""
    text = " ".join(str(error).split())
    text = _ORT_PREFIX.sub("", text)
    text = _ORT_SOURCE.sub("", text).strip()
    for scratch, user in ((str(path), str(shown)), (str(path.parent), str(shown.parent))):
        text = text.replace(scratch, user)
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


def _session(model_path: Path, shown: Path | None = None) -> ort.InferenceSession:
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


def signature_of(model_path: Path, shown: Path | None = None) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    session = _session(model_path, shown)
    return tuple(_spec(n) for n in session.get_inputs()), tuple(_spec(n) for n in session.get_outputs())


# ------------------------------------------------------------------------------------------ the graph


def prepare_model(source: Path, target: Path) -> Prepared:
    """Copy `source` to `target`, with the external data files its graph references (beside it, at the same
    relative locations); rewrite a ZipMap output (`seq(map(...))`) into the probability tensor it wraps,
    keeping the output's name; read class labels from the graph."""
    # Labels, ZipMap and external data need the graph; without onnx, plain models still package.
    onnx: Any = importlib.import_module("onnx") if importlib.util.find_spec("onnx") is not None else None
    prepared = Prepared()
    model = _parsed(onnx, source) if onnx is not None else None
    if model is not None:
        prepared.external_data = _external_data(onnx, model, source)
    session = _session(source)
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
    if not mapped:
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


# ------------------------------------------------------------------------------------------ the manifest


def create_package(
    model_path: Path,
    destination: Path,
    *,
    name: str,
    version: str,
    labels: Sequence[str | int] | None = None,
    prediction_output: str | None = None,
    probability_output: str | None = None,
    process_file: Path | None = None,
    description: str = "",
    columns: Sequence[str] | None = None,
    allow_nan: bool | Sequence[str] = False,
    requirements: Sequence[str] = (),
    files: Mapping[str, Path] | None = None,
    sequences: SequenceOptions | None = None,
    tokenizer: Path | None = None,
    image: ImageOptions | None = None,
    outputs_role: tuple[str, str | None] | None = None,
    top_k: int | None = None,
) -> Manifest:
    """Copy `model_path` (with its external data, and hooks) into `destination` and write a manifest with
    checksums. `columns`: the names of a single `[N, k]` input's columns; `allow_nan`: True for every float
    column, or the names of those that may hold NaN; `files`: other files the package carries, by their path in
    the package (`gather_files` makes it from `--file` arguments); `tokenizer`: a Hugging Face tokenizer file the
    package carries to tokenize texts (servestack/inference/text_inputs.py)."""
    return _create(
        model_path,
        destination,
        name=name,
        version=version,
        labels=labels,
        prediction_output=prediction_output,
        probability_output=probability_output,
        process_file=process_file,
        description=description,
        columns=ColumnNames(columns, "--columns") if columns is not None else None,
        allow_nan=allow_nan,
        requirements=requirements,
        files=files or {},
        sequences=sequences,
        tokenizer=tokenizer,
        image=image,
        outputs_role=outputs_role,
        top_k=top_k,
    )[0]


def _create(
    model_path: Path,
    destination: Path,
    *,
    name: str,
    version: str,
    labels: Sequence[str | int] | None,
    prediction_output: str | None,
    probability_output: str | None,
    process_file: Path | None,
    description: str,
    columns: ColumnNames | None = None,
    allow_nan: bool | Sequence[str] = False,
    requirements: Sequence[str] = (),
    files: Mapping[str, Path] | None = None,
    sources: dict[str, Path] | None = None,
    sequences: SequenceOptions | None = None,
    tokenizer: Path | None = None,
    image: ImageOptions | None = None,
    outputs_role: tuple[str, str | None] | None = None,
    top_k: int | None = None,
) -> tuple[Manifest, Prepared]:
    """`sources` is filled, as files are copied, with each package file's origin (for errors to name it)."""
    pushed = read_tokenizer(tokenizer) if tokenizer is not None else None
    files = dict(files or {})
    tokenizer_name = None
    if pushed is not None:
        if process_file is not None:
            raise InvalidInput(
                "--tokenizer and --process: the hook reads the request itself; tokenize in it, or leave it out",
                field="--tokenizer",
                allowed="one of --tokenizer, --process",
            )
        ((tokenizer_name, source),) = gather_files([pushed.path], "--tokenizer").items()
        if tokenizer_name in files and files[tokenizer_name].resolve() != source.resolve():
            raise InvalidInput(
                f"--tokenizer {source}: {tokenizer_name!r} is also {files[tokenizer_name]}",
                field="--tokenizer",
                value=tokenizer_name,
            )
        files[tokenizer_name] = source
        requirements = [*requirements, pushed.requirement]
    declared = checked_requirements(requirements)
    sources = sources if sources is not None else {}
    destination.mkdir(parents=True, exist_ok=True)
    target = destination / "model.onnx"
    sources[target.name] = model_path
    prepared = prepare_model(model_path, target)
    sources.update(prepared.external_data)
    if process_file is not None:
        shutil.copyfile(process_file, destination / HOOKS_FILE)
        sources[HOOKS_FILE] = process_file
    listed = copy_files(destination, files, prepared.external_data, sources)
    inputs, outputs = signature_of(target, shown=model_path)
    output_names = [spec.name for spec in outputs]
    probability_output = probability_output or _first(output_names, ("probabilities", "output_probability"))
    probability_output = probability_output or prepared.probability_output
    prediction_output = prediction_output or _first(output_names, ("label", "output_label"))
    if prediction_output is None and probability_output is not None and len(output_names) == 2:
        prediction_output = next(n for n in output_names if n != probability_output)
    chosen = tuple(labels) if labels is not None else prepared.labels
    roles = class_outputs(
        outputs,
        role=outputs_role,
        top_k=top_k,
        labels=chosen,
        labels_given=labels is not None,
        prediction_output=prediction_output,
        probability_output=probability_output,
    )
    declared_image = image_spec(image, inputs) if image is not None else None
    if declared_image is not None:  # Pillow decodes the pictures: every deployment serving the package installs it
        declared = checked_requirements(with_pillow(declared))
    named = named_columns(inputs, columns, allow_nan)
    sequence_entries = sequence_inputs(
        inputs, with_tokenizer(pushed, sequences or SequenceOptions(), inputs), prepared.id_ranges
    )
    check_vocabulary(pushed, sequence_entries)
    manifest = msgspec.convert(
        {
            "name": name,
            "version": version,
            "file": target.name,
            "sha256": sha256_of(target),
            "process_sha256": sha256_of(destination / HOOKS_FILE) if (destination / HOOKS_FILE).exists() else None,
            "inputs": [spec.to_dict() for spec in inputs],
            "outputs": [spec.to_dict() for spec in outputs],
            "prediction_output": roles.prediction_output,
            "probability_output": roles.probability_output,
            "logits_output": roles.logits_output,
            "top_k": roles.top_k,
            "image": msgspec.to_builtins(declared_image) if declared_image is not None else None,
            "labels": chosen,
            "columns": [msgspec.to_builtins(column) for column in named] if named is not None else None,
            "requirements": declared,
            "description": description,
            "files": listed,
            "sequences": sequence_entries,
            "tokenizer": tokenizer_name,
        },
        Manifest,
    )
    write_manifest(destination, manifest)
    return manifest, prepared


def _first(names: Sequence[str], wanted: Sequence[str]) -> str | None:
    return next((name for name in wanted if name in names), None)


def write_manifest(destination: Path, manifest: Manifest) -> None:
    (destination / MANIFEST_FILE).write_bytes(manifest.to_json())


def baseline_files(sample: Path | None, files: Mapping[str, Path]) -> dict[str, Path]:
    """The `--sample` file, kept whole in the package as `baseline.<suffix>` (a checksummed file like any other)
    where it is at most BASELINE_MAX_BYTES: `servestack monitor` compares captured traffic with it. The sample
    request keeps only its first rows; the baseline keeps them all. A larger file is left out (every deployment
    ships the package), and monitor then asks for `--baseline`."""
    if sample is None or sample.suffix.lower() not in BASELINE_SUFFIXES or sample.stat().st_size > BASELINE_MAX_BYTES:
        return {}
    name = f"{BASELINE_STEM}{sample.suffix.lower()}"
    return {} if name in files else {name: sample}


def build_package(
    model_path: Path,
    destination: Path,
    *,
    name: str,
    version: str,
    labels: Sequence[str | int] | None = None,
    process_file: Path | None = None,
    sample: Path | None = None,
    description: str = "",
    columns: Sequence[str] | None = None,
    allow_nan: bool | Sequence[str] = False,
    requirements: Sequence[str] = (),
    files: Mapping[str, Path] | None = None,
    sequences: SequenceOptions | None = None,
    tokenizer: Path | None = None,
    image: ImageOptions | None = None,
    outputs_role: tuple[str, str | None] | None = None,
    top_k: int | None = None,
) -> BuiltPackage:
    """A complete package from any ONNX file: model (with its external data), manifest, hooks, `files` (by
    their path in the package: `gather_files`) and sample request/response. `sample`: a file of rows
    (servestack/inference/sample_files.py), which also names a `[N, k]` input's columns when `columns` does not.
    Errors name the files the caller gave, never `destination` (a scratch folder, usually)."""
    rows: Sample | None = read_sample(sample) if sample is not None else None
    files = {**(files or {}), **baseline_files(sample, files or {})}
    names = ColumnNames(columns, "--columns") if columns is not None else None
    if names is None and rows is not None and rows.names is not None:
        names = ColumnNames(rows.names, f"--sample {sample.name if sample else ''}".strip())
    sources: dict[str, Path] = {}
    try:
        manifest, prepared = _create(
            model_path,
            destination,
            name=name,
            version=version,
            labels=labels,
            prediction_output=None,
            probability_output=None,
            process_file=process_file,
            description=description,
            columns=names,
            allow_nan=allow_nan,
            requirements=requirements,
            files=files,
            sources=sources,
            sequences=sequences,
            tokenizer=tokenizer,
            image=image,
            outputs_role=outputs_role,
            top_k=top_k,
        )
        request = sample_request(rows, manifest.columns or ()) if rows is not None else None
        if request is None and manifest.image is not None and process_file is None:
            request = image_sample_request(manifest.image)  # a picture, as its users send them
        write_samples(destination, manifest, request, prepared.categories)
    except ServingError as error:
        raise named_for_user(error, destination, sources) from error.__cause__
    source = "--labels" if labels is not None else ("the graph" if manifest.labels is not None else "none")
    return BuiltPackage(
        manifest, destination, tuple(prepared.changes), source, prepared.labels_note, prepared.routes_missing_values
    )
