"""The project: the folder holding `serving.yaml`, found from the current folder or any folder below it.

Every command that works on "this project" (`local up`, `invoke`, `local deploy`, `local run-batch`,
`models ...`) starts from here, as `cdk` and `sam` find their project file from a subfolder. The project also
says where model packages live (`models/artifacts/<name>/<version>/`, the default `path` of a model in
serving.yaml) and where the state of a running `local up` is kept (`.servestack/local.json`).
"""

from __future__ import annotations

from pathlib import Path

SPEC_FILE = "serving.yaml"
ARTIFACTS_DIR = Path("models") / "artifacts"
STATE_DIR = ".servestack"


def find_project(start: Path | None = None) -> Path | None:
    """The nearest folder at or above `start` (default: the current folder) that holds serving.yaml."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / SPEC_FILE).is_file():
            return folder
    return None


def project_or_cwd(start: Path | None = None) -> Path:
    """The project folder, or the current folder when there is none (so files land where the user is)."""
    return find_project(start) or (start or Path.cwd()).resolve()


def spec_path(start: Path | None = None) -> Path | None:
    """`serving.yaml` of the project around `start`, if there is one."""
    project = find_project(start)
    return project / SPEC_FILE if project is not None else None


def artifacts_root(project: Path) -> Path:
    """Where the project's model packages live: `<project>/models/artifacts`."""
    return project / ARTIFACTS_DIR


def not_found_hint(start: Path | None = None, instead: str = "--spec") -> str:
    """No project here, and the fix: run from one, or pass `instead` (the option naming what it would give)."""
    where = (start or Path.cwd()).resolve()
    return f"no {SPEC_FILE} in {where} or any folder above it: run this from your project, or pass {instead}"
