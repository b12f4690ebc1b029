"""What a Lambda bundle and an image carry besides their locked wheels, gathered at synth into one folder.

Three parts, each taken from where it really is, so that an installed servestack builds the same bundle as a
source checkout:
- servestack's runtime: `servestack/__init__.py`, the inference core (`servestack/inference/`) and the runtime
  adapters (`servestack/adapters/`) of the servestack that runs the synth, at its installed version; never its
  CLI, constructs or local mode;
- the entry points: the project's `handlers/` (or servestack's default ones, the example project's), always as
  the top-level package `handlers`, so that a function's handler is `handlers.serverless.handler` and a
  container runs `python -m handlers.realtime`;
- the deployment's model packages, at `models/artifacts/<name>/<version>/`: each with exactly the files its
  manifest names (the model, its hooks, its listed files: external data, vocabularies...), the manifest and the
  samples, as the registry holds it (servestack/inference/manifest.py `package_files`). A package missing a
  listed file is refused here, at synth, not at its first cold start; a stray file in the folder, which the
  registry would not carry, is left out, so a hook cannot come to rely on it.

`stage` copies them into a content-addressed folder (same files, same folder: a second synth reuses it), which
the CDK asset points at: `cdk deploy` ships that folder, and local mode runs from it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import servestack
from servestack.artifacts import MANIFEST, named_files
from servestack.inference.errors import ServingError
from servestack.inference.manifest import SAMPLE_FILES
from servestack.inference.paths import confined

FRAMEWORK = Path(servestack.__file__).resolve().parent
RUNTIME = ("__init__.py", "inference", "adapters")
REQUIREMENTS = FRAMEWORK / "cdk" / "requirements"
CONTAINERS = FRAMEWORK / "cdk" / "containers"
ENTRY_POINTS = "handlers"
MODEL_PACKAGES = "models/artifacts"
# Never shipped: caches and compiled files (the bundler and the images compile for their own Python).
_SKIP_DIRS = {"__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache"}

Member = tuple[str, Path]  # (path in the staged folder, file to copy there)


def _walk(base: Path, prefix: str) -> Iterator[Member]:
    if base.is_file():
        yield prefix, base
        return
    for dirpath, dirnames, filenames in os.walk(base):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for name in sorted(filenames):
            if not name.endswith((".pyc", ".pyo")):
                yield f"{prefix}/{(here / name).relative_to(base).as_posix()}", here / name


def runtime_files(framework: Path = FRAMEWORK) -> Iterator[Member]:
    """servestack's runtime as `servestack/...` members."""
    for part in RUNTIME:
        yield from _walk(framework / part, f"servestack/{part}")


def entry_point_files(entry_points: Path) -> Iterator[Member]:
    """A folder of entry-point modules as the `handlers` package (without an `__init__.py`, Python imports it as
    a namespace package, so none is needed)."""
    if not entry_points.is_dir():
        raise FileNotFoundError(f"{entry_points} is not a folder: entry_points names the folder of entry modules")
    yield from _walk(entry_points, ENTRY_POINTS)


def package_files(artifacts_root: Path, artifacts: Sequence[str]) -> Iterator[Member]:
    """The model packages `artifacts` (paths relative to `artifacts_root`) at `models/artifacts/<name>/<version>/`."""
    for rel in artifacts:
        prefix = f"{MODEL_PACKAGES}/{Path(rel).parent.name}/{Path(rel).name}"
        yield from ((f"{prefix}/{name}", path) for name, path in package_members(artifacts_root / rel))


def package_members(package: Path) -> list[Member]:
    """The files of the package folder `package`, by their path in it, sorted: the manifest, every file it names
    (servestack/artifacts.py `named_files`) and the samples present. `FileNotFoundError` (synth's one-line error)
    without a manifest or a named file, or for a name that leads out of the folder."""
    if not (package / MANIFEST).is_file():
        raise FileNotFoundError(f"{package / MANIFEST} not found: the deployment carries this model package")
    try:
        names = named_files(package)
        paths = [confined(package, name, field="file") for name in names]
    except (ValueError, ServingError) as error:  # a manifest that does not parse, a name that leaves the folder
        message = error.message if isinstance(error, ServingError) else str(error)
        raise FileNotFoundError(f"{package / MANIFEST}: {message}") from None
    missing = [path for path in paths if not path.is_file()]
    if missing:
        raise FileNotFoundError(
            f"{missing[0]} (named by {package / MANIFEST}) is missing: a package carries every file its manifest "
            "lists; push it again (servestack models push)"
        )
    samples = [name for name in SAMPLE_FILES if (package / name).is_file()]
    return [(name, package / name) for name in sorted({MANIFEST, *names, *samples})]


def digest(members: Iterable[Member]) -> str:
    """SHA-256 over each member's name and content."""
    h = hashlib.sha256()
    for name, path in members:
        h.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def stage(members: Sequence[Member], kind: str, cache_dir: Path | None = None) -> Path:
    """The members copied into `<cache>/<kind>/<digest>` (reused when it exists); returns that folder."""
    out = (cache_dir or Path(tempfile.gettempdir()) / "servestack-staged") / kind / digest(members)[:24]
    if out.is_dir():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=".partial-", dir=out.parent))
    for name, path in members:
        (partial / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, partial / name)  # with its mode: scripts stay executable
    try:
        partial.rename(out)
    except OSError:  # staged meanwhile by another synth: same digest, same content
        shutil.rmtree(partial, ignore_errors=True)
    return out
