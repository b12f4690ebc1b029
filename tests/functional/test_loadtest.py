"""The load generator against a real server: closed and open loop, the report, the plot, and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from servestack.loadtest import Target, plot, run
from tests.conftest import ARTIFACTS, REPO_ROOT, RealtimeServer

pytestmark = pytest.mark.slow
SAMPLE = (ARTIFACTS / "digits" / "1" / "sample-request.json").read_bytes()


def test_closed_loop_reports_qps_latency_and_provisioning(realtime_server: RealtimeServer, tmp_path: Path) -> None:
    target = Target.from_url(f"{realtime_server.url}/invocations", SAMPLE, "application/json")
    report, samples = run(target, duration_sec=1.0, concurrency=4)
    assert report.statuses == {"200": report.requests}
    assert report.requests > 50
    assert 0 < report.latency_ms["p50"] <= report.latency_ms["p99"] <= report.latency_ms["max"]
    assert report.provisioning["concurrency"] >= 1
    assert report.provisioning["instances"] >= 1
    picture = tmp_path / "latency.png"
    plot(samples, picture, "test")
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_open_loop_sends_at_the_asked_rate(realtime_server: RealtimeServer) -> None:
    target = Target.from_url(f"{realtime_server.url}/invocations", SAMPLE, "application/json")
    report, _ = run(target, duration_sec=1.0, rate=200)
    assert report.requests == 200
    assert report.statuses == {"200": 200}


def test_errors_are_counted_by_status(realtime_server: RealtimeServer) -> None:
    target = Target.from_url(f"{realtime_server.url}/invocations", b'{"instances": [[1]]}', "application/json")
    report, _ = run(target, duration_sec=0.5, concurrency=2)
    assert set(report.statuses) == {"400"}
    assert report.ok_latency_ms == {}


def test_cli_writes_the_json_report_and_the_png(realtime_server: RealtimeServer, tmp_path: Path) -> None:
    report, picture = tmp_path / "report.json", tmp_path / "report.png"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "servestack.cli",
            "loadtest",
            f"{realtime_server.url}/invocations",
            "--concurrency",
            "2",
            "--duration",
            "1",
            "--report",
            str(report),
            "--plot",
            str(picture),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "req/s" in result.stdout
    written = json.loads(report.read_text())
    assert written["statuses"]["200"] > 0
    # the request's size and rows travel with the figures: `servestack plan` scales payloads and batch rows by them
    assert (written["request_bytes"], written["request_rows"]) == (len(SAMPLE), 4)
    assert picture.stat().st_size > 1000


def test_https_targets_are_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="plain HTTP"):
        Target.from_url("https://example.com/invocations", SAMPLE, "application/json")
