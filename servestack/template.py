"""The example project: what `servestack init` writes, where the default entry points and the bundled model
packages come from.

It is one set of files. In servestack's source checkout they are the checkout's own top level (`app.py`,
`stacks/`, `handlers/`, `models/artifacts/`...), the project its tests and `make local` run; the wheel carries a
copy of exactly those under `servestack/project_template/` (pyproject.toml's `force-include`, kept equal to
`SHARED` by tests/unit/test_template.py). The files only a new project gets (its README, Makefile, dependency
file, smoke test) live in `servestack/init_files/`.

Imports stay light (no third-party module): the CLI and the constructs both read this.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
PACKAGED = PACKAGE / "project_template"
# The example project's files shared by servestack's checkout and a new project, relative to the project.
SHARED = (
    "app.py",
    "cdk.json",
    "serving.yaml",
    "stacks",
    "handlers",
    "models/artifacts",
    "localstack",
    "package.json",
    "package-lock.json",
)
INIT_FILES = PACKAGE / "init_files"


class TemplateMissing(RuntimeError):
    """Neither an installed template nor a source checkout: the installation is incomplete."""


def template_root() -> Path:
    """The example project's folder: the installed copy, else servestack's own source checkout."""
    if PACKAGED.is_dir():
        return PACKAGED
    checkout = PACKAGE.parent
    if all((checkout / path).exists() for path in SHARED) and (checkout / "pyproject.toml").is_file():
        return checkout
    raise TemplateMissing(
        f"servestack's project template is missing (neither {PACKAGED} nor a source checkout): reinstall servestack"
    )


def default_entry_points() -> Path:
    """The entry points functions and containers run when a project brings none: the example's `handlers/`."""
    return template_root() / "handlers"


def bundled_artifacts() -> Path:
    """The model packages bundled with servestack (`digits`, `breast-cancer`): the example's `models/artifacts`."""
    return template_root() / "models" / "artifacts"
