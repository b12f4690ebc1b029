"""Lambda assets without Docker.

`LocalPythonBundler` is an `ILocalBundling`: CDK calls `try_bundle(output_dir, options)` during synth and
the bundler fills `output_dir` with
- servestack's locked runtime wheels (servestack/cdk/requirements/lambda.txt, the `runtime` extra pinned by the
  lock servestack was released with), installed by uv from manylinux wheels for CPython 3.12 on the target
  architecture;
- the function's sources, staged at synth (servestack/cdk/sources.py): servestack's runtime at the installed
  version, the project's entry points as the package `handlers`, and the model packages this function serves.
It then strips what inference does not need (tests, type stubs, onnxruntime's C-API library
`capi/libonnxruntime.so*`, which the Python binding does not link) and byte-compiles everything for 3.12 with
hash-checked `.pyc` so the bundle is reproducible. Nothing is read from the project's own lock file or
pyproject.toml: a project pins servestack, and servestack pins its runtime.

The asset hash is computed up front from the requirements and the staged sources, so CDK skips bundling when
`cdk.out` already holds the same bundle. When bundling is skipped (`aws:cdk:bundling-stacks: []`, as local mode
synthesizes), the asset is the staged sources themselves, and local mode runs the function from them.
Installed dependencies are cached per (requirements, platform) under `$SERVESTACK_BUNDLE_CACHE` (default
`~/.cache/servestack/lambda-deps`): only the first bundle for a given lock needs the package index.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsii
from aws_cdk import AssetHashType, BundlingOptions, DockerImage, ILocalBundling
from aws_cdk import aws_lambda as lambda_

from servestack.cdk.shared import check_choice
from servestack.cdk.sources import (
    CONTAINERS,
    RUNTIME,
    Member,
    deployment_requirements,
    entry_point_files,
    package_files,
    package_type,
    runtime_files,
    stage,
)

PYTHON_VERSION = "3.12"
ARCHITECTURES = ("x86_64", "arm64")
# Lambda's python3.12 runtime is Amazon Linux 2023 (glibc 2.34).
_UV_PLATFORM = {"x86_64": "x86_64-manylinux_2_34", "arm64": "aarch64-manylinux_2_34"}
# Bump when the bundle's layout or stripping changes: it is part of the asset hash.
BUNDLER_VERSION = "2"
# What the staged sources hold of the bundle's third-party packages: the list local mode installs them from.
REQUIREMENTS_FILE = "requirements.txt"
# The staged sources, byte-compiled in the bundle (the dependencies are compiled once, in their cache).
SOURCE_DIRS = ("servestack", "handlers")
# Globs (relative to the site-packages root) removed from the dependency tree.
STRIP_GLOBS = (
    "**/tests",
    "**/__pycache__",
    "**/*.pyi",
    "**/*.pyx",
    "**/*.pxd",
    "onnxruntime/capi/libonnxruntime.so*",
    "onnxruntime/transformers",
    "onnxruntime/tools",
    "onnxruntime/quantization",
    "onnxruntime/datasets",
    "numpy/_pyinstaller",
    "numpy/f2py",
    "numpy/typing/tests",
    "numpy/_core/include",
    "**/*.h",
    "**/*.c",
    "bin",
)


class BundlingError(RuntimeError):
    """The Lambda bundle could not be built; the message says what to install or fix."""


def find_uv() -> str:
    """uv beside this interpreter (servestack[cdk] installs it), else on PATH."""
    beside = Path(sys.executable).parent / "uv"
    if beside.is_file():
        return str(beside)
    found = shutil.which("uv")
    if not found:
        raise BundlingError("uv not found beside this Python or on PATH: pip install 'servestack[cdk]' installs it")
    return found


def find_python(version: str = PYTHON_VERSION) -> str | None:
    """An interpreter of the Lambda runtime's version, to byte-compile for it (uv's or pyenv's count)."""
    candidates = sorted((Path.home() / ".pyenv" / "versions").glob(f"{version}.*/bin/python{version}"), reverse=True)
    found = shutil.which(f"python{version}")
    for candidate in [*map(str, candidates), *([found] if found else [])]:
        probe = subprocess.run([candidate, "-c", "pass"], capture_output=True, check=False)
        if probe.returncode == 0:  # pyenv shims exist but fail when the version is not selected
            return candidate
    return None


@jsii.implements(ILocalBundling)
class LocalPythonBundler:
    """Builds a Lambda bundle on this machine: uv-installed manylinux wheels plus the staged `source` folder."""

    def __init__(
        self,
        *,
        source: Path,
        architecture: str = "x86_64",
        python_version: str = PYTHON_VERSION,
        cache_dir: Path | None = None,
    ) -> None:
        check_choice("LocalPythonBundler", "architecture", architecture, ARCHITECTURES)
        self.source = source.resolve()
        self.architecture = architecture
        self.python_version = python_version
        default_cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "servestack" / "lambda-deps"
        self.cache_dir = cache_dir or Path(os.environ.get("SERVESTACK_BUNDLE_CACHE", default_cache))

    # --- hashing --------------------------------------------------------------------------------

    def asset_hash(self) -> str:
        """Hash of everything that determines the bundle: the requirements, the platform and the staged sources
        (whose folder is named by their digest)."""
        h = hashlib.sha256()
        h.update(f"{BUNDLER_VERSION}|{self.architecture}|{self.python_version}|{STRIP_GLOBS}".encode())
        h.update(self.requirements().encode())
        h.update(self.source.name.encode())
        return h.hexdigest()

    # --- ILocalBundling -------------------------------------------------------------------------

    def try_bundle(self, output_dir: str, options: Any = None) -> bool:
        self.bundle(Path(output_dir))
        return True

    def bundle(self, out: Path) -> Path:
        """Fill `out` with the bundle; return it."""
        out.mkdir(parents=True, exist_ok=True)
        shutil.copytree(self._dependencies(), out, dirs_exist_ok=True, symlinks=False)
        shutil.copytree(self.source, out, dirs_exist_ok=True)
        self._compile(out, only=SOURCE_DIRS)
        return out

    # --- steps ----------------------------------------------------------------------------------

    def requirements(self) -> str:
        """What the bundle installs: the staged sources' `requirements.txt` (servestack's locked runtime)."""
        return (self.source / REQUIREMENTS_FILE).read_text(encoding="utf-8")

    def _dependencies(self) -> Path:
        requirements = self.requirements()
        key = hashlib.sha256(
            f"{BUNDLER_VERSION}|{self.architecture}|{self.python_version}|{STRIP_GLOBS}|{requirements}".encode()
        ).hexdigest()[:24]
        target = self.cache_dir / f"{self.architecture}-py{self.python_version}-{key}"
        if target.is_dir():
            return target
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="deps-", dir=self.cache_dir))
        try:
            reqs = work / "requirements.txt"
            reqs.write_text(requirements, encoding="utf-8")
            site = work / "site"
            self._install(reqs, site)
            strip(site)
            self._compile(site)
            try:
                site.rename(target)
            except OSError:
                if not target.is_dir():  # a concurrent synth won the race otherwise
                    raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return target

    def _install(self, requirements: Path, site: Path) -> None:
        uv = find_uv()
        cmd = [uv, "pip", "install", "--quiet", "--no-deps", "--only-binary", ":all:", "--target", str(site)]
        cmd += ["--python-platform", _UV_PLATFORM[self.architecture], "--python-version", self.python_version]
        cmd += ["--python", sys.executable, "-r", str(requirements)]
        # Cached wheels first (works offline), then the package index.
        done = subprocess.run([*cmd, "--offline"], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            shutil.rmtree(site, ignore_errors=True)
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise BundlingError(
                f"installing Lambda dependencies for {self.architecture}/py{self.python_version} failed "
                f"(needs the package index once, then works from uv's cache):\n{done.stderr.strip()}"
            )

    def _compile(self, tree: Path, only: Sequence[str] = ()) -> None:
        """Byte-compile for the Lambda runtime's Python (hash-checked .pyc: reproducible, no mtimes)."""
        python = find_python(self.python_version)
        if python is None:
            print(
                f"servestack bundling: no python{self.python_version} found; the bundle ships without .pyc "
                "(cold starts ~1 s slower)",
                file=sys.stderr,
            )
            return
        targets = [str(tree / d) for d in only if (tree / d).is_dir()] if only else [str(tree)]
        script = (
            "import compileall, py_compile, sys\n"
            "for d in sys.argv[1:]:\n"
            "    compileall.compile_dir(d, quiet=1, workers=0, "
            "invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)\n"
        )
        subprocess.run([python, "-I", "-c", script, *targets], check=True, capture_output=True)


def strip(site: Path) -> None:
    """Remove tests, type stubs and files inference does not load from an installed dependency tree."""
    for pattern in STRIP_GLOBS:
        for path in sorted(site.glob(pattern), reverse=True):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()


def tree_size_bytes(tree: Path) -> int:
    return sum(p.stat().st_size for p in tree.rglob("*") if p.is_file() and not p.is_symlink())


def lambda_source(
    *,
    entry_points: Path,
    artifacts: Sequence[str],
    artifacts_root: Path,
    cache_dir: Path | None = None,
    runtime: Sequence[str] = RUNTIME,
    extra: Sequence[Member] = (),
) -> Path:
    """The function's sources staged for its bundle: servestack's runtime (its `runtime` parts), the entry points
    (as `handlers`), the model packages `artifacts` (relative to `artifacts_root`) and any `extra` members."""
    members = [
        (REQUIREMENTS_FILE, deployment_requirements("lambda.txt", artifacts_root, artifacts)),
        *runtime_files(parts=runtime),
        *entry_point_files(entry_points),
        *package_files(artifacts_root, artifacts),
        *extra,
    ]
    return stage(members, "lambda-source", cache_dir)


LAMBDA_DOCKERFILE = "lambda.Dockerfile"


@dataclass(frozen=True)
class FunctionCode:
    """A servestack function's code: a zip bundle (`zip`), or a container image built from `image_context` (a
    function past Lambda's zip limit), whose command is the function's handler."""

    zip: lambda_.Code | None = None
    image_context: Path | None = None
    reason: str = ""  # why it is an image

    @property
    def package_type(self) -> str:
        return "image" if self.image_context is not None else "zip"


def function_code(
    *,
    entry_points: Path,
    artifacts: Sequence[str],
    artifacts_root: Path,
    architecture: str = "x86_64",
    package: str = "auto",
    runtime: Sequence[str] = RUNTIME,
    extra: Sequence[Member] = (),
) -> FunctionCode:
    """The code of a servestack function: a zip bundle while it fits Lambda's limit, else a container image of
    the same sources (`package` forces one: `zip`, `image`)."""
    kind, reason = package_type(package, artifacts_root, artifacts)
    if kind == "zip":
        return FunctionCode(
            zip=lambda_code(
                entry_points=entry_points,
                artifacts=artifacts,
                artifacts_root=artifacts_root,
                architecture=architecture,
                runtime=runtime,
                extra=extra,
            )
        )
    source = lambda_source(
        entry_points=entry_points, artifacts=artifacts, artifacts_root=artifacts_root, runtime=runtime, extra=extra
    )
    members = [(LAMBDA_DOCKERFILE, CONTAINERS / LAMBDA_DOCKERFILE), *_tree(source)]
    return FunctionCode(image_context=stage(members, "lambda-image-context"), reason=reason)


def _tree(folder: Path) -> list[Member]:
    return sorted((p.relative_to(folder).as_posix(), p) for p in folder.rglob("*") if p.is_file())


def lambda_code(
    *,
    entry_points: Path,
    artifacts: Sequence[str],
    artifacts_root: Path,
    architecture: str = "x86_64",
    python_version: str = PYTHON_VERSION,
    runtime: Sequence[str] = RUNTIME,
    extra: Sequence[Member] = (),
) -> lambda_.Code:
    """`lambda_.Code` for a servestack function, bundled locally (never with Docker): servestack's runtime, the
    entry points in the folder `entry_points`, and the model packages `artifacts` of the project `artifacts_root`."""
    source = lambda_source(
        entry_points=entry_points, artifacts=artifacts, artifacts_root=artifacts_root, runtime=runtime, extra=extra
    )
    bundler = LocalPythonBundler(source=source, architecture=architecture, python_version=python_version)
    return lambda_.Code.from_asset(
        str(source),
        asset_hash_type=AssetHashType.CUSTOM,
        asset_hash=bundler.asset_hash(),
        bundling=BundlingOptions(
            # Never pulled: `local` always bundles (or raises with what to fix).
            image=DockerImage.from_registry(f"public.ecr.aws/sam/build-python{python_version}"),
            command=["false"],
            # jsii calls `try_bundle(output_dir, options)` with the options as one positional object, not as
            # the keyword arguments the Python binding's protocol declares.
            local=bundler,  # type: ignore[arg-type]
        ),
    )


__all__ = [
    "BundlingError",
    "FunctionCode",
    "LocalPythonBundler",
    "function_code",
    "lambda_code",
    "lambda_source",
    "package_type",
    "strip",
    "tree_size_bytes",
]
