"""Where the model packages serving.yaml names are, and what to run when one is missing.

A model `name@version` lives at `<project>/<path>` (`path` default `models/artifacts/<name>/<version>`, the
folder `servestack models push` writes). When the project has no such folder and the model is one of the
packages bundled with servestack, the bundled one is used (that is what lets a scratch serving.yaml name
`digits` without copying it). A missing package is reported once, naming the folder and the command that
creates it: `servestack models push` for your own models, `make models` for the bundled ones.

Imports stay light (no onnxruntime): spec loading runs this on every CLI start.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol

from servestack.template import TemplateMissing, bundled_artifacts


class ModelSpec(Protocol):
    """What this module reads of `servestack.spec.ModelSpec` (a protocol: servestack/spec/loading.py imports this
    module)."""

    @property
    def name(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def path(self) -> str | None: ...
    @property
    def artifact_path(self) -> str: ...
    @property
    def key(self) -> str: ...


class ServingSpec(Protocol):
    @property
    def models(self) -> Sequence[ModelSpec]: ...


# The packages servestack/sample_models.py builds (its RECIPES); tests/unit/test_artifacts.py keeps the two in step.
BUNDLED_MODELS = {"digits": "1", "breast-cancer": "1"}
MANIFEST = "manifest.json"


def bundled_root() -> Path | None:
    """Where the bundled packages are (the example project's), or None in an incomplete installation."""
    try:
        return bundled_artifacts()
    except TemplateMissing:
        return None


def package_dir(model: ModelSpec, root: Path, *, bundled: bool = True) -> Path | None:
    """The package folder of `model` for the project at `root` (or the bundled one), None when missing."""
    local = root / model.artifact_path
    if _problem(local) is None:
        return local
    bundled_packages = bundled_root() if bundled and model.path is None else None
    fallback = bundled_packages / model.name / model.version if bundled_packages is not None else None
    if fallback is not None and _problem(fallback) is None:
        return fallback
    return None


def named_files(folder: Path) -> list[str]:
    """The files the manifest in `folder` names: the model, `process.py` when it has `process_sha256`, and each of
    `files`; read as plain JSON (the manifest's own checks run where the package loads, and synth's test projects
    use stub manifests). `ValueError` naming the manifest when it cannot be read."""
    manifest = folder / MANIFEST
    try:
        document = json.loads(manifest.read_text(encoding="utf-8"))
        names = [str(document.get("file") or "model.onnx")]
        names += ["process.py"] if document.get("process_sha256") else []
        names += [str(entry["name"]) for entry in document.get("files") or ()]
    except (ValueError, AttributeError, KeyError, TypeError) as exc:
        raise ValueError(f"{manifest} is not a valid manifest ({exc})") from None
    return names


def _problem(folder: Path) -> str | None:
    """What is wrong with the package at `folder`, or None when its manifest and every file it names are there."""
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return f"no model package at {folder} ({MANIFEST} missing)"
    try:
        names = named_files(folder)
    except ValueError as exc:
        return str(exc)
    for name in names:
        if not (folder / name).is_file():
            return f"{folder / name} (named by {manifest}) is missing"
    return None


def creating_command(model: ModelSpec, root: Path) -> str:
    """The command that writes the package serving.yaml expects for `model`."""
    if model.path is None and BUNDLED_MODELS.get(model.name) == model.version:
        if (root / "models" / "artifacts").resolve() == bundled_root():  # servestack's own source checkout
            return "make models"
        out = shlex.quote(str(root / "models" / "artifacts"))
        return f"python -m servestack.sample_models --out {out} {model.name}"
    push = f"servestack models push MODEL.onnx --name {model.name} --version {model.version}"
    if model.path is not None:
        return f"{push} (it writes models/artifacts/{model.name}/{model.version}/; then drop `path:`)"
    return push


def problems(spec: ServingSpec, root: Path, *, bundled: bool = True) -> Iterator[str]:
    """One line per declared model without a package: `models.<i>: <what is missing>; create it: <command>`."""
    for index, model in enumerate(spec.models):
        if package_dir(model, root, bundled=bundled) is None:
            what = _problem(root / model.artifact_path)
            yield f"models.{index} ({model.key}): {what}; create it: {creating_command(model, root)}"


def sample_file(model: ModelSpec, root: Path, which: str) -> Path:
    """`sample-request.json` / `sample-response.json` of a package; a `FileNotFoundError` naming the command
    that writes it when absent."""
    folder = package_dir(model, root) or root / model.artifact_path
    path = folder / f"sample-{which}.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found for model {model.key}: {creating_command(model, root)} writes it "
            f"(or write a sample {which} there yourself)"
        )
    return path


def model_dir_for(spec: ServingSpec, root: Path, scratch: Path) -> Path:
    """One `<name>/<version>/` folder holding every package of the project and serving.yaml's models.

    The project's own `models/artifacts` when it holds them all, the bundled folder when that does, else
    `scratch` filled with links to each package (a project naming a bundled model beside its own)."""
    project = root / "models" / "artifacts"
    dirs = {model.key: package_dir(model, root) for model in spec.models}
    for candidate in (project, bundled_root()):
        if candidate is not None and all(
            found is not None and found.parent.parent == candidate for found in dirs.values()
        ):
            return candidate
    scratch.mkdir(parents=True, exist_ok=True)
    packages = {p.parent.parent.name + "/" + p.parent.name: p.parent for p in project.glob(f"*/*/{MANIFEST}")}
    packages |= {key.replace("@", "/"): found for key, found in dirs.items() if found is not None}
    for relative, target in packages.items():
        link = scratch / relative
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            if link.resolve() == target.resolve():
                continue
            link.unlink()
        link.symlink_to(target.resolve(), target_is_directory=True)
    return scratch
