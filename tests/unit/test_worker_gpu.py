"""One worker per GPU, each on its own device: workers claim GPU slots with file locks held for their lifetime."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from servestack.inference.devices import worker_gpu
from servestack.inference.providers import CPU, CUDA, TENSORRT, session_providers

CLAIM = """
import sys
from pathlib import Path
from servestack.inference.devices import worker_gpu
print(worker_gpu(4, Path(sys.argv[1])), flush=True)
sys.stdin.read()  # hold the slot until the test lets go
"""


def test_four_workers_on_four_gpus_take_four_devices(tmp_path: Path) -> None:
    workers = [
        subprocess.Popen([sys.executable, "-c", CLAIM, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
        for _ in range(4)
    ]  # fmt: skip
    try:
        slots = [int(worker.stdout.readline()) for worker in workers if worker.stdout is not None]
        assert sorted(slots) == [0, 1, 2, 3]
    finally:
        for worker in workers:
            worker.communicate("", timeout=30)
    # Their locks went with them: a restarted worker finds a slot free again.
    restarted = subprocess.run([sys.executable, "-c", CLAIM, str(tmp_path)], input="", capture_output=True, text=True,
                               check=True, timeout=30)  # fmt: skip
    assert int(restarted.stdout) in range(4)


def test_a_single_gpu_is_device_zero(tmp_path: Path) -> None:
    assert worker_gpu(1, tmp_path) == 0
    assert worker_gpu(0, tmp_path) == 0


def test_the_device_reaches_the_providers_options(tmp_path: Path) -> None:
    cuda = session_providers("auto", [CUDA, CPU], engine_cache=tmp_path, gpus=4, device_id=2)
    assert cuda == [(CUDA, {"device_id": "2", "use_tf32": "0"}), (CPU, {})]
    trt = session_providers("auto", [TENSORRT, CUDA, CPU], gpu_provider="tensorrt", engine_cache=tmp_path, gpus=4,
                            device_id=3)  # fmt: skip
    assert trt[0][0] == TENSORRT
    assert trt[0][1]["device_id"] == "3"
    assert trt[1] == (CUDA, {"device_id": "3", "use_tf32": "0"})
