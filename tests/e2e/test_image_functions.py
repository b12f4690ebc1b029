"""A Lambda function past the zip limit ships as a container image, chosen automatically, and local mode runs it:
from its image's files as its Dockerfile places them (/var/task), on the packages its `pip install -r` installs,
with the handler its template's ImageConfig names."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import LocalUp, start_local_up

pytestmark = pytest.mark.slow
SERVESTACK = str(Path(sys.executable).parent / "servestack")


def servestack(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SERVESTACK, *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, LocalUp]]:
    # GIVEN a project whose serverless and async deployments ship as container images (`lambda_package: image`,
    # what `auto` picks past the zip limit: tests/infra/test_image_functions.py)
    root = tmp_path_factory.mktemp("image-functions")
    assert servestack("init", ".", cwd=root).returncode == 0
    spec = {
        "models": [{"name": "digits", "version": 1}],
        "deployments": {
            "digits-image": {"mode": "serverless", "model": "digits", "lambda_package": "image"},
            "digits-image-jobs": {"mode": "async", "model": "digits", "lambda_package": "image"},
        },
    }
    (root / "serving.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SERVESTACK_"))}
    up = start_local_up(root, cwd=root, found_state=root / ".servestack" / "local.json", timeout_sec=300, env=env)
    try:
        yield root, up
    finally:
        up.stop()


def test_the_templates_declare_container_image_functions(project: tuple[Path, LocalUp]) -> None:
    root, _ = project
    template = json.loads((root / ".servestack/cdk.out/servestack-digits-image.template.json").read_text())
    functions = [r for r in template["Resources"].values() if r["Type"] == "AWS::Lambda::Function"]
    images = [f for f in functions if f["Properties"].get("PackageType") == "Image"]
    assert [f["Properties"]["ImageConfig"]["Command"] for f in images] == [["handlers.serverless.handler"]]
    assert "Handler" not in images[0]["Properties"]


def test_local_mode_runs_them_and_they_answer(project: tuple[Path, LocalUp]) -> None:
    root, _ = project
    sample = root / "models/artifacts/digits/1/sample-request.json"
    expected = json.loads((root / "models/artifacts/digits/1/sample-response.json").read_text())
    # WHEN the serverless one is called through its HTTP API, and the async one gets a job
    online = servestack("invoke", "digits-image", "--data", str(sample), cwd=root)
    job = servestack("invoke", "digits-image-jobs", "--data", str(sample), cwd=root)
    # THEN both answer the sample, from functions run from their images' files
    assert online.returncode == 0, online.stderr
    assert json.loads(online.stdout)["predictions"] == expected["predictions"]
    assert job.returncode == 0, job.stderr
    assert expected["predictions"] == json.loads(job.stdout)["predictions"]
    # AND each function's process runs from its image's /var/task (LAMBDA_TASK_ROOT), staged from the build context
    roots = set()
    for pid in (p for p in Path("/proc").iterdir() if p.name.isdigit()):
        try:
            environ = (pid / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        found = [e.split(b"=", 1)[1] for e in environ if e.startswith(b"LAMBDA_TASK_ROOT=")]
        names = [e for e in environ if e.startswith(b"AWS_LAMBDA_FUNCTION_NAME=servestack-digits-image")]
        if found and names:
            roots.add(found[0].decode())
    assert roots, "no function process of the two deployments found"
    assert all(r.endswith("/rootfs/var/task") and (Path(r) / "handlers" / "serverless.py").is_file() for r in roots)
