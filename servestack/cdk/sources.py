"""What a Lambda bundle and an image carry besides their locked wheels, gathered at synth into one folder.

Three parts, each taken from where it really is, so that an installed servestack builds the same bundle as a
source checkout, and the `requirements.txt` the bundle or image installs (servestack's locked runtime):
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
import json
import os
import shutil
import subprocess
import sys
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
# The scheduled drift check's function (servestack/cdk/monitoring.py) carries the monitor's statistics too.
MONITOR_RUNTIME = (*RUNTIME, "monitor")
REQUIREMENTS = FRAMEWORK / "cdk" / "requirements"
CONTAINERS = FRAMEWORK / "cdk" / "containers"
ENTRY_POINTS = "handlers"
MODEL_PACKAGES = "models/artifacts"
# Never shipped: caches and compiled files (the bundler and the images compile for their own Python).
_SKIP_DIRS = {"__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache"}

Member = tuple[str, Path | bytes]  # (path in the staged folder, the file to copy there or the bytes to write)


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


def requirements_text(name: str) -> bytes:
    """A shipped lock of servestack's runtime (`lambda.txt`, `image-cpu.txt`, `image-gpu.txt`), with a header
    saying what it is: the `requirements.txt` a bundle or an image installs."""
    header = f"# servestack's locked runtime ({name}, servestack/cdk/requirements/)\n".encode()
    return header + (REQUIREMENTS / name).read_bytes()


class RequirementsError(ValueError):
    """The requirements a deployment's model packages declare cannot be installed beside servestack's runtime
    (a conflict, or a name the package index does not know); the message names the packages and uv's answer."""


def declared_requirements(artifacts_root: Path, artifacts: Sequence[str]) -> dict[str, list[str]]:
    """Each model package's declared requirements (its manifest's `requirements`), by package path."""
    found: dict[str, list[str]] = {}
    for rel in artifacts:
        manifest = json.loads((artifacts_root / rel / "manifest.json").read_text(encoding="utf-8"))
        if manifest.get("requirements"):
            found[rel] = [str(r) for r in manifest["requirements"]]
    return found


def deployment_requirements(lock: str, artifacts_root: Path, artifacts: Sequence[str]) -> bytes:
    """What a bundle or an image of these model packages installs: servestack's locked runtime (`lock`, a
    shipped file), plus the packages' declared requirements, resolved with it (uv's universal resolution, so
    that one list serves Lambda's platform, an image's and this machine's, markers kept) and servestack's pins
    held as constraints. Resolved once per input, then kept in a cache."""
    base = requirements_text(lock)
    declared = declared_requirements(artifacts_root, artifacts)
    if not declared:
        return base
    wanted = sorted({r for listed in declared.values() for r in listed})
    key = hashlib.sha256(base + "\n".join(wanted).encode()).hexdigest()[:24]
    cached = _compiled_cache() / f"{key}.txt"
    if cached.is_file():
        return cached.read_bytes()
    with tempfile.TemporaryDirectory(prefix="servestack-requirements-") as scratch:
        lock_file, wanted_file = Path(scratch) / "lock.txt", Path(scratch) / "wanted.txt"
        lock_file.write_bytes(base)
        wanted_file.write_text("\n".join(wanted) + "\n" + base.decode(), encoding="utf-8")
        command = [_uv(), "pip", "compile", str(wanted_file), "-c", str(lock_file), "--universal"]
        command += ["--python-version", "3.11", "--no-header", "--no-annotate", "--quiet"]
        done = subprocess.run([*command, "--offline"], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        who = "; ".join(f"{rel}: {', '.join(listed)}" for rel, listed in declared.items())
        said = " ".join((done.stderr.strip() or done.stdout.strip()).split())[-600:]
        raise RequirementsError(f"the requirements of the model packages ({who}) cannot be installed beside "
                                f"servestack's runtime ({lock}): {said}")  # fmt: skip
    header = f"# servestack's locked runtime ({lock}) and the model packages' requirements ({', '.join(wanted)})\n"
    text = (header + done.stdout).encode()
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_bytes(text)
    return text


def _compiled_cache() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "servestack" / "requirements"
    return Path(os.environ.get("SERVESTACK_REQUIREMENTS_CACHE", default))


def _uv() -> str:
    beside = Path(sys.executable).parent / "uv"
    found = str(beside) if beside.is_file() else shutil.which("uv")
    if found is None:
        raise RequirementsError("uv not found beside this Python or on PATH: pip install 'servestack[cdk]' installs it")
    return found


def runtime_files(framework: Path = FRAMEWORK, parts: Sequence[str] = RUNTIME) -> Iterator[Member]:
    """servestack's runtime (`parts` of it) as `servestack/...` members."""
    for part in parts:
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


def package_members(package: Path) -> list[tuple[str, Path]]:
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


def _content(source: Path | bytes) -> bytes:
    return source if isinstance(source, bytes) else source.read_bytes()


def digest(members: Iterable[Member]) -> str:
    """SHA-256 over each member's name and content."""
    h = hashlib.sha256()
    for name, source in members:
        h.update(name.encode() + b"\0" + hashlib.sha256(_content(source)).digest())
    return h.hexdigest()


def stage(members: Sequence[Member], kind: str, cache_dir: Path | None = None) -> Path:
    """The members copied into `<cache>/<kind>/<digest>` (reused when it exists); returns that folder."""
    out = (cache_dir or Path(tempfile.gettempdir()) / "servestack-staged") / kind / digest(members)[:24]
    if out.is_dir():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=".partial-", dir=out.parent))
    for name, source in members:
        (partial / name).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(source, bytes):
            (partial / name).write_bytes(source)
        else:
            shutil.copy(source, partial / name)  # with its mode: scripts stay executable
    try:
        partial.rename(out)
    except OSError:  # staged meanwhile by another synth: same digest, same content
        shutil.rmtree(partial, ignore_errors=True)
    return out


# Lambda's limit on a zip function's unzipped size (code and layers), and what servestack's runtime takes of it
# (onnxruntime, numpy, the HTTP app's stack, stripped: tests/infra/test_bundling.py measures the real bundle
# under this figure). A function whose model packages would take it past the limit is a container image.
ZIP_LIMIT_BYTES = 250 * 1024 * 1024
RUNTIME_BUNDLE_BYTES = 150 * 1024 * 1024


def packages_bytes(artifacts_root: Path, artifacts: Sequence[str]) -> int:
    """What the packages' files take: each package's members, as its bundle carries them."""
    return sum(path.stat().st_size for rel in artifacts for _, path in package_members(artifacts_root / rel))


def package_type(package: str, artifacts_root: Path, artifacts: Sequence[str]) -> tuple[str, str]:
    """`zip` or `image`, and why: `package` (serving.yaml's `lambda_package`) when it says, else `image` when
    the model packages and servestack's runtime would pass Lambda's 250 MB unzipped limit."""
    if package != "auto":
        return package, f"lambda_package: {package}"
    size = packages_bytes(artifacts_root, artifacts)
    if size + RUNTIME_BUNDLE_BYTES > ZIP_LIMIT_BYTES:
        why = (f"its model packages ({size / 2**20:.0f} MiB) and servestack's runtime (~{RUNTIME_BUNDLE_BYTES // 2**20}"
               f" MiB) pass Lambda's {ZIP_LIMIT_BYTES // 2**20} MiB unzipped limit for zip functions")  # fmt: skip
        return "image", why
    return "zip", ""
