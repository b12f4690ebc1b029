"""The state file of a running `local up`: where its emulator and endpoints are, for other commands.

It lives in the project (`<folder holding serving.yaml>/.servestack/local.json`), so commands find it from any
subfolder; `$SERVESTACK_LOCAL_STATE` or `--state` name another one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from servestack.failures import NotRunning
from servestack.project import STATE_DIR, project_or_cwd

STATE_ENV = "SERVESTACK_LOCAL_STATE"
STATE_FILE = "local.json"


def default_path(project: Path | None = None) -> Path:
    """`$SERVESTACK_LOCAL_STATE`, else `.servestack/local.json` in the project (found from any subfolder; else
    the current folder)."""
    return Path(os.environ.get(STATE_ENV) or (project or project_or_cwd()) / STATE_DIR / STATE_FILE)


def write(path: Path, about: dict[str, Any], deployments: dict[str, dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.touch(mode=0o600)  # it holds each role's local keys: your user's alone
    temporary.chmod(0o600)
    temporary.write_text(json.dumps({**about, "deployments": deployments}, indent=2) + "\n")
    temporary.replace(path)  # readers never see half a file


def read(path: Path | None = None) -> dict[str, Any]:
    """The state of the running `local up`; `NotRunning` (a FileNotFoundError) saying how to start one when
    there is no state file, or when the process that wrote it is gone (it was killed before cleaning up)."""
    where = path or default_path()
    try:
        loaded: dict[str, Any] = json.loads(where.read_text())
    except FileNotFoundError:
        raise NotRunning(
            f"`servestack local up` is not running (no {where}): start it in your project, or pass --state"
        ) from None
    except (ValueError, OSError) as error:
        raise NotRunning(f"{where}: unreadable state file ({error}): start `servestack local up` again") from None
    pid = loaded.get("pid")
    if isinstance(pid, int) and not _alive(pid):
        raise NotRunning(
            f"`servestack local up` is not running: {where} was left by process {pid}, which has exited; start it again"
        )
    return loaded


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only checks that the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True


def remove(path: Path) -> None:
    path.unlink(missing_ok=True)
