"""Write a model package from any ONNX file: the manifest comes from the file's own signature.

`build_package` is what `servestack models push` runs: copy the model (turning skl2onnx's ZipMap output into
a plain tensor), derive the manifest (inputs, outputs, which output is the prediction and which the
probabilities, class labels when the graph has them, the named columns of a tabular model), and write
`sample-request.json` / `sample-response.json` by running the package through the same pipeline every mode
serves it with.

The package carries its files: the ONNX external data the graph references (found beside the `.onnx` file,
where `onnx.save_model` and `torch.onnx.export` write it) and the files the user names (`--file`: a
vocabulary, labels, a tokenizer's folder), each listed in the manifest with its sha256 and size.

The graph itself is copied, rewritten and read by servestack/inference/push_graph.py; this module writes the
package around it.

Errors name the user's own files: the package is built in a scratch folder, and a failure there (onnxruntime's
message, a hook's import, the sample's run) is reported with the path the user gave, never the scratch one.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

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
    checked_requirements,
    copy_files,
    gather_files,
    named_for_user,
)
from servestack.inference.push_columns import ColumnNames, named_columns
from servestack.inference.push_graph import ZIPMAP_FIX, Prepared, open_session, prepare_model
from servestack.inference.push_images import ImageOptions, image_spec, with_pillow
from servestack.inference.push_images import sample_request as image_sample_request
from servestack.inference.push_outputs import class_outputs
from servestack.inference.push_samples import write_samples
from servestack.inference.push_sequences import SequenceOptions, sequence_inputs
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


def signature_of(model_path: Path, shown: Path | None = None) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    session = open_session(model_path, shown)
    return tuple(_spec(n) for n in session.get_inputs()), tuple(_spec(n) for n in session.get_outputs())


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
