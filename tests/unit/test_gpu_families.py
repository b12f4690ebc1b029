"""The GPU family table (servestack/gpu_families.py): it knows every GPU family SageMaker offers, it was read
from the very image servestack builds, and it refuses exactly the families the image cannot run on."""

from __future__ import annotations

import re

import pytest

from servestack.cdk.sources import CONTAINERS, REQUIREMENTS
from servestack.gpu_families import (
    GPU_FAMILIES,
    GPU_TRANSFORM_AMI,
    IMAGE_CUDA,
    IMAGE_MIN_DRIVER,
    IMAGE_ONNXRUNTIME_GPU,
    INFERENCE_AMI_DRIVERS,
    TRANSFORM_AMI_DRIVERS,
    family_of,
    gpu_family,
    image_refusal,
    inference_ami,
    runs_the_image,
    transform_ami,
    transform_refusal,
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
        # CUDA 13 runs on Turing (7.5) and up: Kepler went with CUDA 12, Maxwell, Pascal and Volta with 13.0
        ("p2", "NVIDIA K80 (Kepler, compute capability 3.7) is below 7.5 (Turing), the oldest GPU that CUDA 13"),
        ("p3", "NVIDIA V100 (Volta, compute capability 7.0) is below 7.5 (Turing), the oldest GPU that CUDA 13"),
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
        # al2023-ami-sagemaker-inference-gpu-4-1 carries driver 580: CUDA 13's floor, and Blackwell's
        assert row.inference_ami == "al2023-ami-sagemaker-inference-gpu-4-1"
        assert INFERENCE_AMI_DRIVERS[row.inference_ami] >= IMAGE_MIN_DRIVER == 580
        assert row.min_driver is not None
        assert row.min_driver <= INFERENCE_AMI_DRIVERS[row.inference_ami]
        assert image_refusal(row) is None


def test_no_other_endpoint_host_ami_has_a_driver_that_runs_cuda_13() -> None:
    # GIVEN SageMaker's endpoint host AMIs and their drivers / THEN only 4-1 runs the CUDA 13 image
    assert [ami for ami, driver in INFERENCE_AMI_DRIVERS.items() if driver >= IMAGE_MIN_DRIVER] == [
        "al2023-ami-sagemaker-inference-gpu-4-1"
    ]


def test_batch_transform_refuses_every_gpu_type_while_its_host_amis_carry_drivers_older_than_580() -> None:
    # GIVEN Batch Transform's host AMIs: NVIDIA drivers 470 and 535 only, both below CUDA 13's 580
    assert TRANSFORM_AMI_DRIVERS == {"al2-ami-sagemaker-batch-gpu-470": 470, "al2-ami-sagemaker-batch-gpu-535": 535}

    # THEN no transform AMI runs the GPU image, and the refusal says why, naming the drivers
    assert GPU_TRANSFORM_AMI is None
    reason = transform_refusal() or ""
    drivers = "al2-ami-sagemaker-batch-gpu-470: driver 470, al2-ami-sagemaker-batch-gpu-535: driver 535"
    assert f"older than 580 ({drivers})" in reason
    assert f"CUDA {IMAGE_CUDA} needs 580 or newer, so its CUDA provider could not load" in reason
    # AND the constructs, used without the spec, refuse a GPU transform job even on a family endpoints run
    with pytest.raises(ValueError, match=r"ml\.g5\.xlarge cannot run servestack's GPU image in Batch Transform"):
        transform_ami("ml.g5.xlarge")
    with pytest.raises(ValueError, match=r"is below 7\.5"):
        transform_ami("ml.p3.2xlarge")


def test_a_family_is_read_from_its_instance_type_name() -> None:
    assert family_of("ml.p6-b200.48xlarge") == "p6-b200"
    assert gpu_family("ml.g5.xlarge") == GPU_FAMILIES["g5"]
    assert gpu_family("ml.m5.large") is None
