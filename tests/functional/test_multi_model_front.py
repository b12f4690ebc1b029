"""The local multi-model front (SageMaker's side of `Mode: MultiModel`) against slow loads, decompression bombs and
models whose load costs more memory than their file: one model's load never holds up another model's calls, a
bomb is stopped while it inflates and leaves nothing on the disk, and the container's budget counts what a load
measurably took."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from servestack.inference.packaging import create_package
from servestack.inference.registry import package_archive
from servestack.local.hosting.http_server import Request
from servestack.local.sagemaker.multi_model import RATIO_FLOOR_BYTES, MultiModelFront, model_name_of
from tests.conftest import ARTIFACTS, RealtimeServer
from tests.waiting import DEADLINE_SEC, Gate

pytestmark = pytest.mark.slow
DIGITS = ARTIFACTS / "digits" / "1"
DIGITS_REQUEST = (DIGITS / "sample-request.json").read_bytes()
FILES = ["manifest.json", "model.onnx", "sample-request.json", "sample-response.json", "process.py"]
# A package whose load holds 150 MB (its hooks allocate it and keep it, as a model's tables would), for a 21 KB
# model file.
HEAVY_HOOKS = """\
import numpy as np

TABLE = b"\\x01" * (150 * 1024 * 1024)


def preprocess(payload, content_type):
    return np.asarray(payload["instances"], dtype=np.float32) * (TABLE[0] // 1)
"""
BUDGET = 64 * 1024 * 1024


def archive_of(package_dir: Path) -> bytes:
    return package_archive(package_dir, [f for f in FILES if (package_dir / f).exists()])


def hooked_package(tmp: Path, name: str, hooks_source: str) -> Path:
    hooks = tmp / f"{name}-process.py"
    hooks.write_text(hooks_source)
    destination = tmp / "packages" / name
    create_package(DIGITS / "model.onnx", destination, name=name, version="1", process_file=hooks)
    for sample in ("sample-request.json", "sample-response.json"):
        (destination / sample).write_bytes((DIGITS / sample).read_bytes())
    return destination


@pytest.fixture
def container(tmp_path: Path) -> Iterator[tuple[RealtimeServer, Path]]:
    root = tmp_path / "opt-ml-models"
    root.mkdir()
    env = {
        "SERVESTACK_MULTI_MODEL": "true",
        "SERVESTACK_MULTI_MODEL_ROOT": str(root),
        "SERVESTACK_WORKERS": "1",
        "SERVESTACK_CACHE_BUDGET_BYTES": str(BUDGET),
    }
    server = RealtimeServer.start(tmp_path, env=env)
    yield server, root
    server.stop()


def invoke_request(body: bytes) -> Request:
    return Request("POST", "/endpoints/e/invocations", {}, {"content-type": "application/json"}, body)


def front_on(container: tuple[RealtimeServer, Path], prefix: Path) -> MultiModelFront:
    server, root = container
    return MultiModelFront(
        endpoint_name="e", container_url=server.url, model_data_url=str(prefix), cache_dir=root / "front"
    )


def test_a_slow_load_of_one_model_never_holds_up_calls_to_another(
    container: tuple[RealtimeServer, Path], tmp_path: Path
) -> None:
    prefix = tmp_path / "prefix"
    prefix.mkdir()
    (prefix / "fast.tar.gz").write_bytes(archive_of(DIGITS))
    # Model A's load lasts until the test lets it end (its hooks wait at a gate as they are imported, as a large
    # model's load takes its time).
    loading = Gate(tmp_path, "loading")
    (prefix / "slow.tar.gz").write_bytes(archive_of(hooked_package(tmp_path, "slow", loading.source())))
    front = front_on(container, prefix)
    try:
        # GIVEN model B loaded and answering
        assert front.invoke("fast.tar.gz", invoke_request(DIGITS_REQUEST)).status == 200
        # WHEN model A's first call starts its load
        slow_done = threading.Event()
        threading.Thread(
            target=lambda: (front.invoke("slow.tar.gz", invoke_request(DIGITS_REQUEST)), slow_done.set()), daemon=True
        ).start()
        loading.wait_reached()
        # THEN calls to B are answered while A's load is still under way (held at its gate until they are)
        latencies = []
        for _ in range(5):
            started = time.perf_counter()
            assert front.invoke("fast.tar.gz", invoke_request(DIGITS_REQUEST)).status == 200
            latencies.append(time.perf_counter() - started)
        print(f"B's latencies while A loads: {[round(s * 1e3, 1) for s in latencies]} ms")
        assert loading.is_held()
        assert not slow_done.is_set()
        # AND A's call is answered once its load ends
        loading.open()
        assert slow_done.wait(DEADLINE_SEC)
    finally:
        loading.open()
        front.close()


def bomb(inflated_bytes: int) -> bytes:
    """A valid model archive's worth of zeros: a 64 MiB member compresses to about 64 KB."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        member = tarfile.TarInfo("model.onnx")
        member.size = inflated_bytes
        tar.addfile(member, io.BytesIO(b"\0" * inflated_bytes))
    return gzip.compress(raw.getvalue(), compresslevel=9)


def test_a_decompression_bomb_is_refused_while_it_inflates_and_leaves_nothing_on_disk(
    container: tuple[RealtimeServer, Path], tmp_path: Path
) -> None:
    prefix = tmp_path / "prefix"
    prefix.mkdir()
    archive = bomb(4 * RATIO_FLOOR_BYTES)
    (prefix / "bomb.tar.gz").write_bytes(archive)
    front = front_on(container, prefix)
    try:
        # WHEN a TargetModel whose archive inflates about 1,000 times is invoked
        reply = front.invoke("bomb.tar.gz", invoke_request(DIGITS_REQUEST))
        # THEN it is a 413 with a JSON body naming the model, how far it inflated and the limit
        assert reply.status == 413, reply.body
        body = json.loads(reply.body)
        assert (body["field"], body["value"]) == ("TargetModel", "bomb.tar.gz")
        assert body["inflated_bytes"] <= RATIO_FLOOR_BYTES + 1024 * 1024, "inflated past the limit before stopping"
        assert "100x" in body["allowed"]
        # AND nothing of it is on the disk
        assert [p for p in (container[1] / "front").rglob("*") if p.is_file()] == []
    finally:
        front.close()


def test_the_memory_budget_counts_what_a_load_measurably_took(
    container: tuple[RealtimeServer, Path], tmp_path: Path
) -> None:
    server, _ = container
    prefix = tmp_path / "prefix"
    prefix.mkdir()
    (prefix / "heavy.tar.gz").write_bytes(archive_of(hooked_package(tmp_path, "heavy", HEAVY_HOOKS)))
    (prefix / "light.tar.gz").write_bytes(archive_of(DIGITS))
    front = front_on(container, prefix)
    try:
        # WHEN a model whose file is 21 KB but whose load holds 150 MB is loaded under a 64 MB budget
        reply = front.invoke("heavy.tar.gz", invoke_request(DIGITS_REQUEST))
        # THEN the container refuses it with 507 (SageMaker's ModelError carries it), and it is not loaded
        assert reply.status == 424, reply.body
        assert json.loads(reply.body)["OriginalStatusCode"] == 507
        loaded = httpx.get(f"{server.url}/models").json()["models"]
        assert model_name_of("heavy.tar.gz") not in {m["modelName"] for m in loaded}
        # AND its files are removed from the disk
        assert not (container[1] / "front" / model_name_of("heavy.tar.gz")).exists()
        # AND a model that fits still loads and answers
        assert front.invoke("light.tar.gz", invoke_request(DIGITS_REQUEST)).status == 200
    finally:
        front.close()
