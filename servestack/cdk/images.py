"""Build contexts of container images that carry their models (the Fargate batch image).

The realtime container gets its model from SageMaker (`ModelDataUrl`, unpacked under /opt/ml/model); a Fargate
task has no such step. So the batch task's image carries its model: at synth, `image_context` stages a build
context holding what the Dockerfile `COPY`s from servestack's sources plus the deployment's model packages at
`models/artifacts/<name>/<version>/`, where `COPY models ./models` puts them into the image. CDK then stages
that folder into cdk.out as the image asset (no Docker needed at synth), so the context `cdk deploy` builds
from is the one local mode can run from, model included.

The context is content-addressed (same sources and packages, same folder and asset hash), under
`$TMPDIR/servestack-image-context/<digest>`.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

# Never part of a context: caches, and the working tree's own packages (only the deployment's are added).
_SKIP_DIRS = {"__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache"}
MODEL_PACKAGES = "models/artifacts"


def dockerfile_workdir(dockerfile: Path) -> str:
    """The image's working directory: the Dockerfile's last `WORKDIR` (absolute), `/` without one."""
    workdir = "/"
    for words in _instructions(dockerfile):
        if words[0].upper() == "WORKDIR":
            workdir = words[1]
    return workdir


def _instructions(dockerfile: Path) -> Iterator[list[str]]:
    text = re.sub(r"\\\n", " ", dockerfile.read_text(encoding="utf-8"))
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            yield words


def copied_sources(dockerfile: Path) -> list[str]:
    """The context paths the Dockerfile `COPY`s (relative, in order; `--from` copies are not from the context)."""
    sources: list[str] = []
    for words in _instructions(dockerfile):
        if words[0].upper() != "COPY" or any(w.startswith("--from") for w in words):
            continue
        args = [w for w in words[1:] if not w.startswith("--")]
        sources += [s.rstrip("/") for s in args[:-1] if s.rstrip("/") not in sources]
    return sources


def _files(base: Path, rel: str) -> Iterator[tuple[str, Path]]:
    path = base / rel
    if path.is_file():
        yield rel, path
        return
    for dirpath, dirnames, filenames in os.walk(path):
        here = Path(dirpath)
        relative = here.relative_to(base).as_posix()
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and f"{relative}/{d}" != MODEL_PACKAGES)
        for name in sorted(filenames):
            if not name.endswith((".pyc", ".pyo")):
                yield f"{relative}/{name}", here / name


def image_context(
    *, code_root: Path, dockerfile: str, artifacts_root: Path, artifacts: Sequence[str], cache_dir: Path | None = None
) -> Path:
    """A build context for `dockerfile` (relative to `code_root`) with the model packages `artifacts` (paths
    relative to `artifacts_root`, e.g. `models/artifacts/digits/1`) at `models/artifacts/<name>/<version>/`."""
    docker_path = code_root / dockerfile
    members: list[tuple[str, Path]] = [(dockerfile, docker_path)]
    for rel in copied_sources(docker_path):
        if not (code_root / rel).exists():
            raise FileNotFoundError(f"{code_root / rel} not found: {dockerfile} copies it into the image")
        members += [m for m in _files(code_root, rel) if m[0] != dockerfile]
    for rel in artifacts:
        package = artifacts_root / rel
        if not (package / "manifest.json").is_file():
            raise FileNotFoundError(f"{package / 'manifest.json'} not found: the image carries this model package")
        target = f"{MODEL_PACKAGES}/{Path(rel).parent.name}/{Path(rel).name}"
        members += [(f"{target}/{name}", path) for name, path in _files_below(package)]
    digest = hashlib.sha256()
    for name, path in members:
        digest.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    out = (cache_dir or Path(tempfile.gettempdir()) / "servestack-image-context") / digest.hexdigest()[:24]
    if not out.is_dir():
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=".partial-", dir=out.parent))
        for name, path in members:
            (partial / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, partial / name)  # with its mode: the Dockerfile runs containers/*.sh
        try:
            partial.rename(out)
        except OSError:  # staged meanwhile by another synth: same digest, same content
            shutil.rmtree(partial, ignore_errors=True)
    return out


def _files_below(package: Path) -> Iterator[tuple[str, Path]]:
    for path in sorted(package.rglob("*")):
        if path.is_file() and not any(part in _SKIP_DIRS for part in path.relative_to(package).parts):
            yield path.relative_to(package).as_posix(), path
