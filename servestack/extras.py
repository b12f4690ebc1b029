"""servestack's extras as the modules each one makes importable, and which of them this Python lacks.

The base install (`pip install servestack`) is the `servestack` command alone; each command names the extra it
needs (servestack/cli/main.py: `Command.extra`), and `main` checks it with `missing_module` before running the
command, so that a missing extra is one line naming it (exit code 7, servestack/failures.py) rather than a
traceback from deep inside.

`EXTRAS` is pyproject.toml's `[project.optional-dependencies]`, each distribution written as the module it
installs (pyyaml: `yaml`, aws-cdk-lib: `aws_cdk`), an extra's own packages first and then those of the extras
it includes; a requirement with an environment marker (uvloop, not on Windows) is left out.
tests/unit/test_extras.py keeps the two equal.

Modules are checked, not distributions: what a command needs is to import them, whichever distribution
provides them (onnxruntime-gpu provides `onnxruntime`). Standard library only: the base install reads this.
"""

from __future__ import annotations

import importlib.util

RUNTIME = ("onnxruntime", "numpy", "fastapi", "mangum", "pydantic", "aws_lambda_powertools", "orjson", "msgspec")
SERVER = ("granian", "uvicorn", "httptools", *RUNTIME)
AWS = ("boto3",)
PARQUET = ("pyarrow",)
CLI = ("httpx", "boto3", "matplotlib", "onnx", "yaml", "httptools", "rich", *RUNTIME)
CDK = ("aws_cdk", "constructs", "cdk_nag", "pydantic", "yaml", "uv")


def _unique(*modules: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(modules))


EXTRAS: dict[str, tuple[str, ...]] = {
    "runtime": RUNTIME,
    "server": SERVER,
    "aws": AWS,
    "parquet": PARQUET,
    "cli": CLI,
    "cdk": CDK,
    "local": _unique("moto", *CLI, *CDK, *SERVER, *AWS, *PARQUET),
    "onnxmltools": ("onnxmltools", "skl2onnx"),
}


def missing_module(extra: str) -> str | None:
    """The first module of `extra` that this Python cannot import (found, not imported), else None."""
    for module in EXTRAS[extra]:
        if importlib.util.find_spec(module) is None:
            return module
    return None


def extra_of(module: str) -> str | None:
    """The smallest extra that installs `module` (a top-level module name), None when no extra does."""
    holding = [extra for extra, modules in EXTRAS.items() if module in modules]
    return min(holding, key=lambda extra: len(EXTRAS[extra]), default=None)
