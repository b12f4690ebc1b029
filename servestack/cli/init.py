"""`servestack init [DIR]`: a new project from the example project, as `cdk init` and `sam init` start one.

It writes the example's files (servestack/template.py: `app.py`, `cdk.json` with the recommended feature flags,
`serving.yaml`, `stacks/`, `handlers/`, the bundled model packages, `localstack/`, the CDK CLI's pinned
`package.json`) and a new project's own (servestack/init_files/: a README, a Makefile, `requirements.txt` pinned
to this servestack, `.gitignore` and a smoke test that runs `local up`). It never overwrites a file: one that
exists is kept and listed.

- `--location PATH`: another template, a folder laid out as a project (as `sam init --location` takes one); its
  files are written as they are.
- `--existing-cdk-app`: a CDK app of your own gets `serving.yaml` only, and the two lines to add to it.
"""

from __future__ import annotations

import argparse
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from servestack.failures import CommandError, ExitCode
from servestack.template import INIT_FILES, SHARED, template_root

# Never copied from a template: caches, virtual environments, build output, local state.
SKIPPED = {"__pycache__", ".venv", "node_modules", "cdk.out", ".servestack", ".git", ".mypy_cache", ".pytest_cache"}
# What `--existing-cdk-app` prints: add these to your app (after `app = App()`), from the folder of serving.yaml.
EXISTING_APP_LINES = (
    "from servestack.cdk import add_serving",
    "add_serving(app)  # one stack per deployment of serving.yaml (a folder of your app's, default: the current one)",
)


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "directory", nargs="?", type=Path, default=Path(), help="the project's folder, made if missing (default: .)"
    )
    parser.add_argument(
        "--location",
        type=Path,
        default=None,
        help="a template folder of your own to copy instead of servestack's example project (as sam init --location)",
    )
    parser.add_argument(
        "--existing-cdk-app",
        action="store_true",
        help="for a CDK app you already have: write serving.yaml only, and print the two lines to add to the app",
    )


def run(args: argparse.Namespace) -> int:
    target: Path = args.directory
    if target.exists() and not target.is_dir():
        raise CommandError(f"{target} is a file: name a folder for the project")
    if args.existing_cdk_app and args.location is not None:
        raise CommandError("--existing-cdk-app writes serving.yaml only: leave out --location")
    files = list(_files(args))
    target.mkdir(parents=True, exist_ok=True)
    written, kept = write(files, target)
    for path in written:
        print(f"  wrote {path}")
    for path in kept:
        print(f"  kept  {path} (it exists; init never overwrites a file)")
    if args.existing_cdk_app:
        print("\nAdd to your CDK app, after `app = App()`:\n")
        print("\n".join(f"    {line}" for line in EXISTING_APP_LINES))
        print("\nthen `servestack local up` runs it locally, and `cdk deploy` deploys it.")
        return int(ExitCode.OK)
    where = "" if target.resolve() == Path.cwd().resolve() else f"cd {target} && "
    print(
        f"\nNext: {where}make setup (a .venv with this servestack, the CDK CLI), then make local, make test, "
        "and `servestack models push MODEL.onnx --name NAME` for your own model."
    )
    return int(ExitCode.OK)


def _files(args: argparse.Namespace) -> Iterator[tuple[str, Path | str]]:
    """(path in the project, source file or text) of everything init writes."""
    if args.location is not None:
        location: Path = args.location
        if not location.is_dir():
            raise CommandError(f"--location {location}: not a folder (a template is a folder laid out as a project)")
        yield from _tree(location, "")
        return
    root = template_root()
    if args.existing_cdk_app:
        yield "serving.yaml", root / "serving.yaml"
        return
    for shared in SHARED:
        yield from _tree(root / shared, shared)
    for name, source in _tree(INIT_FILES, ""):
        # .gitignore is kept as `gitignore` in the package, where it would otherwise act on the package itself
        yield (".gitignore" if name == "gitignore" else name), source
    yield "requirements.txt", requirements()


def _tree(source: Path, prefix: str) -> Iterator[tuple[str, Path]]:
    if source.is_file():
        yield prefix or source.name, source
        return
    for dirpath, dirnames, filenames in os.walk(source):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED)
        for name in sorted(filenames):
            if name.endswith((".pyc", ".pyo")):
                continue
            relative = (Path(dirpath) / name).relative_to(source).as_posix()
            yield (f"{prefix}/{relative}" if prefix else relative), Path(dirpath) / name


def requirements() -> str:
    """The new project's dependency file: this servestack with the extras a project works with."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        pinned = f"=={version('servestack')}"
    except PackageNotFoundError:  # a source checkout that was never installed
        pinned = ""
    return (
        "# servestack, pinned to the version that wrote this project: local mode, the CLI and the CDK constructs.\n"
        f"servestack[local]{pinned}\n"
        "# the smoke test (tests/)\n"
        "pytest>=8\n"
    )


def write(files: list[tuple[str, Path | str]], target: Path) -> tuple[list[str], list[str]]:
    """Write each file that does not exist yet; return (written, kept) paths."""
    written: list[str] = []
    kept: list[str] = []
    for name, source in files:
        destination = target / name
        if destination.exists() or destination.is_symlink():
            kept.append(name)
            continue
        destination.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(source, str):
            destination.write_text(source, encoding="utf-8")
        else:
            shutil.copy(source, destination)  # with its mode: scripts stay executable
        written.append(name)
    return written, kept
