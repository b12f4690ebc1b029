"""The GPU instance families, with what decides whether servestack's GPU image runs on them: the GPU's vendor and
compute capability, the CPUs' architecture, the NVIDIA driver the GPU needs, and the SageMaker host AMI
(`ProductionVariant.InferenceAmiVersion`) servestack runs it on.

The GPU image (servestack/cdk/containers/gpu.Dockerfile) is CUDA 13.0 with onnxruntime-gpu, built for
linux/amd64: PyPI's onnxruntime-gpu is a CUDA 13 build (its CUDA provider needs libcudart.so.13 and
libcublas.so.13; `build_and_package_info.cuda_version` is '13.0'), so the image's CUDA is 13 too, else the
CUDA provider cannot load and onnxruntime falls back to the CPU. It runs where four things hold:

- the GPU is NVIDIA's: an AMD GPU (ml.g4ad) has no CUDA at all;
- CUDA 13 supports the GPU: compute capability 7.5 (Turing) and up. CUDA 13.0 dropped Maxwell, Pascal and
  Volta (ml.p3's V100), as CUDA 12 had dropped Kepler (ml.p2's K80);
- onnxruntime-gpu carries machine code (SASS) for the GPU's compute capability. The wheel ships no PTX, so the
  driver cannot compile its kernels for a GPU it has no code for: there CUDA reports "no kernel image is
  available for execution on the device" at the first operator, after the endpoint passed its health check.
  `IMAGE_COMPUTE_CAPABILITIES` is what the wheel carries (below, how it was read);
- the CPUs are x86_64: Grace (ml.p6e-gb200) is arm64, and the GPU image is built for linux/amd64 only
  (servestack/cdk/deployment.py: the CPU image follows its instance type's architecture, linux/arm64 on
  Graviton, servestack/architectures.py; the GPU image has no arm64 build, its CUDA base and onnxruntime-gpu
  wheel being x86_64 ones).

And its host runs an NVIDIA driver of branch 580 or newer (`IMAGE_MIN_DRIVER`): CUDA 13.x runs on >= 580 only,
older drivers needing NVIDIA's forward-compatibility package. SageMaker endpoints have such a host AMI
(`INFERENCE_AMI_DRIVERS`); Batch Transform has none (`TRANSFORM_AMI_DRIVERS`), so servestack refuses GPU types
for Batch Transform (`transform_refusal`).

The spec (servestack/spec/base.py) refuses an instance type that breaks one, for endpoints and Batch Transform
alike, with `image_refusal`'s reason; the constructs take the host AMI from `inference_ami` and `transform_ami`.

Sources:
- which GPU each family has, and its CPUs: "Accelerated computing instance specifications",
  https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html (G4ad: AMD Radeon Pro V520; P6e-GB200: NVIDIA
  Grace CPUs);
- compute capabilities: NVIDIA, https://developer.nvidia.com/cuda-gpus;
- CUDA 13's GPUs and driver: NVIDIA's CUDA Features Archive, CUDA 13.0
  (https://docs.nvidia.com/cuda/cuda-features-archive/index.html: "CUDA 13.0 supports all NVIDIA
  architectures from Turing through Grace Blackwell"; "releases in the 13.x series are ABI-compatible with
  drivers corresponding to the same series (r580 and newer)"), the CUDA 13.0 release notes' deprecated
  architectures (https://docs.nvidia.com/cuda/archive/13.0.0/cuda-toolkit-release-notes/index.html), and
  the minor-version compatibility table
  (https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html: CUDA 13.x, minimum
  driver >= 580);
- drivers: SageMaker's "Best practices to minimize interruptions during GPU driver upgrades",
  https://docs.aws.amazon.com/sagemaker/latest/dg/inference-gpu-drivers.html (driver 470 / CUDA 11.4 for
  ml.p2, p3, p4d, p4de, g4dn, g5; 535 / CUDA 12.2 for ml.p5, g6; 550 / CUDA 12.4 for ml.p5e, p5en: p2 is listed
  under 470 only, the last NVIDIA driver branch for Kepler), the host AMIs of
  https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_ProductionVariant.html (InferenceAmiVersion:
  al2-ami-sagemaker-inference-gpu-2 and -2-1 driver 535 / CUDA 12.2, -gpu-3-1 driver 550 / CUDA 12.4,
  al2023-ami-sagemaker-inference-gpu-4-1 driver 580 / CUDA 13.0) and of
  https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_TransformResources.html (TransformAmiVersion:
  al2-ami-sagemaker-batch-gpu-470 driver 470, al2-ami-sagemaker-batch-gpu-535 driver 535; both as botocore
  1.44.8's SageMaker model documents them). Blackwell needs driver >= 570 (NVIDIA's CUDA 12.8 release notes),
  and the RTX PRO 6000 Blackwell Server Edition R580
  (https://docs.aws.amazon.com/deadline-cloud/latest/APIReference/API_AcceleratorSelection.html: "only supports
  grid:r580");
- onnxruntime-gpu 1.31.1's kernels: the `.nv_fatbin` section of its `libonnxruntime_providers_cuda.so` (the
  wheel servestack/cdk/requirements/image-gpu.txt pins) holds ELF (SASS) entries for sm_75, sm_80, sm_86,
  sm_89, sm_90 and sm_120, and no PTX entry: Kepler (3.7), Volta (7.0), B200 (10.0) and
  B300 (10.3) have none. Its `readelf -d` lists libcudart.so.13, libcublas.so.13, libcublasLt.so.13 and
  libcurand.so.10 as NEEDED. Read both again when that pin changes (tests/unit/test_gpu_families.py holds
  the pin and IMAGE_CUDA equal to what was read).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# What the GPU image is (servestack/cdk/containers/gpu.Dockerfile, servestack/cdk/requirements/image-gpu.txt).
IMAGE_CUDA = "13.0"
IMAGE_ONNXRUNTIME_GPU = "1.31.1"
IMAGE_CPU_ARCHITECTURE = "x86_64"
# CUDA 13's floor: the oldest GPU architecture it supports (Turing), and the oldest driver branch it runs on
# without NVIDIA's forward-compatibility package.
IMAGE_MIN_COMPUTE_CAPABILITY = (7, 5)
IMAGE_MIN_DRIVER = 580
# The compute capabilities onnxruntime-gpu IMAGE_ONNXRUNTIME_GPU has kernels for (see the module's docstring).
# A GPU must match one exactly. CUDA would also run X.y code on a later X.z, but no GPU below needs that: each
# matches exactly, or has no code of its major version it could run (7.5 code does not run on 7.0).
IMAGE_COMPUTE_CAPABILITIES: tuple[tuple[int, int], ...] = ((7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (12, 0))
# The host AMI of every family the image runs on: the only InferenceAmiVersion whose NVIDIA driver (580) runs
# CUDA 13 and carries Blackwell (servestack/cdk/realtime.py says why not the others).
AL2023_GPU_4_1 = "al2023-ami-sagemaker-inference-gpu-4-1"
# The NVIDIA driver branch of each GPU host AMI SageMaker offers (the module's sources): endpoints'
# InferenceAmiVersion, and Batch Transform's TransformAmiVersion.
INFERENCE_AMI_DRIVERS = {
    "al2-ami-sagemaker-inference-gpu-2": 535,
    "al2-ami-sagemaker-inference-gpu-2-1": 535,
    "al2-ami-sagemaker-inference-gpu-3-1": 550,
    AL2023_GPU_4_1: 580,
}
TRANSFORM_AMI_DRIVERS = {"al2-ami-sagemaker-batch-gpu-470": 470, "al2-ami-sagemaker-batch-gpu-535": 535}


@dataclass(frozen=True)
class GpuFamily:
    """One GPU instance family (`ml.<family>.<size>`)."""

    family: str
    gpu: str
    vendor: Literal["NVIDIA", "AMD"]
    architecture: str
    # (major, minor); None for a GPU without CUDA
    compute_capability: tuple[int, int] | None
    cpu_architecture: Literal["x86_64", "arm64"]
    # The oldest NVIDIA driver branch that runs the GPU, as AWS documents it for SageMaker (else the CUDA
    # release that added the architecture needs); None without CUDA.
    min_driver: int | None
    # The InferenceAmiVersion servestack gives a production variant of this family; None where it refuses it.
    inference_ami: str | None
    # Why else the family matters, for the refusal (AWS's own words where they say it).
    note: str = ""
    # The CPUs, where they are not the usual Intel or AMD x86_64 ones.
    cpus: str = ""

    def compute_capability_text(self) -> str:
        return "" if self.compute_capability is None else _text(self.compute_capability)


def _text(compute_capability: tuple[int, int]) -> str:
    return "{}.{}".format(*compute_capability)


_KEPLER_NOTE = (
    "CUDA 12 already dropped Kepler, and AWS lists ml.p2 under NVIDIA driver 470 only (CUDA 11.4, its last "
    "branch for Kepler): https://docs.aws.amazon.com/sagemaker/latest/dg/inference-gpu-drivers.html"
)

GPU_FAMILIES: dict[str, GpuFamily] = {
    f.family: f
    for f in (
        GpuFamily("p2", "NVIDIA K80", "NVIDIA", "Kepler", (3, 7), "x86_64", 470, None, _KEPLER_NOTE),
        GpuFamily("p3", "NVIDIA V100", "NVIDIA", "Volta", (7, 0), "x86_64", 470, None),
        GpuFamily("p4d", "NVIDIA A100 40 GB", "NVIDIA", "Ampere", (8, 0), "x86_64", 470, AL2023_GPU_4_1),
        GpuFamily("p4de", "NVIDIA A100 80 GB", "NVIDIA", "Ampere", (8, 0), "x86_64", 470, AL2023_GPU_4_1),
        GpuFamily("p5", "NVIDIA H100", "NVIDIA", "Hopper", (9, 0), "x86_64", 535, AL2023_GPU_4_1),
        GpuFamily("p5e", "NVIDIA H200", "NVIDIA", "Hopper", (9, 0), "x86_64", 550, AL2023_GPU_4_1),
        GpuFamily("p5en", "NVIDIA H200", "NVIDIA", "Hopper", (9, 0), "x86_64", 550, AL2023_GPU_4_1),
        GpuFamily("p6-b200", "NVIDIA B200", "NVIDIA", "Blackwell", (10, 0), "x86_64", 570, None),
        GpuFamily("p6-b300", "NVIDIA B300", "NVIDIA", "Blackwell Ultra", (10, 3), "x86_64", 580, None),
        GpuFamily(
            "p6e-gb200", "NVIDIA B200 (GB200)", "NVIDIA", "Blackwell", (10, 0), "arm64", 570, None, cpus="NVIDIA Grace"
        ),
        GpuFamily("g4dn", "NVIDIA T4", "NVIDIA", "Turing", (7, 5), "x86_64", 470, AL2023_GPU_4_1),
        GpuFamily("g5", "NVIDIA A10G", "NVIDIA", "Ampere", (8, 6), "x86_64", 470, AL2023_GPU_4_1),
        GpuFamily("g6", "NVIDIA L4", "NVIDIA", "Ada Lovelace", (8, 9), "x86_64", 535, AL2023_GPU_4_1),
        GpuFamily("g6e", "NVIDIA L40S", "NVIDIA", "Ada Lovelace", (8, 9), "x86_64", 535, AL2023_GPU_4_1),
        # EC2's graphics-heavy L4 family; SageMaker does not offer it (it is not in botocore's lists), the table
        # has it so that the day it does, the spec already knows its GPU.
        GpuFamily("gr6", "NVIDIA L4", "NVIDIA", "Ada Lovelace", (8, 9), "x86_64", 535, AL2023_GPU_4_1),
        GpuFamily("g7", "NVIDIA RTX PRO 4500 Blackwell", "NVIDIA", "Blackwell", (12, 0), "x86_64", 580, AL2023_GPU_4_1),
        GpuFamily(
            "g7e", "NVIDIA RTX PRO 6000 Blackwell", "NVIDIA", "Blackwell", (12, 0), "x86_64", 580, AL2023_GPU_4_1
        ),
        # AMD: no CUDA. Not a SageMaker type either (see gr6).
        GpuFamily("g4ad", "AMD Radeon Pro V520", "AMD", "RDNA", None, "x86_64", None, None),
    )
}


def family_of(instance_type: str) -> str:
    """`p4d` of `ml.p4d.24xlarge`, `p6-b200` of `ml.p6-b200.48xlarge`."""
    parts = instance_type.split(".")
    return parts[1] if len(parts) >= 3 else instance_type


def gpu_family(instance_type: str) -> GpuFamily | None:
    """The GPU family of `instance_type`, or None for a type outside the table (CPU, Neuron...)."""
    return GPU_FAMILIES.get(family_of(instance_type))


def runs_the_image(family: GpuFamily) -> bool:
    """Whether servestack's GPU image runs on an instance of `family`."""
    return image_refusal(family) is None


def image_refusal(family: GpuFamily) -> str | None:
    """Why the GPU image cannot run on `family` (one clause, for the spec's error), or None where it runs."""
    if family.vendor != "NVIDIA":
        return f"its GPU, an {family.gpu}, is not NVIDIA's, and the GPU image's onnxruntime-gpu runs on CUDA only"
    if family.cpu_architecture != IMAGE_CPU_ARCHITECTURE:
        return (
            f"its CPUs are {family.cpus or 'not x86_64'} ({family.cpu_architecture}), and servestack builds the GPU "
            "image for linux/amd64 only, so the container would not start (exec format error)"
        )
    if family.compute_capability is None or family.compute_capability < IMAGE_MIN_COMPUTE_CAPABILITY:
        note = f"; {family.note}" if family.note else ""
        return (
            f"its {family.gpu} ({family.architecture}, compute capability {family.compute_capability_text()}) "
            f"is below {_text(IMAGE_MIN_COMPUTE_CAPABILITY)} (Turing), the oldest GPU that CUDA 13, the GPU "
            "image's CUDA, supports: CUDA 13.0 dropped Maxwell, Pascal and Volta (NVIDIA's CUDA 13.0 release "
            f"notes){note}"
        )
    if family.compute_capability not in IMAGE_COMPUTE_CAPABILITIES:
        carried = ", ".join(_text(c) for c in IMAGE_COMPUTE_CAPABILITIES)
        note = f"; {family.note}" if family.note else ""
        return (
            f"its {family.gpu} ({family.architecture}, compute capability {family.compute_capability_text()}) "
            f"has no kernels in the GPU image: onnxruntime-gpu {IMAGE_ONNXRUNTIME_GPU} (CUDA {IMAGE_CUDA}) carries "
            f"them for compute capability {carried} only{note}"
        )
    return None


def inference_ami(instance_type: str) -> str:
    """The InferenceAmiVersion of a production variant on the GPU type `instance_type`; ValueError for a type
    the GPU image cannot run on (the spec refuses those; this guards the constructs used directly)."""
    family = gpu_family(instance_type)
    if family is None:
        raise ValueError(f"{instance_type} is not a GPU instance type servestack knows (servestack/gpu_families.py)")
    if family.inference_ami is None:
        raise ValueError(f"{instance_type} cannot run servestack's GPU image: {image_refusal(family)}")
    return family.inference_ami


def _runnable_transform_ami() -> str | None:
    runnable = [ami for ami, driver in TRANSFORM_AMI_DRIVERS.items() if driver >= IMAGE_MIN_DRIVER]
    return max(runnable, key=TRANSFORM_AMI_DRIVERS.__getitem__, default=None)


# The TransformAmiVersion whose NVIDIA driver runs the GPU image (the newest such); None while none does.
GPU_TRANSFORM_AMI = _runnable_transform_ami()


def transform_refusal() -> str | None:
    """Why Batch Transform cannot run the GPU image on any GPU type (one clause, for the spec's error), or None
    where one of its host AMIs can."""
    if GPU_TRANSFORM_AMI is not None:
        return None
    amis = ", ".join(f"{ami}: driver {driver}" for ami, driver in TRANSFORM_AMI_DRIVERS.items())
    return (
        f"Batch Transform's GPU host AMIs carry NVIDIA drivers older than {IMAGE_MIN_DRIVER} ({amis}), and the GPU "
        f"image's CUDA {IMAGE_CUDA} needs {IMAGE_MIN_DRIVER} or newer, so its CUDA provider could not load"
    )


def transform_ami(instance_type: str) -> str:
    """The TransformAmiVersion of a transform job on the GPU type `instance_type`; ValueError where the GPU image
    cannot run there (the spec refuses those; this guards the constructs used directly)."""
    family = gpu_family(instance_type)
    if family is None:
        raise ValueError(f"{instance_type} is not a GPU instance type servestack knows (servestack/gpu_families.py)")
    reason = image_refusal(family) or transform_refusal()
    if reason is not None or GPU_TRANSFORM_AMI is None:
        raise ValueError(f"{instance_type} cannot run servestack's GPU image in Batch Transform: {reason}")
    return GPU_TRANSFORM_AMI
