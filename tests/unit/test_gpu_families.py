"""The GPU family table (servestack/gpu_families.py): it knows every GPU family SageMaker offers, it was read
from the very image servestack builds, and it refuses exactly the families the image cannot run on."""

from __future__ import annotations

import re

import pytest

from servestack.cdk.sources import CONTAINERS, REQUIREMENTS
from servestack.gpu_families import (
    GPU_FAMILIES,
    IMAGE_CUDA,
    IMAGE_ONNXRUNTIME_GPU,
    family_of,
    gpu_family,
    image_refusal,
    inference_ami,
    runs_the_image,
)
from servestack.instance_types import ENUMS, known
from servestack.spec.base import GPU_FAMILY


def test_every_gpu_family_in_the_kept_instance_lists_is_in_the_table() -> None:
    # GIVEN the instance types botocore lists for endpoints and for Batch Transform (refreshed with botocore)
    listed = {family_of(t) for enum in ENUMS for t in known(enum) if GPU_FAMILY.match(t)}

    # THEN each of their GPU families has a row: a family AWS adds is known before the spec accepts it
    assert listed - set(GPU_FAMILIES) == set()


def test_the_table_describes_the_image_servestack_builds() -> None:
    # GIVEN the GPU image's Dockerfile and its locked requirements
    dockerfile = (CONTAINERS / "gpu.Dockerfile").read_text(encoding="utf-8")
    pins = (REQUIREMENTS / "image-gpu.txt").read_text(encoding="utf-8")

    # THEN its CUDA and its onnxruntime-gpu are the ones whose kernels the table was read from: a new pin means
    # reading the wheel's compute capabilities again (the module's docstring says how)
    (cuda,) = re.findall(r"^FROM \S*cuda:(\d+\.\d+)\.\d+-", dockerfile, flags=re.MULTILINE)
    assert cuda == IMAGE_CUDA
    assert f"onnxruntime-gpu=={IMAGE_ONNXRUNTIME_GPU}\n" in pins


@pytest.mark.parametrize(
    ("family", "why"),
    [
        ("p2", "NVIDIA K80 (Kepler, compute capability 3.7) has no kernels in the GPU image"),
        ("p3", "NVIDIA V100 (Volta, compute capability 7.0) has no kernels"),
        ("p6-b200", "NVIDIA B200 (Blackwell, compute capability 10.0) has no kernels"),
        ("p6-b300", "NVIDIA B300 (Blackwell Ultra, compute capability 10.3) has no kernels"),
        ("p6e-gb200", "its CPUs are NVIDIA Grace (arm64), and servestack builds the GPU image for linux/amd64 only"),
        ("g4ad", "its GPU, an AMD Radeon Pro V520, is not NVIDIA's"),
    ],
)
def test_the_families_the_image_cannot_run_on_are_refused_with_their_reason(family: str, why: str) -> None:
    row = GPU_FAMILIES[family]

    assert not runs_the_image(row)
    assert why in (image_refusal(row) or "")
    assert row.inference_ami is None
    with pytest.raises(ValueError, match="cannot run servestack's GPU image"):
        inference_ami(f"ml.{family}.xlarge")


def test_every_family_the_image_runs_on_has_a_host_ami_with_a_new_enough_driver() -> None:
    runnable = {name for name, row in GPU_FAMILIES.items() if runs_the_image(row)}

    assert runnable == {"g4dn", "g5", "g6", "g6e", "gr6", "g7", "g7e", "p4d", "p4de", "p5", "p5e", "p5en"}
    for name in runnable:
        row = GPU_FAMILIES[name]
        # al2023-ami-sagemaker-inference-gpu-4-1 carries driver 580: CUDA 12.8 natively, and Blackwell
        assert row.inference_ami == "al2023-ami-sagemaker-inference-gpu-4-1"
        assert row.min_driver is not None
        assert row.min_driver <= 580
        assert image_refusal(row) is None


def test_a_family_is_read_from_its_instance_type_name() -> None:
    assert family_of("ml.p6-b200.48xlarge") == "p6-b200"
    assert gpu_family("ml.g5.xlarge") == GPU_FAMILIES["g5"]
    assert gpu_family("ml.m5.large") is None
