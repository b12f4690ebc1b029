"""The CPU architecture each place servestack runs on has, and what an image or a bundle is built as for it.

SageMaker instance types: AWS names an instance family with a `g` after its generation when its CPUs are AWS
Graviton ("g - AWS Graviton processors", the attributes of "Amazon EC2 instance type naming conventions",
https://docs.aws.amazon.com/ec2/latest/instancetypes/instance-type-names.html): ml.c6g, c6gd, c6gn, c7g, c8g,
m6g, m6gd, m8g, r6g, r6gd, r7gd, r8g are arm64 (Graviton2, 3 and 4, Arm v8.2 or later), and SageMaker runs a
custom container on them only when its image is built for linux/arm64 ("Run machine learning inference
workloads on AWS Graviton-based instances with Amazon SageMaker", AWS Machine Learning Blog, 14 November 2022:
"bring your own containers compatible with Arm v8.2 architecture"). A GPU family's CPUs are
servestack/gpu_families.py's table (Grace, ml.p6e-gb200, is arm64; the GPU image is amd64 only, so the spec
refuses it). Every other type is x86_64 (Intel or AMD).

Lambda (`Architectures`: x86_64 or arm64,
https://docs.aws.amazon.com/lambda/latest/dg/foundation-arch.html) and Fargate (`RuntimePlatform.CpuArchitecture`:
X86_64 or ARM64,
https://docs.aws.amazon.com/AmazonECS/latest/developerguide/ecs-arm-specifying.html) take the architecture from
serving.yaml's `architecture`.

An image asset declares its platform (`DockerImageAsset(platform=...)`, written into the cloud assembly's assets
manifest, https://docs.aws.amazon.com/cdk/api/v2/docs/aws-cdk-lib.aws_ecr_assets.Platform.html), so `cdk deploy`
builds it for the machines it runs on (`docker build --platform`); its `RUN uv pip install` then runs as that
platform and picks that platform's wheels from the same universal lock. A Lambda zip bundle is installed here
for the function's platform (servestack/cdk/bundling.py `--python-platform`).

Must not import aws_cdk (the spec and `servestack plan` use it).
"""

from __future__ import annotations

import re
from typing import Literal

from servestack.gpu_families import gpu_family

Architecture = Literal["x86_64", "arm64"]
ARCHITECTURES: tuple[Architecture, ...] = ("x86_64", "arm64")
# What `docker build --platform` and CDK's `Platform` call each architecture.
DOCKER_PLATFORMS: dict[Architecture, str] = {"x86_64": "linux/amd64", "arm64": "linux/arm64"}
# What a wheel's platform tag, `uname -m` and ELF headers call each architecture.
MACHINES: dict[Architecture, str] = {"x86_64": "x86_64", "arm64": "aarch64"}
# ml.<letters><generation>g<attributes>.<size>: ml.c7g.xlarge, ml.m6gd.large, ml.c6gn.2xlarge, ml.r7gd.4xlarge.
# GPU families (ml.g5, ml.g4dn, ml.p6e-gb200) are read from their table before this is asked.
_GRAVITON_FAMILY = re.compile(r"^ml\.[a-z]+\d+g[a-z]*\.")


def is_graviton(instance_type: str) -> bool:
    """Whether `instance_type` is a CPU type of an AWS Graviton family (ml.c7g.xlarge, ml.m6g.large...)."""
    return gpu_family(instance_type) is None and _GRAVITON_FAMILY.match(instance_type) is not None


def instance_architecture(instance_type: str) -> Architecture:
    """The CPU architecture of a SageMaker instance type: what its container's image must be built for."""
    family = gpu_family(instance_type)
    if family is not None:
        return family.cpu_architecture
    return "arm64" if is_graviton(instance_type) else "x86_64"


def describe(architecture: Architecture) -> str:
    """`arm64 (AWS Graviton)` or `x86_64`, for the words `plan` and `--explain` print."""
    return "arm64 (AWS Graviton)" if architecture == "arm64" else "x86_64"
