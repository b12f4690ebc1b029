"""servestack as a team installs it: the wheel built from this checkout (`uv build`), installed into a fresh
virtual environment outside the repository, with the extras the docs name.

The versions are the lock's (uv.lock exported as constraints), and uv takes them from its cache, as `make
setup` left it, so an install takes seconds and needs the package index only for what the cache lacks.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
UV = REPO / ".tools" / "bin" / "uv"


def uv(*args: str, cwd: Path = REPO, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(UV), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"uv {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done


def build_wheel(out: Path) -> Path:
    """`uv build --wheel` of this checkout into `out`; the wheel's path."""
    uv("build", "--wheel", "--out-dir", str(out))
    (wheel,) = out.glob("servestack-*.whl")
    return wheel


def install(wheel: Path, venv: Path, extras: str = "") -> Path:
    """A fresh virtual environment at `venv` with `wheel` installed (`servestack[extras]`, or no extra); its
    `bin` folder."""
    uv("venv", "--quiet", "--python", sys.executable, str(venv))
    constraints = venv.parent / f"{venv.name}-constraints.txt"
    exported = uv("export", "--frozen", "--all-extras", "--no-dev", "--no-emit-project", "--no-hashes", "--no-header")
    constraints.write_text(exported.stdout, encoding="utf-8")
    requirement = f"{wheel}[{extras}]" if extras else str(wheel)
    uv("pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), "-c", str(constraints), requirement)
    return venv / "bin"


def environment(bin_dir: Path, home: Path) -> dict[str, str]:
    """A user's shell with that environment activated: its `bin` first on PATH, nothing of this checkout's
    .venv, no AWS identity, and a home of its own."""
    dropped = ("VIRTUAL_ENV", "PYTHONPATH", "AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
               "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    path = [p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(str(REPO))]
    env["PATH"] = os.pathsep.join([str(bin_dir), *path])
    env["VIRTUAL_ENV"] = str(bin_dir.parent)
    env["HOME"] = str(home)
    # The user's caches stay where this machine keeps them (uv's wheels, the Lambda bundle's dependencies).
    env.setdefault("UV_CACHE_DIR", str(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "uv"))
    env.setdefault("SERVESTACK_BUNDLE_CACHE", str(Path.home() / ".cache" / "servestack" / "lambda-deps"))
    return env
