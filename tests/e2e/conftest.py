"""`servestack local up` as a subprocess, exactly as a user starts it, and what tests need to talk to it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from botocore.config import Config

from servestack.local.emulator import session_client
from servestack.local.hosting.processes import free_port
from tests.conftest import REPO_ROOT

SERVESTACK = str(Path(sys.executable).parent / "servestack")
DEVELOPER = {"region_name": "us-east-1", "aws_access_key_id": "local", "aws_secret_access_key": "local"}


@dataclass
class LocalUp:
    process: subprocess.Popen[bytes]
    state_path: Path
    log: Path

    @property
    def state(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(self.state_path.read_text())
        return loaded

    @property
    def api(self) -> str:
        return str(self.state["aws_api_url"])

    def deployment(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.state["deployments"][name]
        return found

    def client(self, service: str, **keys: Any) -> Any:
        """A boto3 client on local up's AWS API port (sagemaker-runtime, lambda), as the developer by default."""
        config = Config(retries={"mode": "standard", "max_attempts": 1}, read_timeout=120)
        return session_client(service, **(keys or DEVELOPER), endpoint_url=self.api, config=config)

    def emulator(self, service: str, **keys: Any) -> Any:
        """A boto3 client on the emulator (s3, sqs, dynamodb...), as the developer by default."""
        config = Config(s3={"addressing_style": "path"}, retries={"mode": "standard", "max_attempts": 1})
        return session_client(service, **(keys or DEVELOPER), endpoint_url=self.state["endpoint_url"], config=config)

    def role_keys(self, role_fragment: str) -> dict[str, str]:
        """The keys local up gave the role whose name contains `role_fragment` (as a function of it runs)."""
        name = next(n for n in self.state["identities"] if role_fragment in n)
        keys = self.state["identities"][name]
        return {
            "region_name": "us-east-1",
            "aws_access_key_id": keys["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": keys["AWS_SECRET_ACCESS_KEY"],
            "aws_session_token": keys["AWS_SESSION_TOKEN"],
        }

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)


def start_local_up(
    workdir: Path,
    *args: str,
    spec: Path | None = None,
    timeout_sec: float = 240,
    env: dict[str, str] | None = None,
    cwd: Path = REPO_ROOT,
    found_state: Path | None = None,
) -> LocalUp:
    """`servestack local up [--spec SPEC] ARGS` on free ports, from `cwd`; returns once its state file is
    written: `workdir/local.json` (through SERVESTACK_LOCAL_STATE), or with `found_state`, the file local up
    finds by itself (in the project's .servestack/), and then `env` is the whole environment, not additions.

    A free port is only free when it is picked: another process (the other pytest worker's servers, or any
    client's ephemeral port) can take it before local up, or one of its children, binds it. local up then
    stops cleanly with its documented port error (exit 2), and the start is tried again on other
    ports (at most `PORT_RACE_ATTEMPTS` times); any other failure fails at once."""
    if found_state is None:
        state_path = workdir / "local.json"
        environment = {**os.environ, "PYTHONUNBUFFERED": "1", "SERVESTACK_LOCAL_STATE": str(state_path), **(env or {})}
        environment.pop("AWS_ENDPOINT_URL", None)
    else:
        state_path, environment = found_state, dict(env or {})
    for attempt in range(1, PORT_RACE_ATTEMPTS + 1):
        log_path = workdir / f"local-up-{time.time_ns()}.log"
        argv = [SERVESTACK, "local", "up", "--port", str(free_port()), "--aws-port", str(free_port()), *args]
        if spec is not None:
            argv += ["--spec", str(spec)]
        with log_path.open("wb") as log:
            process = subprocess.Popen(argv, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env=environment)
        up = LocalUp(process, state_path, log_path)
        deadline = time.monotonic() + timeout_sec
        while not state_path.exists():  # written once every child answers and the fronts listen
            if process.poll() is not None:
                break
            if time.monotonic() > deadline:
                up.stop()
                raise AssertionError(f"local up not ready after {timeout_sec}s:\n{up.log_text()[-6000:]}")
            time.sleep(0.2)
        else:
            return up
        log_text = up.log_text()
        port_taken = any(sign in log_text for sign in PORT_TAKEN)
        if process.returncode != 2 or not port_taken or attempt == PORT_RACE_ATTEMPTS:
            raise AssertionError(f"local up exited ({process.returncode}):\n{log_text[-6000:]}")
    raise AssertionError("unreachable")


PORT_RACE_ATTEMPTS = 3
# local up's two ways of saying so (servestack/local/up/command.py before binding, servestack/failures.py after).
PORT_TAKEN = ("is in use; pick another with --", "Address already in use: another process took the port")


@contextmanager
def running(
    workdir: Path, *args: str, spec: Path | None = None, env: dict[str, str] | None = None
) -> Iterator[LocalUp]:
    up = start_local_up(workdir, *args, spec=spec, env=env)
    try:
        yield up
    finally:
        code = up.stop()
        assert code == 0, up.log_text()[-4000:]


# One `local up` for the modules that only read what it runs (tests/conftest.py's SHARED_LOCAL_UP_MODULES, which
# xdist runs in one worker, one after another): each of them calls deployments of its own, so none sees
# another's jobs, objects or schedule runs. Modules that kill children, deploy versions or mutate templates
# start a `local up` of their own. Which module reads which deployment:
# - test_fargate_batch_up.py: weekly (a Fargate batch and its schedule's role)
# - test_local_boundaries.py: every child's environment and every control route (reads; changes nothing)
# - test_sagemaker_paths.py: digits-mme (a multi-model endpoint) and cancer-sm (async on SageMaker)
# - test_sagemaker_async_large.py: cancer-sm (a 200 MB job; it deletes its objects when done)
# - test_transform_batch.py: on-lambda and on-transform (the same input, run by both batch engines)
# - test_transform_schedule_fires.py: nightly (a transform on a one-minute schedule)
SHARED_SPEC = """\
models:
  - name: digits
    version: 1
  - name: breast-cancer
    version: 1
deployments:
  weekly:
    mode: batch
    model: digits
    engine: fargate
    schedule: rate(7 days)
  digits-mme:
    mode: realtime
    model: digits
    multi_model: true
    instance_type: ml.c6i.xlarge
  cancer-sm:
    mode: async
    model: breast-cancer
    backend: sagemaker
    instance_type: ml.c6i.xlarge
  on-lambda:
    mode: batch
    model: breast-cancer
  on-transform:
    mode: batch
    model: breast-cancer
    engine: transform
    instance_type: ml.m5.large
    instance_count: 2
    max_payload_mb: 1
  nightly:
    mode: batch
    model: breast-cancer
    engine: transform
    schedule: rate(1 minute)
    instance_type: ml.m5.large
    instance_count: 1
"""


class SharedLocalUp:
    """SHARED_SPEC's `local up`: started by the first module that asks for it, stopped (and its exit checked) as
    soon as the run leaves the modules that share it, so that it does not run on beside the worker's next units."""

    def __init__(self) -> None:
        self.up: LocalUp | None = None

    def get(self, tmp_path_factory: pytest.TempPathFactory) -> LocalUp:
        if self.up is None:
            where = tmp_path_factory.mktemp("shared-up")
            spec = copy_project(where / "project", SHARED_SPEC)
            self.up = start_local_up(where, "--fresh", "--data-dir", str(where / "data"), spec=spec)
        return self.up

    def stop(self) -> None:
        up, self.up = self.up, None
        if up is not None:
            code = up.stop()
            assert code == 0, up.log_text()[-4000:]


SHARED_LOCAL_UP = SharedLocalUp()


@pytest.fixture(scope="module")
def shared_up(tmp_path_factory: pytest.TempPathFactory) -> LocalUp:
    return SHARED_LOCAL_UP.get(tmp_path_factory)


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last test of a run of tests on the shared local up, stop it (a failed stop fails that teardown)."""
    if SHARED_LOCAL_UP.up is not None and (nextitem is None or not uses_shared_up(nextitem)):
        SHARED_LOCAL_UP.stop()


def uses_shared_up(item: pytest.Item) -> bool:
    return "shared_up" in getattr(item, "fixturenames", ())


def pytest_sessionfinish(session: pytest.Session) -> None:
    """An interrupted run (Ctrl-C, -x) still stops the shared local up."""
    if SHARED_LOCAL_UP.up is not None:
        SHARED_LOCAL_UP.up.stop()
        SHARED_LOCAL_UP.up = None


# The CDK app and its constructs, the model packages, and what the images' Dockerfiles COPY from the app's
# folder (their build context): local up runs a SageMaker container from that context, as `cdk deploy` builds it.
PROJECT_FILES = ("app.py", "cdk.json", "stacks", "models", "handlers", "servestack", "pyproject.toml",
                 "uv.lock", "README.md")  # fmt: skip


def copy_project(target: Path, spec: str) -> Path:
    """A project of its own in `target`: the CDK app and constructs, the model artifacts, the images' sources,
    and `spec` as its serving.yaml. Returns the serving.yaml path."""
    for item in PROJECT_FILES:
        source = REPO_ROOT / item
        if source.is_dir():
            shutil.copytree(source, target / item, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (target / item).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / item)
    spec_path = target / "serving.yaml"
    spec_path.write_text(spec)
    return spec_path


def wait_for(check: Any, timeout_sec: float = 60, what: str = "the condition") -> Any:
    deadline = time.monotonic() + timeout_sec
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def async_worker_pids(project: Path | None = None) -> list[int]:
    """The processes of async workers' execution environments (`servestack.local.lambda_.runner` children of local up,
    whose config names an `AsyncWorker` function); with `project`, only that project's (its config lies under
    the project's .servestack/run: other local ups on the machine, other test runs, have workers of their own)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            command = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        mine = [part for part in command if b"AsyncWorker" in part]
        if project is not None:
            mine = [part for part in mine if part.startswith(bytes(project))]
        if b"servestack.local.lambda_.runner" in command and mine:
            found.append(int(proc.name))
    return found
