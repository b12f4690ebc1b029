"""Shared fixtures: real models, real servers as subprocesses, real Lambda event shapes."""

from __future__ import annotations

import asyncio
import base64
import copy
import gc
import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from servestack.local.hosting.processes import RealtimeProcess, free_port, http_status

REPO_ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO_ROOT / "models" / "artifacts"
EVENTS = Path(__file__).resolve().parent / "events"
HOOKS_SOURCE = Path(__file__).resolve().parent / "fixtures" / "digit_words_process.py"


@dataclass
class RealtimeServer:
    """`python -m servestack.adapters.realtime serve`, exactly as the container runs it, on a free local port."""

    child: RealtimeProcess
    log_path: Path

    @property
    def url(self) -> str:
        return self.child.url

    @property
    def process(self) -> subprocess.Popen[bytes]:
        return self.child.process

    @classmethod
    def start(cls, log_dir: Path, *, env: dict[str, str] | None = None, wait_ready: bool = True) -> RealtimeServer:
        port = free_port()
        log_path = log_dir / f"realtime-{port}.log"
        with log_path.open("wb") as log:
            child = RealtimeProcess.start("test", port, env=env, output=log)
        server = cls(child, log_path)
        server.wait_listening()
        if wait_ready:
            child.wait_ready(timeout_sec=30)
        return server

    def wait_listening(self, timeout_sec: float = 30) -> None:
        deadline = time.monotonic() + timeout_sec
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log_path.read_text()}")
            if http_status(f"{self.url}/ping") is not None:
                return
            time.sleep(0.05)
        raise TimeoutError(f"server not listening after {timeout_sec}s:\n{self.log_path.read_text()}")

    def wait_ready(self) -> None:
        self.child.wait_ready(timeout_sec=30)

    def ping_once_loaded(self) -> httpx.Response | None:
        """/ping's answer once it no longer says the models are loading (they are ready, or failed), else None."""
        ping = httpx.get(f"{self.url}/ping")
        return ping if ping.json()["status"] != "loading" else None

    def stop(self) -> int:
        return self.child.stop()


@pytest.fixture(scope="session")
def realtime_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealtimeServer]:
    server = RealtimeServer.start(tmp_path_factory.mktemp("realtime"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    data = load_digits()
    return data.data.astype(np.float32), data.target


@pytest.fixture(scope="session")
def sklearn_digits(digits: tuple[np.ndarray, np.ndarray]) -> Any:
    """The scikit-learn model the committed ONNX file was converted from, retrained (seeded) from the recipe."""
    from servestack.sample_models import RECIPES, train

    estimator, *_ = train(RECIPES["digits"])
    return estimator


# ------------------------------------------------------------------------------------------ Lambda events


class LambdaContext:
    """The attributes of the context object the Lambda Python runtime passes to a handler."""

    function_name = "servestack-digits-api"
    function_version = "$LATEST"
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:servestack-digits-api:live"
    memory_limit_in_mb = 2048
    aws_request_id = "52fdfc07-2182-454f-963f-5f0f9a621d72"
    log_group_name = "/aws/lambda/servestack-digits-api"
    log_stream_name = "2026/11/30/[$LATEST]a1b2c3d4e5f6"

    def get_remaining_time_in_millis(self) -> int:
        return 30_000


EVENT_FILES = {
    "http-api-v2": "apiGatewayHttpApiV2Event.json",
    "rest-v1": "apiGatewayRestV1Event.json",
    "function-url": "lambdaFunctionUrlEvent.json",
    "alb": "albEvent.json",
}


def lambda_event(
    kind: str,
    body: bytes | str,
    *,
    path: str = "/invocations",
    method: str = "POST",
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A real event of `kind` from tests/events/, carrying this request."""
    event: dict[str, Any] = copy.deepcopy(json.loads((EVENTS / EVENT_FILES[kind]).read_text()))
    raw = body.encode() if isinstance(body, str) else body
    try:
        text: str = raw.decode("utf-8")
        binary = False
    except UnicodeDecodeError:
        text, binary = base64.b64encode(raw).decode(), True
    event["body"], event["isBase64Encoded"] = text, binary
    extra = {name.lower(): value for name, value in (headers or {}).items()}
    if kind in ("http-api-v2", "function-url"):
        event["rawPath"] = event["requestContext"]["http"]["path"] = path
        event["requestContext"]["http"]["method"] = method
        event["headers"].update(extra)
        event["headers"]["content-length"] = str(len(raw))
    else:
        event["path"], event["httpMethod"] = path, method
        if kind == "rest-v1":
            event["requestContext"]["httpMethod"] = method
            for name, value in extra.items():
                canonical = "-".join(part.capitalize() for part in name.split("-"))
                event["headers"][canonical] = value
                event["multiValueHeaders"][canonical] = [value]
        else:
            event["headers"].update(extra)
    return event


@dataclass
class LambdaHandler:
    """`servestack.adapters.serverless.handler` with the event loop Mangum created at import, as in a Lambda process."""

    handler: Any
    loop: asyncio.AbstractEventLoop

    def __call__(self, event: dict[str, Any]) -> dict[str, Any]:
        # Other tests' asyncio.run() clears the current loop; put Mangum's back for the call.
        asyncio.set_event_loop(self.loop)
        try:
            result: dict[str, Any] = self.handler(event, LambdaContext())
            return result
        finally:
            asyncio.set_event_loop(None)


RAW_HOOKS = REPO_ROOT / "tests" / "fixtures" / "raw_digits_process.py"


def raw_digits_models(root: Path) -> Path:
    """`raw-digits` (the digits model behind the raw-body hook of tests/fixtures/raw_digits_process.py) beside the
    plain `digits` model, under `root`."""
    import shutil

    from servestack.inference.packaging import create_package

    create_package(
        ARTIFACTS / "digits" / "1" / "model.onnx", root / "raw-digits" / "1", name="raw-digits", version="1",
        process_file=RAW_HOOKS,
    )  # fmt: skip
    shutil.copytree(ARTIFACTS / "digits" / "1", root / "digits" / "1")
    return root


def fresh_lambda_handler(model_dir: Path, default_model: str, module_name: str) -> Iterator[LambdaHandler]:
    """A fresh copy of the Lambda entry module, initialised as a Lambda process does (models load at import) on
    `model_dir`'s models: a module fixture yields from it, and the loop closes when the fixture ends."""
    import importlib.util

    entry = importlib.util.find_spec("servestack.adapters.serverless")  # found, not imported: its init loads
    assert entry is not None
    assert entry.origin is not None
    spec = importlib.util.spec_from_file_location(module_name, entry.origin)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SERVESTACK_MODEL_DIR", str(model_dir))
        patch.setenv("SERVESTACK_DEFAULT_MODEL", default_model)
        spec.loader.exec_module(module)
    asyncio.set_event_loop(None)
    yield LambdaHandler(module.handler, loop)
    loop.close()


@pytest.fixture(scope="session")
def lambda_handler() -> Iterator[LambdaHandler]:
    from servestack.adapters import serverless

    loop = asyncio.get_event_loop_policy().get_event_loop()  # the loop Mangum set up during init
    asyncio.set_event_loop(None)
    yield LambdaHandler(serverless.handler, loop)
    loop.close()


def response_body(response: dict[str, Any]) -> bytes:
    body = response.get("body") or ""
    return base64.b64decode(body) if response.get("isBase64Encoded") else body.encode()


# ------------------------------------------------------------------------------------------ hypothesis

# Property tests run a few hundred examples each in `make test`; SERVESTACK_HYPOTHESIS_PROFILE=long runs
# thousands (a release check). No deadline: a shared 2-core machine makes per-example timing meaningless.
# Fixtures that span every example of a test (the peak-memory bound) are what they are meant to be.
SUPPRESSED = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture]
settings.register_profile(
    "default",
    max_examples=150,
    deadline=None,
    suppress_health_check=SUPPRESSED,
)
settings.register_profile(
    "long",
    max_examples=3000,
    deadline=None,
    suppress_health_check=SUPPRESSED,
)
settings.load_profile(os.environ.get("SERVESTACK_HYPOTHESIS_PROFILE", "default"))


# ------------------------------------------------------------------------------------------ pytest-xdist

# `make test` runs the suite on three xdist workers (two cores): much of its time is spent waiting on real servers and
# `local up` children, not on the CPU. A module is one unit of work, so its module-scoped servers start once.
# These modules run `local up` or a synth in the repository's own folder (its .servestack/ cache and state):
# they share one unit, so they never run at the same time as each other. (Modules that copy the project with
# tests/e2e/conftest.py's copy_project run in a folder of their own and need no such care.)
REPOSITORY_FOLDER_MODULES = frozenset({"tests/e2e/test_local_up_enforced.py", "tests/e2e/test_iam_surface.py"})
# These modules read one `local up` (tests/e2e/conftest.py's `shared_up`): one unit, so that one worker starts it
# once, runs them all against it one after another, and stops it when the last of them is done.
SHARED_LOCAL_UP_MODULES = frozenset(
    {
        "tests/e2e/test_fargate_batch_up.py",
        "tests/e2e/test_local_boundaries.py",
        "tests/e2e/test_sagemaker_paths.py",
        "tests/e2e/test_sagemaker_async_large.py",
        "tests/e2e/test_transform_batch.py",
        "tests/e2e/test_transform_schedule_fires.py",
    }
)
# These modules read tests/infra/conftest.py's session-scoped `synth` (the CDK app synthesized, ~50 s here): one
# unit, so that it is synthesized once per run rather than once per worker.
INFRA_SYNTH_MODULES = frozenset(
    f"tests/infra/test_{name}.py"
    for name in (
        "asynchronous", "batch", "checks", "components", "iam_policies_load", "local_topology", "pipeline",
        "realtime", "serverless", "shared",
    )
)  # fmt: skip
# What a unit costs, roughly, in seconds on this machine: each test by its folder, plus what each module's own
# `local up`s cost (start and stop, ~90 s each; the shared one and the infra synth count once per unit). The units
# are handed out longest first, so that the run does not end on one worker still inside an e2e module while the
# other is idle. The estimates only order the units: a wrong one costs balance, never a result.
TEST_COST_SEC = {"e2e": 5.0, "integration": 3.0, "functional": 2.0, "infra": 0.5}
LOCAL_UP_SEC = 90.0
# The e2e modules that start other than one `local up` (restarts, mutations and their restored runs, detach and
# restart, the docs' projects; the progress module only synthesizes).
LOCAL_UPS = {
    "tests/e2e/test_local_up_restarts.py": 3,
    "tests/e2e/test_iam_mutation.py": 2,
    "tests/e2e/test_transform_schedule_role.py": 2,
    "tests/e2e/test_shipped_artifacts.py": 2,
    "tests/e2e/test_local_lifecycle.py": 2,
    "tests/e2e/test_docs.py": 2,
    "tests/e2e/test_local_up_progress.py": 0,
}
UNIT_COST_SEC = {"shared-local-up": LOCAL_UP_SEC, "infra-synth": 50.0}


def scheduling_unit(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0]
    if module in REPOSITORY_FOLDER_MODULES:
        return "repository-folder"
    if module in SHARED_LOCAL_UP_MODULES:
        return "shared-local-up"
    if module in INFRA_SYNTH_MODULES:
        return "infra-synth"
    return module


def unit_costs(nodeids: list[str]) -> dict[str, float]:
    """Each scheduling unit of `nodeids` -> its estimated cost in seconds."""
    costs: dict[str, float] = {}
    modules: set[str] = set()
    for nodeid in nodeids:
        unit, module = scheduling_unit(nodeid), nodeid.split("::", 1)[0]
        parts = module.split("/")
        folder = parts[1] if len(parts) > 2 else ""
        cost = TEST_COST_SEC.get(folder, 0.5)
        if module not in modules:
            modules.add(module)
            if folder == "e2e" and unit not in UNIT_COST_SEC:
                cost += LOCAL_UP_SEC * LOCAL_UPS.get(module, 1)
        if unit not in costs:
            cost += UNIT_COST_SEC.get(unit, 0.0)
        costs[unit] = costs.get(unit, 0.0) + cost
    return costs


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return scheduling_unit(nodeid)

        costs: dict[str, float] | None = None

        def _assign_work_unit(self, node: Any) -> None:
            # The costliest unit still waiting goes next. (The collection itself keeps its order: the workers
            # map the indexes they are sent onto their own collection.)
            if self.costs is None:
                self.costs = unit_costs(self.collection)
            costs = self.costs
            self.workqueue.move_to_end(max(self.workqueue, key=lambda unit: costs[unit]), last=False)
            super()._assign_work_unit(node)

    return ModuleScheduling(config, log)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """A worker's last step, once its results are sent: its heap is frozen out of the collector. A worker ends
    the suite holding millions of objects, and Python's exit ran a full collection over them (`gc_collect_main`
    in a native stack of the exiting worker) for seconds, while xdist waited for the worker before it could
    finish the run."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        gc.freeze()


# ------------------------------------------------------------------------------------------ the model zoo


@pytest.fixture(scope="session")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Users' kinds of models (tests/zoo.py), trained and converted once per session: name -> ZooModel."""
    from tests.zoo import build_zoo

    return build_zoo(tmp_path_factory.mktemp("zoo"))
