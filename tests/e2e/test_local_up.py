"""`servestack local up` as a user runs it: one deployment of each mode answers through its printed lines,
`servestack invoke` and `run-batch` find it through the state file, and Ctrl-C/SIGTERM stops everything."""

from __future__ import annotations

import json
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
from tests.conftest import ARTIFACTS, REPO_ROOT

pytestmark = pytest.mark.slow
SERVESTACK = str(Path(sys.executable).parent / "servestack")


def run_printed(line: str) -> bytes:
    return subprocess.run(shlex.split(line), cwd=REPO_ROOT, capture_output=True, check=True, timeout=60).stdout


def test_local_up_runs_every_mode_and_stops_cleanly(sklearn_digits: object, tmp_path: Path) -> None:
    # GIVEN `servestack local up` started as a subprocess on the repo's serving.yaml
    port = free_port()
    state = tmp_path / "local.json"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "SERVESTACK_LOCAL_STATE": str(state)}
    env.pop("AWS_ENDPOINT_URL", None)
    process = subprocess.Popen(
        [SERVESTACK, "local", "up", "--port", str(port)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        assert process.stdout is not None
        printed: list[str] = []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not any("Ctrl-C" in line for line in printed):
            printed.append(process.stdout.readline())
        lines = [line.strip() for line in printed if line.startswith("curl ") or " local run-batch " in line]
        realtime = [line for line in lines if f":{port}/" in line]
        others = [line for line in lines if f":{port}/" not in line]
        serverless = next(line for line in others if "/invocations" in line)
        submit = next(line for line in others if "/jobs " in line)
        batch = next(line for line in others if "run-batch" in line)
        # WHEN the realtime lines are run as printed
        # THEN the server is ready and predicts what scikit-learn predicts for the sample rows
        assert orjson.loads(run_printed(realtime[0])) == {"status": "ready"}
        sample = orjson.loads((REPO_ROOT / re.search(r"@(\S+)", realtime[1]).group(1)).read_bytes())  # type: ignore[union-attr]
        expected = sklearn_digits.predict(sample["instances"]).tolist()  # type: ignore[attr-defined]
        assert orjson.loads(run_printed(realtime[1]))["predictions"] == expected
        # AND the serverless line (HTTP API v2 event -> Lambda handler) gives the same predictions
        assert orjson.loads(run_printed(serverless))["predictions"] == expected
        # AND the async line queues a job whose status URL reports success with a result link
        job = orjson.loads(run_printed(submit))
        assert job["status"] == "queued"
        status: dict[str, object] = {}
        for _ in range(100):
            status = orjson.loads(run_printed(f"curl -s {job['status_url']}"))
            if status["status"] in ("succeeded", "failed"):
                break
            time.sleep(0.2)
        assert status["status"] == "succeeded"
        # AND `servestack invoke` waits for an async result that matches the sample response
        invoked = subprocess.run(
            [SERVESTACK, "invoke", "cancer-async", "--data", str(ARTIFACTS / "breast-cancer/1/sample-request.json")],
            cwd=REPO_ROOT, capture_output=True, check=True, timeout=60, env=env,
        )  # fmt: skip
        answer = json.loads(invoked.stdout)
        reference = json.loads((ARTIFACTS / "breast-cancer/1/sample-response.json").read_text())
        assert answer["predictions"] == reference["predictions"]
        # AND the printed run-batch line scores the seeded sample input
        result = subprocess.run(
            shlex.split(batch), cwd=REPO_ROOT, capture_output=True, check=True, timeout=120, env=env
        )
        summary = json.loads(result.stdout.decode().splitlines()[-1])
        assert summary["rows"]["succeeded"] == len(reference["predictions"])
        assert summary["rows"]["failed"] == 0
    finally:
        # AND SIGTERM stops the supervisor and everything it started
        process.send_signal(signal.SIGTERM)
        exit_code = process.wait(timeout=30)
        if process.stdout is not None:
            process.stdout.close()
    assert exit_code == 0
    assert http_status(f"http://127.0.0.1:{port}/ping") is None
    assert not state.exists()
