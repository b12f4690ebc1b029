"""The core stays transport-free, and handlers never pull in CDK."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

FORBIDDEN_IN_CORE = ("boto3", "botocore", "fastapi", "starlette", "mangum", "aws_cdk", "uvicorn")


def imported_roots(package: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in sorted((REPO_ROOT / package).rglob("*.py")):
        if "artifacts" in path.parts:
            continue
        roots: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                roots.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                roots.add(node.module.split(".")[0])
        found[str(path.relative_to(REPO_ROOT))] = roots
    return found


def test_core_source_imports_no_transport_or_cloud_library() -> None:
    offenders = {
        path: sorted(roots & set(FORBIDDEN_IN_CORE))
        for path, roots in imported_roots("models").items()
        if roots & set(FORBIDDEN_IN_CORE)
    }
    assert offenders == {}


def test_importing_the_core_loads_no_transport_or_cloud_library() -> None:
    # GIVEN a fresh interpreter WHEN every serving module of the core is imported and a model loaded
    code = (
        "import sys, models.service, models.codecs, models.runtime, models.hooks, models.packaging;"
        "from models.service import ModelRepository; from models.settings import ServingSettings;"
        "ModelRepository(ServingSettings()).load_all();"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN_IN_CORE!r}))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    # THEN none of the forbidden libraries is in sys.modules
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("package", ["handlers", "models", "servestack"])
def test_runtime_packages_never_import_cdk(package: str) -> None:
    offenders = [path for path, roots in imported_roots(package).items() if "aws_cdk" in roots]
    assert offenders == []
