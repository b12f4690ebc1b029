"""The accelerators this process can see, read without loading any model runtime (the serving master counts
GPUs to size its workers, and must stay light: servestack/adapters/realtime.py)."""

from __future__ import annotations

import os
from pathlib import Path

NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")


def gpu_count() -> int:
    """GPUs the NVIDIA driver exposes to this process (no CUDA library needed to count them): the devices
    `CUDA_VISIBLE_DEVICES` names where it is set, else the driver's list."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([device for device in visible.split(",") if device.strip() and device.strip() != "-1"])
    return len(list(NVIDIA_GPUS.glob("*")))
