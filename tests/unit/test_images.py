"""The container images and the workflow: one onnxruntime version (the lock's) for the CPU and the GPU image;
a piped workflow step fails when its command fails."""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
UV = REPO / ".tools" / "bin"


def locked_version(package: str) -> str:
    lock = tomllib.loads((REPO / "uv.lock").read_text(encoding="utf-8"))
    (version,) = [p["version"] for p in lock["package"] if p["name"] == package]
    return str(version)


def requirements(flavour: str) -> list[str]:
    """What the Dockerfile's `containers/locked-requirements.sh <flavour>` step installs."""
    env = {**os.environ, "PATH": f"{UV}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        ["sh", "servestack/cdk/containers/locked-requirements.sh", flavour],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return [line.split(";")[0].strip() for line in done.stdout.splitlines() if line and not line.startswith(" ")]


@pytest.mark.skipif(not (UV / "uv").exists(), reason="uv is installed by `make setup` (.tools/bin/uv)")
def test_cpu_and_gpu_images_install_the_locks_onnxruntime_version() -> None:
    version = locked_version("onnxruntime")

    cpu, gpu = requirements("cpu"), requirements("gpu")

    assert f"onnxruntime=={version}" in cpu
    assert f"onnxruntime-gpu=={version}" in gpu
    assert not [line for line in gpu if line.startswith("onnxruntime==")]
    assert {line for line in cpu if not line.startswith("onnxruntime")} == {
        line for line in gpu if not line.startswith("onnxruntime")
    }


def test_the_dockerfiles_take_their_versions_from_the_lock_only() -> None:
    for name in ("cpu", "gpu"):
        dockerfile = (REPO / "servestack" / "cdk" / "containers" / f"{name}.Dockerfile").read_text(encoding="utf-8")
        assert f"containers/locked-requirements.sh {name}" in dockerfile
        assert not re.search(r"onnxruntime(-gpu)?==|ORT_\w*VERSION", dockerfile), name


def test_the_images_install_every_package_byte_compiled() -> None:
    # GIVEN PYTHONDONTWRITEBYTECODE=1 in the images (no .pyc written at run time) and uv, which does not
    # byte-compile unless asked / THEN every `uv pip install` asks, or each start compiles the dependencies again
    for name in ("cpu", "gpu"):
        dockerfile = (REPO / "servestack" / "cdk" / "containers" / f"{name}.Dockerfile").read_text(encoding="utf-8")
        installs = re.findall(r"uv pip install [^\n&]*", dockerfile)
        assert len(installs) == 2, (name, installs)
        assert all("--compile-bytecode" in install for install in installs), (name, installs)


def test_the_cpu_image_declares_sagemakers_multi_model_capability() -> None:
    dockerfile = (REPO / "servestack" / "cdk" / "containers" / "cpu.Dockerfile").read_text(encoding="utf-8")
    assert "LABEL com.amazonaws.sagemaker.capabilities.multi-models=true" in dockerfile


def test_every_piped_workflow_step_runs_under_pipefail() -> None:
    # GitHub runs `run:` with `bash -e {0}` unless `shell: bash` is set, so a failing command piped into tee
    # would pass the step; each piped step must set pipefail itself.
    for workflow in (REPO / ".github" / "workflows").glob("*.yml"):
        document = yaml.safe_load(workflow.read_text(encoding="utf-8"))
        for job_name, job in document["jobs"].items():
            for step in job.get("steps", []):
                script = step.get("run", "")
                if re.search(r"[^|]\|[^|]", script):
                    assert "set -o pipefail" in script, f"{workflow.name}: {job_name}: {script!r}"


@pytest.mark.skipif(not (UV / "uv").exists(), reason="uv is installed by `make setup` (.tools/bin/uv)")
def test_the_images_carry_pyarrow_for_parquet_batch_runs() -> None:
    # GIVEN the lock's pyarrow / THEN both images install it (servestack/spec/modes.py sends Parquet to engine: fargate)
    version = locked_version("pyarrow")
    assert f"pyarrow=={version}" in requirements("cpu")
    assert f"pyarrow=={version}" in requirements("gpu")
