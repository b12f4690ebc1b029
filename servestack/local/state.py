"""The state file of a running `local up`: where its emulator and endpoints are, for other commands."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

STATE_ENV = "SERVESTACK_LOCAL_STATE"


def default_path() -> Path:
    """`$SERVESTACK_LOCAL_STATE`, else `.servestack/local.json` in the current directory."""
    return Path(os.environ.get(STATE_ENV) or Path.cwd() / ".servestack" / "local.json")


def write(path: Path, about: dict[str, Any], deployments: dict[str, dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
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
