"""The state file of a running `local up`: where its emulator and endpoints are, for other commands."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

STATE_ENV = "SERVESTACK_LOCAL_STATE"


def project_root(start: Path | None = None) -> Path:
    """The nearest folder holding serving.yaml, from `start` (default: the current directory) upwards."""
    here = (start or Path.cwd()).resolve()
    return next((folder for folder in (here, *here.parents) if (folder / "serving.yaml").is_file()), here)


def default_path(project: Path | None = None) -> Path:
    """`$SERVESTACK_LOCAL_STATE`, else `.servestack/local.json` in the project (found from any subfolder)."""
    if os.environ.get(STATE_ENV):
        return Path(os.environ[STATE_ENV])
    return (project or project_root()) / ".servestack" / "local.json"


def write(path: Path, about: dict[str, Any], deployments: dict[str, dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.touch(mode=0o600)  # it holds each role's local keys
    temporary.write_text(json.dumps({**about, "deployments": deployments}, indent=2) + "\n")
    temporary.replace(path)  # readers never see half a file


def read(path: Path | None = None) -> dict[str, Any]:
    """The state of the running `local up`, or `FileNotFoundError` saying how to start one."""
    where = path or default_path()
    try:
        loaded: dict[str, Any] = json.loads(where.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{where}: no running `servestack local up` (start one, or pass --state)") from None
    return loaded


def remove(path: Path) -> None:
    path.unlink(missing_ok=True)
