"""`servestack.models.push(estimator, sample, name=...)`: a fitted scikit-learn estimator or pipeline (or a
LightGBM / XGBoost model, with `pip install 'servestack[onnxmltools]'`) pushed from the process that trained it.

    from servestack import models
    models.push(pipeline, X_train, name="wine")

1. The estimator is converted to ONNX here, in your process, with skl2onnx: the sample's columns become the
   model's inputs (servestack/conversion.py: one `[N, 1]` input per DataFrame column, named after it and typed
   by its dtype; text columns as strings), classifiers without skl2onnx's ZipMap.
2. The ONNX model's answers are compared with the estimator's own on every row of the sample: labels must be
   equal, numbers within float32 tolerance (|onnx - estimator| <= 1e-5 + 1e-4 x |estimator|). A conversion
   that answers differently is refused with the worst row named, before anything is written.
3. The package is written, and pushed, by `servestack models push` itself (the same arguments, the same code,
   the same report), with the sample's first rows as its `sample-request.json`.

The command line stays ONNX-only: it never unpickles a model. Only this function, in the process that already
holds the estimator, converts one.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from servestack.conversion import TOLERANCE_TEXT, Column, check_answers, sample_columns, to_onnx
from servestack.inference.errors import InvalidInput

if TYPE_CHECKING:
    from servestack.inference.manifest import Manifest

# Rows of the sample written as the package's sample request (what smoke tests and pre-traffic hooks send).
SAMPLE_REQUEST_ROWS = 5


@dataclass(frozen=True)
class Pushed:
    """What `push` wrote: the package's manifest, and how many sample rows the ONNX answers were checked on."""

    manifest: Manifest
    checked_rows: int


def push(
    estimator: Any,
    sample: Any,
    *,
    name: str,
    version: str | None = None,
    labels: list[str] | None = None,
    process: Path | str | None = None,
    requirements: list[str] | None = None,
    files: Sequence[Path | str] = (),
    artifacts: Path | str | None = None,
    registry: str | None = None,
    promote: bool = False,
) -> Pushed:
    """Convert `estimator` (fitted) to ONNX with `sample`'s columns as its inputs, check its answers against the
    estimator's on every row of `sample`, then write and push the package as `servestack models push` does.

    `sample`: rows the estimator predicts on, usually (part of) its training data: a pandas or polars
    DataFrame or a pyarrow Table (one input per column), a 1-D array of text (one string input) or a 2-D array
    (one `[N, k]` input named `input`). The other arguments are `servestack models push`'s flags: `--version`,
    `--labels`, `--process`, `--requirement` (`requirements`, a list), `--file` (`files`: each file or folder the
    package carries, for the hooks to read beside them), `--artifacts` (default: the project's models/artifacts),
    `--registry` (default:
    $SERVESTACK_REGISTRY_URI, else the running `local up`'s) and `--promote`.

    Raises `InvalidInput` when the sample has a column type ONNX cannot take, skl2onnx cannot convert the
    estimator, or the converted model answers differently (nothing is written then); the command's own errors
    (`CommandError`, `ServingError`) otherwise, as the command line reports them."""
    import importlib.util

    from servestack.frameworks import convert, framework_of
    from servestack.inference.registry import check_name

    check_name(name)
    pushing = PushOptions(version, labels, process, requirements, files, artifacts, registry, promote)
    framework = framework_of(estimator)
    if framework is not None:
        converted = convert(estimator, sample, framework)
        args = _write_and_push(converted.onnx_model, tensor_sample_request(converted.inputs), name, pushing)
        return Pushed(_pushed_manifest(name, version, args), len(next(iter(converted.inputs.values()))))
    if importlib.util.find_spec("skl2onnx") is None:
        raise InvalidInput(
            "servestack.models.push converts with skl2onnx, which is not installed",
            field="estimator",
            value=type(estimator).__name__,
            allowed="pip install skl2onnx (or 'servestack[onnxmltools]', which LightGBM / XGBoost models need)",
        )
    columns = sample_columns(sample)
    onnx_model = to_onnx(estimator, columns)
    mismatches, _ = check_answers(estimator, sample, columns, onnx_model)
    if mismatches:
        worst = max(mismatches, key=lambda mismatch: mismatch.excess)
        raise InvalidInput(
            f"the ONNX conversion of {type(estimator).__name__} does not answer as the estimator does: "
            f"{worst.describe()}; nothing was written",
            field="estimator",
            value=f"{worst.output} row {worst.row}",
            allowed=f"a conversion whose answers match the estimator's on every sample row ({TOLERANCE_TEXT})",
        )
    args = _write_and_push(onnx_model, sample_request(columns), name, pushing, allow_nan=_has_nan(columns))
    return Pushed(_pushed_manifest(name, version, args), len(columns[0].values))


@dataclass(frozen=True)
class PushOptions:
    """`push`'s arguments that are `servestack models push`'s flags."""

    version: str | None
    labels: list[str] | None
    process: Path | str | None
    requirements: list[str] | None
    files: Sequence[Path | str] | Path | str
    artifacts: Path | str | None
    registry: str | None
    promote: bool


def _write_and_push(
    onnx_model: bytes, sample_text: str, name: str, options: PushOptions, *, allow_nan: bool = False
) -> argparse.Namespace:
    """Write the ONNX model and its sample request to a scratch folder and run `servestack models push` on them."""
    with tempfile.TemporaryDirectory(prefix="servestack-python-push-") as scratch:
        model_file = Path(scratch) / "model.onnx"
        model_file.write_bytes(onnx_model)
        sample_file = Path(scratch) / "sample.json"
        sample_file.write_text(sample_text, encoding="utf-8")
        argv = [str(model_file), "--name", name, "--sample", str(sample_file)]
        argv += _flags(
            version=options.version,
            labels=options.labels,
            process=options.process,
            artifacts=options.artifacts,
            registry=options.registry,
        )
        argv += [f"--requirement={requirement}" for requirement in options.requirements or []]
        chosen = [options.files] if isinstance(options.files, str | Path) else list(options.files)
        argv += [argument for path in chosen for argument in ("--file", str(path))]
        argv += ["--promote"] if options.promote else []
        args = _push_arguments(argv, allow_nan=allow_nan)
        from servestack.cli.models import run_push

        run_push(args)
    return args


def tensor_sample_request(inputs: dict[str, np.ndarray]) -> str:
    """A deep learning model's sample request: its first sample rows, `{"instances": ...}` for one input named
    `input`, `{"inputs": {...}}` by name otherwise."""
    import json

    rows = {name: array[:SAMPLE_REQUEST_ROWS].tolist() for name, array in inputs.items()}
    if list(rows) == ["input"]:
        return json.dumps({"instances": rows["input"]})
    return json.dumps({"inputs": rows})


def sample_request_rows(columns: list[Column]) -> np.ndarray:
    """The sample rows the package's sample request holds: the first ones without a missing value (a request
    may carry NaN only where the manifest allows it), else simply the first ones."""
    complete = np.ones(len(columns[0].values), dtype=bool)
    for column in columns:
        if column.kind == "float32":
            complete &= ~np.isnan(column.values).any(axis=1)
    rows = np.flatnonzero(complete)[:SAMPLE_REQUEST_ROWS]
    return rows if len(rows) else np.arange(min(SAMPLE_REQUEST_ROWS, len(complete)))


def sample_request(columns: list[Column]) -> str:
    """The package's sample request: `{"instances": ...}` for one input, `{"inputs": {...}}` for several."""
    import json

    rows = sample_request_rows(columns)
    if len(columns) == 1:
        return json.dumps({"instances": columns[0].values[rows].tolist()})
    return json.dumps({"inputs": {column.name: column.values[rows].tolist() for column in columns}})


def _has_nan(columns: list[Column]) -> bool:
    return any(column.kind == "float32" and bool(np.isnan(column.values).any()) for column in columns)


def _flags(**values: Any) -> list[str]:
    argv: list[str] = []
    for flag, value in values.items():
        if value is None:
            continue
        text = ",".join(str(label) for label in value) if flag == "labels" else str(value)
        argv += [f"--{flag}", text]
    return argv


def _push_arguments(argv: list[str], *, allow_nan: bool) -> argparse.Namespace:
    """`servestack models push`'s arguments, parsed by its own parser, so every flag it has keeps its default.
    A sample with NaN asks for `--allow-nan` where the command has that flag."""
    from servestack.cli.models import push_arguments

    parser = argparse.ArgumentParser(prog="servestack.models.push", add_help=False)
    push_arguments(parser)
    if allow_nan:
        args, unknown = parser.parse_known_args([*argv, "--allow-nan"])
        if not unknown:
            return args
    return parser.parse_args(argv)


def _pushed_manifest(name: str, version: str | None, args: argparse.Namespace) -> Manifest:
    """The manifest just written: in the artifacts folder when there is one, else in the registry."""
    from servestack import project
    from servestack.cli.models import optional_registry
    from servestack.inference.registry import DirectoryStore, ModelRegistry
    from servestack.inference.service import version_order

    root = project.find_project()
    artifacts = args.artifacts or (project.artifacts_root(root) if root is not None else None)
    registries = [ModelRegistry(DirectoryStore(artifacts))] if artifacts is not None else []
    if not registries:
        remote = optional_registry(args.registry, args.state)
        registries = [remote[0]] if remote is not None else []
    registry = registries[0]
    chosen = version or max(registry.versions(name), key=version_order)
    manifest = registry.manifest(name, chosen)
    if manifest is None:  # run_push wrote it a moment ago; only a concurrent delete gets here
        raise InvalidInput(f"{name}@{chosen} is not in {registry.uri} after the push", field="name", value=name)
    return manifest


__all__ = ["Pushed", "push", "sample_request", "sample_request_rows", "tensor_sample_request"]
