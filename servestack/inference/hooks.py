"""User code shipped in a model package: `process.py` with optional `preprocess` and `postprocess`.

    def preprocess(payload, content_type):   # decoded request -> ndarray or {input name: ndarray}
    def postprocess(outputs):                # {output name: ndarray} -> response fields (a dict)

The payload is what the codec decoded: a JSON document, CSV rows as lists of strings, or an ndarray; a body no
codec reads (an image, audio, a multipart form...) comes as its bytes, with the request's whole Content-Type.
Hooks run identically in every mode because every mode calls the core. A hook that raises `InvalidInput`
or `ValueError` is blaming the request (400); anything else is a bug in the hook (500 naming the hook).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from servestack.inference.errors import InvalidInput, ModelLoadError, ServingError, UserCodeError

Preprocess = Callable[[Any, str], "np.ndarray | Mapping[str, np.ndarray]"]
Postprocess = Callable[[dict[str, np.ndarray]], Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class Hooks:
    model_key: str
    preprocess: Preprocess | None = None
    postprocess: Postprocess | None = None

    def run_preprocess(self, payload: Any, content_type: str) -> Any:
        assert self.preprocess is not None
        return _guarded(self.model_key, "preprocess", self.preprocess, payload, content_type)

    def run_postprocess(self, outputs: dict[str, np.ndarray]) -> dict[str, Any]:
        assert self.postprocess is not None
        fields = _guarded(self.model_key, "postprocess", self.postprocess, outputs)
        if not isinstance(fields, Mapping):
            raise UserCodeError(
                f"model {self.model_key}: process.py postprocess returned {type(fields).__name__}, "
                f"expected a dict of response fields"
            )
        return dict(fields)


def distribution_of(module: str | None) -> str:
    """The distribution that installs a top-level module (`PIL` -> `Pillow`), when this environment knows it,
    else the module's own name."""
    from importlib.metadata import PackageNotFoundError, metadata, packages_distributions

    top = (module or "?").split(".")[0]
    found = packages_distributions().get(top)
    if not found:
        return top
    try:
        return str(metadata(found[0])["Name"])  # as the distribution spells itself: Pillow, not pillow
    except PackageNotFoundError:
        return found[0]


def check_requirements(requirements: Sequence[str], model_key: str) -> None:
    """Each requirement the package declares is installed where it runs, at a version it allows; a
    ModelLoadError naming the first one that is not (a deployment installs them: a stale bundle lacks them)."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.requirements import Requirement

    for text in requirements:
        wanted = Requirement(text)
        try:
            found = version(wanted.name)
        except PackageNotFoundError:
            found = None
        if found is None or (wanted.specifier and not wanted.specifier.contains(found, prereleases=True)):
            have = "is not installed" if found is None else f"is {found} here"
            raise ModelLoadError(
                f"model {model_key} requires {text}, which {have}: the deployment installs what its packages "
                "declare when it is synthesized (synthesize again, or `servestack local up --resynth`)"
            )


def load_hooks(path: Path, model_key: str, requirements: Sequence[str] = ()) -> Hooks:
    """Import `process.py` under a name unique to the model, so two models' hooks never collide, once the
    requirements it declares are known to be installed."""
    if not path.exists():
        return Hooks(model_key)
    check_requirements(requirements, model_key)
    module_name = "servestack_hooks_" + "".join(c if c.isalnum() else "_" for c in model_key)
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ModelLoadError(f"{path}: cannot be imported as Python")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ModuleNotFoundError as exc:
        declared = f" (it declares {', '.join(requirements)})" if requirements else " (it declares none)"
        raise ModelLoadError(
            f"{path}: model {model_key}'s hooks import {exc.name!r}, which this deployment does not ship{declared}: "
            f"declare it when you push the package: servestack models push MODEL.onnx --requirement "
            f"{distribution_of(exc.name)}"
        ) from exc
    except Exception as exc:
        raise ModelLoadError(f"{path}: importing the hooks failed: {type(exc).__name__}: {exc}") from exc
    hooks = Hooks(model_key, getattr(module, "preprocess", None), getattr(module, "postprocess", None))
    for name in ("preprocess", "postprocess"):
        if getattr(hooks, name) is not None and not callable(getattr(hooks, name)):
            raise ModelLoadError(f"{path}: {name} must be a function")
    return hooks


def _guarded(model_key: str, hook: str, function: Callable[..., Any], *args: Any) -> Any:
    try:
        return function(*args)
    except ServingError:
        raise
    except ValueError as exc:
        raise InvalidInput(f"model {model_key}: {hook} rejected the request: {exc}", field="body") from exc
    except Exception as exc:
        raise UserCodeError(f"model {model_key}: process.py {hook} failed: {type(exc).__name__}: {exc}") from exc
