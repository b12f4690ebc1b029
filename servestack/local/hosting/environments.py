"""The Python packages a function or a container ships, installed for this machine, once per set of requirements.

Local mode runs each function and container on what its deployment ships, not on the developer's virtual
environment: a Lambda bundle's `requirements.txt` (servestack's locked runtime plus its model packages'
declared requirements) and the requirement files an image's Dockerfile installs (`RUN ... pip install -r
requirements.txt`). `installed` turns such a list into packages on disk with uv, from its cache when it holds
them (the same pins `make setup` installed), else from the package index, and keeps the result under
`$SERVESTACK_LOCAL_ENVS` (default `~/.cache/servestack/local-envs`), named by a digest of the requirements and
this interpreter: a second local up, or another deployment with the same requirements, reuses it at once.

What differs from the cloud, and is said so in `local up --explain`: the packages are built for this machine's
platform and this interpreter's Python version (Lambda runs CPython 3.12 on Amazon Linux, the images their
base image's), from the very same pinned versions.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Literal

Layout = Literal["venv", "target"]  # a virtual environment (an image's), or a folder of packages (a bundle's)
# Bump when the layout of an environment changes: it is part of the digest.
ENVIRONMENTS_VERSION = "1"


class PackagesError(RuntimeError):
    """The packages could not be installed; the message names the requirements and what uv said."""


def cache_root() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "servestack" / "local-envs"
    return Path(os.environ.get("SERVESTACK_LOCAL_ENVS", default))


def find_uv() -> str:
    """uv beside this interpreter (servestack[local] installs it), else on PATH."""
    beside = Path(sys.executable).parent / "uv"
    if beside.is_file():
        return str(beside)
    found = shutil.which("uv")
    if found is None:
        raise PackagesError("uv not found beside this Python or on PATH: pip install 'servestack[local]'")
    return found


def digest_of(requirements: str, layout: Layout) -> str:
    key = f"{ENVIRONMENTS_VERSION}|{layout}|{sys.version}|{platform.machine()}|{sys.platform}\n{requirements}"
    return hashlib.sha256(key.encode()).hexdigest()[:24]


def installed(requirements: str, layout: Layout, *, what: str) -> Path:
    """The folder holding `requirements` installed for this interpreter: a virtual environment (`venv`) or a
    folder to put on `sys.path` (`target`). Built once per digest; `what` names the function or image in an
    error."""
    out = cache_root() / f"{layout}-{digest_of(requirements, layout)}"
    if out.is_dir():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".partial-", dir=out.parent))
    try:
        listed = work / "requirements.txt"
        listed.write_text(requirements, encoding="utf-8")
        tree = work / "tree"
        _install(listed, tree, layout, what)
        try:
            tree.rename(out)
        except OSError:
            if not out.is_dir():  # not built meanwhile by another local up: a real failure
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def _install(requirements: Path, tree: Path, layout: Layout, what: str) -> None:
    uv = find_uv()
    if layout == "venv":
        _run([uv, "venv", "--quiet", "--python", sys.executable, str(tree)], what)
        command = [uv, "pip", "install", "--quiet", "--no-deps", "--python", str(tree / "bin" / "python")]
        command += ["-r", str(requirements)]
    else:
        command = [uv, "pip", "install", "--quiet", "--no-deps", "--target", str(tree), "--python", sys.executable]
        command += ["-r", str(requirements)]
    # The lock's wheels are in uv's cache after `make setup` (or any earlier install): offline first.
    if subprocess.run([*command, "--offline"], capture_output=True, text=True, check=False).returncode == 0:
        return
    if layout == "target":
        shutil.rmtree(tree, ignore_errors=True)
    _run(command, what)


def _run(command: list[str], what: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()[-6:]
        raise PackagesError(f"{what}: installing the packages it ships failed:\n" + "\n".join(said))
