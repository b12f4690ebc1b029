"""No lost work in local mode: a child SIGKILLed during an async run is restarted while the others keep
running, and every job still succeeds exactly once; jobs and results survive a restart of local up itself,
and `--fresh` starts clean."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from servestack.local.commands import signed
from servestack.local.iam.identities import Credentials
from tests.conftest import ARTIFACTS
from tests.e2e.conftest import async_worker_pids, copy_project, running, wait_for

pytestmark = pytest.mark.slow
DEVELOPER = Credentials("arn:aws:iam::123456789012:user/developer", "local", "local")
# A short worker timeout keeps the queue's visibility timeout (6x it, from the template) short: messages a
# killed worker held come back within 18 s instead of 12 minutes.
SPEC = """\
models:
  - name: breast-cancer
    version: 1
deployments:
  jobs:
    mode: async
    model: breast-cancer
    timeout_sec: 3
    batch_size: 5
    batch_window_sec: 0
    max_receive_count: 5
"""
JOBS = 30


def statuses(url: str, ids: list[str]) -> dict[str, str]:
    found = {}
    for job_id in ids:
        _, body = signed("GET", f"{url}/jobs/{job_id}", DEVELOPER, "us-east-1")
        found[job_id] = json.loads(body).get("status", "missing")
    return found


def test_a_killed_worker_is_restarted_and_no_job_is_lost_or_duplicated(tmp_path: Path) -> None:
    spec = copy_project(tmp_path / "project", SPEC)
    data = tmp_path / "data"
    payload = (ARTIFACTS / "breast-cancer/1/sample-request.json").read_bytes()
    with running(tmp_path, "--fresh", "--data-dir", str(data), spec=spec) as up:
        url = up.deployment("jobs")["url"]
        # GIVEN jobs submitted to the async deployment
        ids = []
        for _ in range(JOBS):
            status, body = signed("POST", f"{url}/jobs", DEVELOPER, "us-east-1", body=payload,
                                  headers={"Content-Type": "application/json"})  # fmt: skip
            assert status == 202, body
            ids.append(json.loads(body)["job_id"])
        # WHEN the worker's process is SIGKILLed mid-run
        (pid,) = wait_for(lambda: async_worker_pids(spec.parent), 30, "the worker process")
        os.kill(pid, signal.SIGKILL)
        # THEN local up restarts it, and every job ends `succeeded`
        wait_for(lambda: any(p != pid for p in async_worker_pids(spec.parent)), 60, "a restarted worker")
        wait_for(lambda: set(statuses(url, ids).values()) == {"succeeded"}, 120, "every job to succeed")
        assert "restarting" in up.log_text()
        # AND each job has exactly one result object (one version in the versioned bucket)
        bucket = up.deployment("jobs")["bucket"]
        s3 = up.emulator("s3")
        prefix = "async/servestack-jobs/results/"
        versions = s3.list_object_versions(Bucket=bucket, Prefix=prefix).get("Versions", [])
        keys = [v["Key"] for v in versions]
        assert sorted(keys) == sorted(f"{prefix}{job_id}" for job_id in ids)

    # GIVEN local up stopped WHEN it starts again on the same data THEN the jobs and results are still there
    with running(tmp_path, "--data-dir", str(data), spec=spec) as up:
        url = up.deployment("jobs")["url"]
        assert set(statuses(url, ids[:5]).values()) == {"succeeded"}
    # AND --fresh starts clean
    with running(tmp_path, "--fresh", "--data-dir", str(data), spec=spec) as up:
        url = up.deployment("jobs")["url"]
        assert set(statuses(url, ids[:1]).values()) == {"missing"}
