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


# The slot lock a worker holds for its lifetime (closed, and released, when the process exits).
_HELD_SLOT: list[object] = []


def worker_gpu(gpus: int, lock_dir: Path | None = None) -> int:
    """The GPU this worker process runs on: the serving master starts one worker per GPU, and each takes the
    first free slot, claimed with a lock on a file held until the process ends (a restarted worker takes its
    predecessor's slot again). Without it, every worker's session would open device 0 and the others would idle.
    With more workers than GPUs, or locks unavailable, the pid spreads them."""
    if gpus <= 1:
        return 0
    if _HELD_SLOT:
        return int(getattr(_HELD_SLOT[0], "slot", 0))
    import fcntl
    import tempfile

    folder = lock_dir or Path(tempfile.gettempdir())
    start = os.getpid() % gpus
    for offset in range(gpus):
        slot = (start + offset) % gpus
        handle = (folder / f"servestack-gpu-{slot}.lock").open("a")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            continue
        _HELD_SLOT.append(_Slot(handle, slot))
        return slot
    return start


class _Slot:
    def __init__(self, handle: object, slot: int) -> None:
        self.handle, self.slot = handle, slot
