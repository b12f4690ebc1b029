"""No lost work in local mode: a child SIGKILLed during an async run is restarted while the others keep
running, and every job still succeeds exactly once; jobs and results survive a restart of local up itself,
and `--fresh` starts clean. An endpoint variant SIGKILLed (its master alone, or with its workers) twenty times
under realtime load is restarted each time, leaves no orphaned worker, and every call meanwhile is answered or
refused with a retryable status."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from botocore.exceptions import BotoCoreError, ClientError

from servestack.local.emulator.callers import signed
from servestack.local.iam.identities import Credentials
from tests.conftest import ARTIFACTS
from tests.control import control
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


REALTIME_SPEC = """\
models:
  - name: digits
    version: 1
deployments:
  digits-rt:
    mode: realtime
    model: digits
"""
VARIANT_KILLS = 20
RETRYABLE = {429, 502, 503, 504}
# A variant that served this long restarts after the backoff's first delay again (SERVESTACK_VARIANT_STABLE_SEC,
# 2 s by default): each kill below comes once the restarted variant has served a little longer than that.
STABLE_SEC = 0.5
PACE_SEC = 0.005  # each caller's pause between calls: load all the time, without one core spent on sending it


def _processes() -> Iterator[tuple[int, int, bytes]]:
    """(pid, parent pid, command line) of every process."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            command = (proc / "cmdline").read_bytes()
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        yield int(proc.name), parent, command


def _variant_masters(project: Path) -> list[int]:
    """The realtime containers of this project's endpoint routers."""
    found = list(_processes())
    routers = {
        pid
        for pid, _, command in found
        if b"servestack.local.sagemaker.endpoint" in command and bytes(project) in command
    }
    return [pid for pid, parent, command in found if parent in routers and _is_container(command)]


def _is_container(command: bytes) -> bool:
    """The working tree's entry (`python -m servestack.adapters.realtime serve`) or the image's, run from its staged
    build context (`python -m handlers.realtime serve`: the Dockerfile's ENTRYPOINT and SageMaker's argument)."""
    return b"servestack.adapters.realtime" in command or b"handlers.realtime\x00serve" in command


def _descendants(pid: int) -> list[int]:
    found = list(_processes())
    result, todo = [], [pid]
    while todo:
        current = todo.pop()
        children = [child for child, parent, _ in found if parent == current]
        result += children
        todo += children
    return result


def test_variant_kills_under_realtime_load_are_restarted_and_every_call_is_answered(tmp_path: Path) -> None:
    spec = copy_project(tmp_path / "project", REALTIME_SPEC)
    payload = (ARTIFACTS / "digits/1/sample-request.json").read_bytes()
    outcomes: Counter[str] = Counter()
    unexpected: list[str] = []
    stop, counting = threading.Event(), threading.Lock()
    with running(tmp_path, "--fresh", spec=spec, env={"SERVESTACK_VARIANT_STABLE_SEC": str(STABLE_SEC)}) as up:
        endpoint = up.deployment("digits-rt")["endpoint_name"]

        def caller() -> None:
            runtime = up.client("sagemaker-runtime")  # one attempt per call: every outcome is seen
            while not stop.is_set():
                try:
                    runtime.invoke_endpoint(EndpointName=endpoint, Body=payload, ContentType="application/json")
                    outcome = "200"
                except ClientError as error:
                    status = error.response["ResponseMetadata"]["HTTPStatusCode"]
                    outcome = f"{status} {error.response['Error']['Code']}"
                    if status not in RETRYABLE:
                        unexpected.append(f"{outcome}: {error}")
                    time.sleep(0.05)  # a caller pauses before its retry
                except (BotoCoreError, OSError) as error:  # a hang (read timeout) or a reset: never expected
                    outcome = type(error).__name__
                    unexpected.append(f"{outcome}: {error}")
                with counting:
                    outcomes[outcome] += 1
                stop.wait(PACE_SEC)

        callers = [threading.Thread(target=caller, daemon=True) for _ in range(3)]
        for thread in callers:
            thread.start()
        kills: Counter[str] = Counter()
        try:
            for kill in range(VARIANT_KILLS):
                (master,) = wait_for(lambda: _variant_masters(spec.parent), 60, "one serving variant")
                workers = _descendants(master)
                # WHEN the variant is SIGKILLed: its master alone (its worker stays), or its whole process tree
                if kill % 2 == 0:
                    os.kill(master, signal.SIGKILL)
                    kills["master only"] += 1
                else:
                    for pid in [master, *workers]:
                        os.kill(pid, signal.SIGKILL)
                    kills["master and workers"] += 1
                # THEN a new container serves, and no worker of the old one is left
                gone = master
                wait_for(lambda: [p for p in _variant_masters(spec.parent) if p != gone], 60, "a restarted variant")  # noqa: B023
                wait_for(lambda: not any(Path(f"/proc/{pid}").exists() and _running(pid) for pid in workers), 60,  # noqa: B023
                         "the old workers to be gone")  # fmt: skip
                ready = outcomes["200"]
                wait_for(lambda: outcomes["200"] > ready, 60, "an answered call after the restart")  # noqa: B023
                time.sleep(STABLE_SEC + 0.1)  # it serves a while, so the next restart comes after the first backoff
        finally:
            stop.set()
            for thread in callers:
                thread.join(timeout=150)
        metrics = control("GET", f"{up.deployment('digits-rt')['control_url']}/_servestack/metrics", timeout=30).json()
    calls = sum(outcomes.values())
    print(f"\nvariant kills: {dict(kills)}; calls: {calls}; outcomes: {dict(outcomes)}")
    # AND every call was answered, or refused with a retryable status
    assert not unexpected, unexpected[:5]
    (variant,) = metrics["variants"].values()
    assert variant["restarts"] == VARIANT_KILLS
    assert outcomes["200"] > 0


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
