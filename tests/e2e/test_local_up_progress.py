"""`local up` in front of a terminal: while synth runs (tens of seconds on a first start), its stderr, a pty,
shows a live line that names the step and why it runs, redrawn with the time so far; stdout (what scripts read)
carries no terminal codes. (Off a terminal, the same steps are plain lines: tests/e2e/test_local_lifecycle.py.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import copy_project

pytestmark = pytest.mark.slow
SERVESTACK = str(Path(sys.executable).parent / "servestack")
SPEC = {
    "models": [{"name": "digits", "version": 1}],
    "deployments": {"digits-rt": {"mode": "realtime", "model": "digits"}},
}


def test_a_terminal_sees_progress_during_synth(tmp_path: Path) -> None:
    project = copy_project(tmp_path / "project", yaml.safe_dump(SPEC)).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SERVESTACK_", "AWS_")) and k != "CI"}
    controller, terminal = os.openpty()
    seen = bytearray()
    stamps: list[tuple[float, int]] = []  # (when, bytes seen so far)

    def read() -> None:
        while True:
            try:
                chunk = os.read(controller, 4096)
            except OSError:  # the terminal's other side closed
                return
            if not chunk:
                return
            seen.extend(chunk)
            stamps.append((time.monotonic(), len(seen)))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    # WHEN `local up --explain` (synth, then the list of resources) runs with a terminal as its stderr
    started = time.monotonic()
    process = subprocess.run(
        [SERVESTACK, "local", "up", "--explain"], cwd=project, env=env, stdout=subprocess.PIPE, stderr=terminal,
        timeout=400, check=False,
    )  # fmt: skip
    os.close(terminal)
    reader.join(timeout=10)
    os.close(controller)
    assert process.returncode == 0, bytes(seen).decode(errors="replace")[-3000:]
    text = bytes(seen).decode(errors="replace")
    # THEN during synth the terminal got a live line: the step, why it runs, and a clock that moved
    assert "✓ synth: templates written (" in text, text[-3000:]
    finished = text.index("✓ synth: templates written (")
    during = text[:finished]
    assert "\x1b[" in during  # redrawn in place, not printed line after line
    assert "synth: synthesizing: no earlier synth in cdk.out" in during
    clocks = set(re.findall(r"0:00:\d\d", during))
    assert len(clocks) >= 3, clocks  # redrawn for seconds on end, while synth ran
    first_byte = stamps[0][0] - started
    assert first_byte < 15, f"the first progress came {first_byte:.1f}s after the start"
    # AND the line it leaves says how long synth took; stdout holds the resource list and no terminal codes
    assert re.search(r"✓ synth: templates written \(\d+\.\ds\)", text)
    assert b"resource types:" in process.stdout
    assert b"\x1b[" not in process.stdout
    # AND it says that the realtime deployment's GPU instance type (the default, ml.g5.xlarge) runs on the CPU here
    assert (
        b"digits-rt: variant primary of servestack-digits-rt is a GPU instance type on AWS (ml.g5.xlarge, NVIDIA "
        b"A10G); here it runs on this machine's CPU, with onnxruntime's CPU provider"
    ) in process.stdout
