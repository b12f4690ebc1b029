"""The release rehearsal as a user runs it: `local up`, `servestack models push` into the emulator's registry,
then `servestack local deploy`: a green side failing 20% of requests is rolled back with client-visible
failures bounded by the canary share; a healthy green completes and becomes `live`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import ARTIFACTS
from tests.e2e.conftest import copy_project, start_local_up

pytestmark = pytest.mark.slow
SERVESTACK = str(Path(sys.executable).parent / "servestack")
# Compressed clock: 1 s alarm periods, 2 of them to alarm; canary of 10% held 8 s, then a 2 s bake.
FAST = ["--period-sec", "1", "--evaluation-periods", "2", "--interval-sec", "8", "--bake-sec", "2"]


def _digits_v2(path: Path) -> Path:
    """Digits with other bytes and the same behaviour (a new doc string): a healthy new version."""
    import onnx

    model = onnx.load(str(ARTIFACTS / "digits" / "1" / "model.onnx"))
    model.doc_string = "digits, release 2"
    onnx.save(model, str(path))
    return path


def test_a_faulty_green_rolls_back_and_a_healthy_one_goes_live(tmp_path: Path) -> None:
    # GIVEN `local up` on a serving.yaml with one realtime deployment guarded at 1% 5xx / 500 ms p99
    spec = {
        "models": [{"name": "digits", "version": 1}],
        "deployments": {
            "digits-rt": {
                "mode": "realtime",
                "model": "digits",
                "strategy": {"type": "canary", "canary_percent": 10},
                "alarms": {"error_rate_percent": 1, "p99_latency_ms": 500},
            }
        },
    }
    spec_file = copy_project(tmp_path / "project", yaml.safe_dump(spec))  # a project of its own, with its models
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "SERVESTACK_LOCAL_STATE": str(tmp_path / "local.json")}
    env.pop("AWS_ENDPOINT_URL", None)
    env.pop("SERVESTACK_REGISTRY_URI", None)
    # (start_local_up waits 240 s by default: long enough for a synth of the new project first)
    up = start_local_up(
        tmp_path, "--fresh", "--data-dir", str(tmp_path / "data"), spec=spec_file, env=env,
        found_state=tmp_path / "local.json",
    )  # fmt: skip

    def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [SERVESTACK, *args], cwd=spec_file.parent, capture_output=True, text=True, env=env, timeout=120, check=check
        )

    try:
        url = up.deployment("digits-rt")["url"]
        # AND version 2 pushed to the emulator's registry with one command
        pushed = cli("models", "push", str(_digits_v2(tmp_path / "digits-v2.onnx")), "--name", "digits")
        assert "pushed   s3://servestack-registry/models/ (the running local up)" in pushed.stdout
        listed = json.loads(cli("models", "list", "--json").stdout)
        assert listed["digits"] == {"versions": ["1", "2"], "aliases": {"live": "1"}}

        # WHEN version 2 is rehearsed with 20% injected errors on the green side
        bad = cli(
            "local", "deploy", "digits-rt", "--version", "2", "--inject-faults", "error_rate=0.2",
            "--traffic-rps", "100", "--output", str(tmp_path / "bad.json"), *FAST, check=False,
        )  # fmt: skip
        outcome = json.loads((tmp_path / "bad.json").read_text())
        # THEN the 5xx-rate alarm fires during the canary, traffic goes back to blue, live stays at 1
        assert bad.returncode == 1, bad.stdout + bad.stderr
        assert outcome["state"] == "rolled_back"
        assert outcome["fired"]["alarm"] == "digits-rt-5xx-rate"
        events = [e["event"] for e in outcome["timeline"]]
        assert events[-2:] == ["alarm fired", "rolled back"]
        assert "live" not in events
        # AND client-visible failures in the canary window are at most the canary share of its requests (+3)
        canary = outcome["client"]["windows"][0]
        assert canary["green_percent"] == 10
        assert canary["requests"] > 100
        assert canary["failures"] <= 0.10 * canary["requests"] + 3
        assert json.loads(cli("models", "list", "digits", "--json").stdout)["digits"]["aliases"] == {"live": "1"}
        answer = httpx.post(f"{url}/invocations", content=(ARTIFACTS / "digits/1/sample-request.json").read_bytes())
        assert answer.json().get("version") == "1", answer.text
        print(f"\nrolled back: fired {outcome['fired']}; canary window {canary}")
        print(bad.stdout)

        # WHEN the same version is rehearsed healthy
        good = cli(
            "local", "deploy", "digits-rt", "--version", "2", "--traffic-rps", "50", "--interval-sec", "3",
            "--bake-sec", "1", "--period-sec", "1", "--evaluation-periods", "2",
            "--output", str(tmp_path / "good.json"), check=False,
        )  # fmt: skip
        # THEN it completes: all traffic on version 2 under the variant's name, and `live` points at it
        outcome = json.loads((tmp_path / "good.json").read_text())
        assert good.returncode == 0, good.stdout + good.stderr
        assert outcome["state"] == "succeeded"
        assert [e["event"] for e in outcome["timeline"]][-1] == "live"
        assert outcome["client"]["failures"] == 0
        assert json.loads(cli("models", "list", "digits", "--json").stdout)["digits"]["aliases"] == {"live": "2"}
        answer = httpx.post(f"{url}/invocations", content=(ARTIFACTS / "digits/1/sample-request.json").read_bytes())
        assert answer.json()["version"] == "2"
        assert answer.headers["x-amzn-invoked-production-variant"] == "primary"
        print(good.stdout)
    finally:
        up.stop()
