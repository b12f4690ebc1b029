"""Build contexts of the container images (the realtime container, the Fargate batch task), staged at synth.

A context holds the image's Dockerfile (`cpu.Dockerfile` or `gpu.Dockerfile`, shipped in
servestack/cdk/containers/), `requirements.txt` (servestack's locked runtime for that image, shipped in
servestack/cdk/requirements/), servestack's runtime, the project's entry points (`handlers/`) and the
deployment's model packages (servestack/cdk/sources.py). It reads nothing of the project but its entry points
and packages, and nothing of servestack's own checkout: an installed servestack stages the same context.

The realtime container gets its model from SageMaker (`ModelDataUrl`, unpacked under /opt/ml/model); a Fargate
task has no such step, so its image carries the packages it serves at `models/artifacts/<name>/<version>/`. CDK
then stages the folder into cdk.out as the image asset (no Docker needed at synth), so the context
`cdk deploy` builds from is the one local mode runs from, model included.

Base images come from Amazon ECR Public, not Docker Hub: `public.ecr.aws/docker/library/python:3.12-slim`
(Docker's official image, which ECR Public mirrors) and `public.ecr.aws/nvidia/cuda:<tag>` (NVIDIA publishes
its CUDA images there as well as on Docker Hub), as the Lambda image (`public.ecr.aws/lambda/python`) and the
Lambda bundling image (`public.ecr.aws/sam/build-python`) already did. The images are built where `cdk deploy`
runs, in the pipeline a CodeBuild project of CDK Pipelines' asset stage (servestack/cdk/pipeline.py), whose
outbound IPs are shared with other accounts; Docker Hub limits anonymous pulls per IP, so a build failed with
`toomanyrequests` whenever others had spent the IP's allowance. ECR Public serves anonymous pulls without
Docker's hourly allowance (its quotas: https://docs.aws.amazon.com/AmazonECR/latest/public/public-service-quotas.html;
pulling: https://docs.aws.amazon.com/AmazonECR/latest/public/docker-pull-ecr-image.html), so the pipeline needs
no Docker Hub credentials and no login. Chosen over an ECR pull-through cache rule for Docker Hub, which would
need a Docker Hub account's credentials in Secrets Manager and a rule per account and region, for images both
publishers already put on ECR Public.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Sequence
from pathlib import Path

from servestack.cdk.sources import (
    CONTAINERS,
    MODEL_PACKAGES,
    Member,
    deployment_requirements,
    entry_point_files,
    package_files,
    runtime_files,
    stage,
)

FLAVOURS = ("cpu", "gpu")
__all__ = ["FLAVOURS", "MODEL_PACKAGES", "dockerfile_name", "dockerfile_workdir", "image_context"]


def dockerfile_name(flavour: str) -> str:
    """The Dockerfile of an image flavour, as the context and the asset name it (`cpu.Dockerfile`)."""
    if flavour not in FLAVOURS:
        raise ValueError(f"image flavour {flavour!r} is not one of {', '.join(FLAVOURS)}")
    return f"{flavour}.Dockerfile"


def dockerfile_workdir(flavour: str) -> str:
    """The image's working directory: its Dockerfile's last `WORKDIR` (absolute), `/` without one."""
    workdir = "/"
    for words in _instructions(CONTAINERS / dockerfile_name(flavour)):
        if words[0].upper() == "WORKDIR":
            workdir = words[1]
    return workdir


def _instructions(dockerfile: Path) -> Iterator[list[str]]:
    text = re.sub(r"\\\n", " ", dockerfile.read_text(encoding="utf-8"))
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            yield words


def image_context(
    *,
    flavour: str,
    entry_points: Path,
    artifacts_root: Path,
    artifacts: Sequence[str] = (),
    serves: Sequence[str] | None = None,
    cache_dir: Path | None = None,
) -> Path:
    """The staged build context of a `flavour` image carrying the packages `artifacts` (relative to
    `artifacts_root`, e.g. `models/artifacts/digits/1`), with the entry points in the folder `entry_points`. It
    installs what the packages it `serves` declare (default: those it carries; a realtime image carries none,
    SageMaker gives it its model data, but installs what its models need)."""
    dockerfile = dockerfile_name(flavour)
    members: list[Member] = [
        (dockerfile, CONTAINERS / dockerfile),
        ("requirements.txt", deployment_requirements(f"image-{flavour}.txt", artifacts_root, serves or artifacts)),
        *runtime_files(),
        *entry_point_files(entry_points),
        *package_files(artifacts_root, artifacts),
    ]
    if not any(name.startswith(f"{MODEL_PACKAGES}/") for name, _ in members):
        # COPY needs the folder; an empty one is not a context member, so a placeholder keeps its place.
        members.append((f"{MODEL_PACKAGES}/README", CONTAINERS / "no-packages.txt"))
    return stage(members, "image-context", cache_dir)
