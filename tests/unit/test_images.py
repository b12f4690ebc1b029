"""The container images and the locked runtime they and the Lambda bundles install: the requirement files shipped
in the package equal what `make requirements` writes from uv.lock; one onnxruntime version (the lock's) for
the CPU and the GPU image; a piped workflow step fails when its command fails."""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from servestack.cdk.sources import REQUIREMENTS
from servestack.local.sagemaker.dockerfile import parse

REPO = Path(__file__).resolve().parents[2]
UV = REPO / ".tools" / "bin" / "uv"
CONTAINERS = REPO / "servestack" / "cdk" / "containers"
FILES = ("lambda.txt", "image-cpu.txt", "image-gpu.txt")


def locked_version(package: str) -> str:
    lock = tomllib.loads((REPO / "uv.lock").read_text(encoding="utf-8"))
    (version,) = [p["version"] for p in lock["package"] if p["name"] == package]
    return str(version)


def requirements(name: str) -> list[str]:
    """The pinned requirements a shipped file lists (markers dropped)."""
    lines = (REQUIREMENTS / name).read_text(encoding="utf-8").splitlines()
    return [line.split(";")[0].strip() for line in lines if line and not line.startswith(("#", " "))]


@pytest.mark.skipif(not UV.exists(), reason="uv is installed by `make setup` (.tools/bin/uv)")
def test_the_shipped_requirements_are_what_make_requirements_writes_from_the_lock(tmp_path: Path) -> None:
    # GIVEN `make requirements` run into a scratch folder, as a developer refreshes them after `uv lock`
    done = subprocess.run(
        ["make", "-s", "requirements", f"REQUIREMENTS_DIR={tmp_path}"],
        cwd=REPO,
        env={**os.environ, "MAKEFLAGS": ""},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # THEN each file shipped in the package is byte for byte what it writes: run it after changing the lock
    for name in FILES:
        assert (tmp_path / name).read_text() == (REQUIREMENTS / name).read_text(), f"{name}: run `make requirements`"


def test_cpu_and_gpu_images_install_the_locks_onnxruntime_version() -> None:
    version = locked_version("onnxruntime")

    cpu, gpu = requirements("image-cpu.txt"), requirements("image-gpu.txt")

    assert f"onnxruntime=={version}" in cpu
    assert f"onnxruntime-gpu=={version}" in gpu
    assert not [line for line in gpu if line.startswith("onnxruntime==")]
    assert {line for line in cpu if not line.startswith("onnxruntime")} == {
        line for line in gpu if not line.startswith("onnxruntime")
    }


def test_the_lambda_bundle_installs_the_runtime_extra_only() -> None:
    # GIVEN the lock's runtime / THEN the bundle gets onnxruntime, numpy and the HTTP app's stack, and neither the
    # containers' HTTP servers nor boto3 (Lambda's runtime provides it) nor pyarrow (past the size limit)
    names = {line.split("==")[0] for line in requirements("lambda.txt")}
    assert {"onnxruntime", "numpy", "fastapi", "mangum", "msgspec", "orjson", "aws-lambda-powertools"} <= names
    assert not names & {"granian", "uvicorn", "boto3", "botocore", "pyarrow", "aws-cdk-lib", "moto"}


def test_the_dockerfiles_take_their_versions_from_the_shipped_requirements_only() -> None:
    for name in ("cpu", "gpu"):
        dockerfile = (CONTAINERS / f"{name}.Dockerfile").read_text(encoding="utf-8")
        assert "-r requirements.txt" in dockerfile
        assert not re.search(r"onnxruntime(-gpu)?==|ORT_\w*VERSION", dockerfile), name


def test_the_images_install_every_package_byte_compiled() -> None:
    # GIVEN PYTHONDONTWRITEBYTECODE=1 in the images (no .pyc written at run time) and uv, which does not
    # byte-compile unless asked / THEN every `uv pip install` asks, or each start compiles the dependencies again
    for name in ("cpu", "gpu"):
        dockerfile = (CONTAINERS / f"{name}.Dockerfile").read_text(encoding="utf-8")
        installs = re.findall(r"uv pip install [^\n&]*", dockerfile)
        assert len(installs) == 1, (name, installs)
        assert all("--compile-bytecode" in install for install in installs), (name, installs)
        assert "python -m compileall" in dockerfile  # servestack's runtime and the entry points, copied after


def test_every_base_image_is_pulled_from_ecr_public_not_docker_hub() -> None:
    # GIVEN the images' Dockerfiles, built in the pipeline by CodeBuild, whose shared IPs Docker Hub throttles
    # WHEN their FROM lines are read as local mode reads them
    bases = {
        path.name: parse(path.read_text(encoding="utf-8"), name=path.name).base
        for path in sorted(CONTAINERS.glob("*.Dockerfile"))
    }

    # THEN every base image is on ECR Public (servestack/cdk/images.py says why), the official mirrors of the
    # Docker Hub images they were
    assert bases == {
        "cpu.Dockerfile": "public.ecr.aws/docker/library/python:3.12-slim",
        "gpu.Dockerfile": "public.ecr.aws/nvidia/cuda:13.0.3-cudnn-runtime-ubuntu24.04",
        "lambda.Dockerfile": "public.ecr.aws/lambda/python:3.12",
    }


def test_the_cpu_image_declares_sagemakers_multi_model_capability() -> None:
    dockerfile = (CONTAINERS / "cpu.Dockerfile").read_text(encoding="utf-8")
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


def test_the_workflows_aws_jobs_synthesize_against_the_deployed_stacks() -> None:
    # The jobs that synthesize with AWS credentials (cdk diff, cdk deploy) run on a fresh checkout: with no earlier
    # synth to compare with, the scaling guard (servestack/cdk/scaling_guard.py) must read the deployed templates,
    # as the pipeline's synth step does. The test job has no credentials: it keeps the default (last-synth).
    # (scaling_guard's COMPARE_ENVIRONMENT and DEPLOYED, spelt out: importing it imports aws_cdk, seconds here)
    document = yaml.safe_load((REPO / ".github" / "workflows" / "deploy.yml").read_text(encoding="utf-8"))
    for job_name in ("diff", "deploy"):
        assert document["jobs"][job_name]["env"]["SERVESTACK_COMPARE_WITH"] == "deployed", job_name
    assert "SERVESTACK_COMPARE_WITH" not in document.get("env", {}) | document["jobs"]["test"].get("env", {})


def test_the_images_carry_pyarrow_for_parquet_batch_runs() -> None:
    # GIVEN the lock's pyarrow / THEN both images install it (the spec sends Parquet to engine: fargate)
    version = locked_version("pyarrow")
    assert f"pyarrow=={version}" in requirements("image-cpu.txt")
    assert f"pyarrow=={version}" in requirements("image-gpu.txt")
