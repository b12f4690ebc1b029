"""This project's smoke test: `servestack local up` runs every deployment of serving.yaml as `cdk deploy` would
create it (IAM enforced), and each realtime and serverless deployment answers its model's sample request with
the predictions of the sample response."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

PROJECT = Path(__file__).resolve().parents[1]
SERVESTACK = Path(sys.executable).parent / "servestack"


def servestack(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SERVESTACK), *args], cwd=PROJECT, capture_output=True, text=True, timeout=900, check=False
    )


def online_deployments() -> Iterator[tuple[str, Path]]:
    """(deployment, its model package) of each realtime and serverless deployment."""
    spec = yaml.safe_load((PROJECT / "serving.yaml").read_text(encoding="utf-8"))
    versions = {model["name"]: str(model["version"]) for model in spec["models"]}
    for name, deployment in spec["deployments"].items():
        if deployment["mode"] in ("realtime", "serverless"):
            version = str(deployment.get("version") or versions[deployment["model"]])
            yield name, PROJECT / "models" / "artifacts" / deployment["model"] / version


@pytest.fixture(scope="module")
def local_up() -> Iterator[None]:
    started = servestack("local", "up", "--detach")
    assert started.returncode == 0, started.stdout + started.stderr
    yield
    servestack("local", "down")


@pytest.mark.parametrize(("deployment", "package"), list(online_deployments()))
def test_each_online_deployment_answers_its_sample(local_up: None, deployment: str, package: Path) -> None:
    answered = servestack("invoke", deployment, "--data", str(package / "sample-request.json"))
    assert answered.returncode == 0, answered.stdout + answered.stderr
    expected = json.loads((package / "sample-response.json").read_text(encoding="utf-8"))
    assert json.loads(answered.stdout)["predictions"] == expected["predictions"]
