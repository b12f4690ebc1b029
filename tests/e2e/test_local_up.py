"""`servestack local up` as a user runs it: the printed curl lines work, and Ctrl-C/SIGTERM stops everything."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from servestack.local.processes import free_port, http_status
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.slow


def test_local_up_prints_working_curls_and_stops_cleanly(sklearn_digits: object) -> None:
    # GIVEN `servestack local up` started as a subprocess
    port = free_port()
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "servestack"), "local", "up", "--port", str(port)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        printed: list[str] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any("Ctrl-C" in line for line in printed):
            printed.append(process.stdout.readline())
        curls = [line.strip() for line in printed if line.startswith("curl ")]
        # WHEN the printed curl lines are run as printed
        ping = subprocess.run(shlex.split(curls[0]), cwd=REPO_ROOT, capture_output=True, check=True)
        invocation = subprocess.run(shlex.split(curls[1]), cwd=REPO_ROOT, capture_output=True, check=True)
        # THEN the server is ready and predicts what scikit-learn predicts for the sample rows
        assert orjson.loads(ping.stdout) == {"status": "ready"}
        sample = orjson.loads((REPO_ROOT / re.search(r"@(\S+)", curls[1]).group(1)).read_bytes())  # type: ignore[union-attr]
        expected = sklearn_digits.predict(sample["instances"]).tolist()  # type: ignore[attr-defined]
        assert orjson.loads(invocation.stdout)["predictions"] == expected
    finally:
        # AND SIGTERM stops the supervisor and its server
        process.send_signal(signal.SIGTERM)
        exit_code = process.wait(timeout=20)
        if process.stdout is not None:
            process.stdout.close()
    assert exit_code == 0
    assert http_status(f"http://127.0.0.1:{port}/ping") is None
