"""Which onnxruntime execution providers a session asks for, with their options: CPU, CUDA, and TensorRT before
CUDA where the settings ask for it (`SERVESTACK_GPU_PROVIDER=tensorrt`, serving.yaml's `gpu: {provider: tensorrt}`).

Pure functions of the settings, the providers this onnxruntime build offers and the GPUs visible, so that the
choice is tested on a machine without a GPU; `unloaded_gpu_provider` then checks what the session loaded."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from servestack.inference.devices import gpu_count
from servestack.inference.errors import ConfigurationError

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"
# The accelerators IO binding puts a run's inputs on (`ModelRuntime._run_bound`, servestack/inference/runtime.py):
# onnxruntime's device name of each; TensorRT's inputs live in CUDA memory too.
DEVICE_OF_PROVIDER = {CUDA: "cuda", TENSORRT: "cuda"}

GpuProvider = Literal["cuda", "tensorrt"]
# What an onnxruntime session takes: a provider's name, with its options.
ProviderChoice = tuple[str, dict[str, str]]


def choose_providers(requested: str, available: Sequence[str], gpus: int | None = None) -> list[str]:
    """`auto` prefers CUDA when this onnxruntime build offers it and a GPU is visible (`gpus`, counted when not
    given); an explicit list must be available. A CUDA build (the GPU image's `onnxruntime-gpu`) lists CUDA
    whether or not there is a GPU, and asked for it on a machine without one, logs an error (colored, with a
    library path) before it falls back to the CPU: `local up` runs the GPU image's environment on a laptop."""
    if requested.strip().lower() == "auto":
        if CUDA in available and (gpu_count() if gpus is None else gpus) > 0:
            return [CUDA, CPU]
        return [CPU]
    chosen = [name.strip() for name in requested.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in available]
    if not chosen or unknown:
        raise ConfigurationError(
            f"providers: {requested!r} names providers this onnxruntime does not offer",
            field="providers",
            value=requested,
            allowed=f"'auto' or a comma list of {list(available)}",
        )
    return chosen


def session_providers(
    requested: str,
    available: Sequence[str],
    *,
    gpu_provider: GpuProvider = "cuda",
    fp16: bool = False,
    engine_cache: Path,
    gpus: int | None = None,
    device_id: int = 0,
) -> list[ProviderChoice]:
    """The providers a session is created with, each with its options. `gpu_provider: tensorrt` puts TensorRT
    before CUDA where CUDA was chosen and this build offers TensorRT (the GPU image's onnxruntime-gpu does, given
    TensorRT's libraries); elsewhere CUDA serves alone, as TensorRT takes no graph CUDA could not run. TensorRT
    builds an engine per model and input shape on the first runs (minutes for a large graph): it keeps them in
    `engine_cache`, so a worker or a restart on the same host reuses them instead of building again. `fp16` lets
    TensorRT run layers in float16 (faster on tensor cores, answers within float16's precision). `device_id`: the
    GPU this worker runs on (servestack/inference/devices.py's `worker_gpu`)."""
    names = choose_providers(requested, available, gpus)
    if gpu_provider == "tensorrt" and CUDA in names and TENSORRT in available and TENSORRT not in names:
        names.insert(names.index(CUDA), TENSORRT)
    return [(name, _options(name, fp16=fp16, engine_cache=engine_cache, device_id=device_id)) for name in names]


def _options(name: str, *, fp16: bool, engine_cache: Path, device_id: int) -> dict[str, str]:
    device = {"device_id": str(device_id)} if device_id else {}  # onnxruntime's default device is 0
    if name == CUDA:
        # float32 math as on the CPU: onnxruntime's CUDA provider otherwise multiplies in TF32 on Ampere and later
        # (a 10-bit mantissa), and the digits model's probabilities moved by up to 3e-3 against the CPU's on an
        # H200 (bench/gpu_check.py). A model served locally on the CPU then answers as it does deployed on a GPU.
        return {**device, "use_tf32": "0"}
    if name != TENSORRT:
        return {}
    # onnxruntime's TensorRT options are strings ("True"/"False"), as its Python API documents them.
    return {
        **device,
        "trt_engine_cache_enable": "True",
        "trt_engine_cache_path": str(engine_cache),
        "trt_fp16_enable": str(fp16),
    }


# How to run on the CPU on purpose: the setting that makes `auto` (or a list) a CPU-only choice.
RUN_ON_CPU = f"SERVESTACK_PROVIDERS={CPU}"


def unloaded_gpu_provider(chosen: Sequence[str], loaded: Sequence[str], cuda_build: str | None = None) -> str | None:
    """Why a session asked for CUDA came back without it (its `get_providers()`, `loaded`), or None where it
    has CUDA or was not asked for it. onnxruntime does not raise when the CUDA provider cannot load (a CUDA or
    cuDNN library of another major version than the one its build links, a driver too old): it logs an error
    and runs the session on the CPU, so a GPU endpoint would pass its health check and serve on the CPU. The
    caller refuses the model instead. TensorRT is left out: without its libraries the session runs on CUDA,
    as docs/realtime.md says. `cuda_build`: the CUDA this onnxruntime was built for, where it says."""
    if CUDA not in chosen or CUDA in loaded:
        return None
    built = f" (this onnxruntime was built for CUDA {cuda_build})" if cuda_build else ""
    return (
        f"onnxruntime did not load the CUDA execution provider it was asked for, and would run on {', '.join(loaded)}: "
        f"likely a CUDA/cuDNN library mismatch between onnxruntime and the image or host{built}; onnxruntime's "
        f"log above names the library it could not load. To run on the CPU deliberately, set {RUN_ON_CPU}"
    )


def binding_device(providers: Sequence[str]) -> str | None:
    """The accelerator a session's inputs are bound to (onnxruntime's device name), or None where the session
    runs on the CPU: its first provider decides, as onnxruntime places every node it can there."""
    return DEVICE_OF_PROVIDER.get(providers[0]) if providers else None
