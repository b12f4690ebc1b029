"""Write a model package from any ONNX file: the manifest comes from the file's own signature."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnxruntime as ort

from models.errors import ModelLoadError
from models.manifest import HOOKS_FILE, MANIFEST_FILE, Manifest, TensorSpec, sha256_of

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


def _spec(node: Any) -> TensorSpec:
    if node.type not in _ORT_TYPES:
        raise ModelLoadError(f"tensor {node.name!r} has type {node.type}, supported: {sorted(_ORT_TYPES)}")
    shape = tuple(size if isinstance(size, int) and size > 0 else None for size in node.shape)
    return TensorSpec(name=node.name, dtype=_ORT_TYPES[node.type], shape=shape)


def signature_of(model_path: Path) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    return tuple(_spec(n) for n in session.get_inputs()), tuple(_spec(n) for n in session.get_outputs())


def create_package(
    model_path: Path,
    destination: Path,
    *,
    name: str,
    version: str,
    labels: Sequence[str] | None = None,
    prediction_output: str | None = None,
    probability_output: str | None = None,
    process_file: Path | None = None,
    description: str = "",
) -> Manifest:
    """Copy `model_path` (and hooks) into `destination` and write a manifest with checksums."""
    destination.mkdir(parents=True, exist_ok=True)
    target = destination / "model.onnx"
    if model_path.resolve() != target.resolve():
        shutil.copyfile(model_path, target)
    if process_file is not None:
        shutil.copyfile(process_file, destination / HOOKS_FILE)
    inputs, outputs = signature_of(target)
    output_names = [spec.name for spec in outputs]
    if probability_output is None and "probabilities" in output_names:
        probability_output = "probabilities"
    if prediction_output is None and "label" in output_names:
        prediction_output = "label"
    manifest = Manifest(
        name=name,
        version=version,
        file=target.name,
        sha256=sha256_of(target),
        process_sha256=sha256_of(destination / HOOKS_FILE) if (destination / HOOKS_FILE).exists() else None,
        inputs=inputs,
        outputs=outputs,
        prediction_output=prediction_output,
        probability_output=probability_output,
        labels=tuple(labels) if labels is not None else None,
        description=description,
    )
    write_manifest(destination, manifest)
    return manifest


def write_manifest(destination: Path, manifest: Manifest) -> None:
    text = json.dumps(manifest.model_dump(mode="json", exclude_none=True), indent=2) + "\n"
    (destination / MANIFEST_FILE).write_text(text)
