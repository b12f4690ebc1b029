"""Multi-model serving: the real container entry loads 50 registry models on demand into an LRU cache whose
byte budget fits 10. Round-robin stays under budget, a hot set hits, concurrent first requests load once."""

from __future__ import annotations

import asyncio
import json
import statistics
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from servestack.inference.registry import DirectoryStore, ModelRegistry
from tests.conftest import ARTIFACTS, RealtimeServer
from tests.waiting import Gate, wait_for

pytestmark = pytest.mark.slow
DIGITS = ARTIFACTS / "digits" / "1"
SAMPLE = (DIGITS / "sample-request.json").read_bytes()
EXPECTED = json.loads((DIGITS / "sample-response.json").read_text())["predictions"]
MODELS = [f"m{i:02d}" for i in range(50)]
OVERHEAD = 256 * 1024
PER_MODEL = (DIGITS / "model.onnx").stat().st_size + OVERHEAD
BUDGET = 10 * PER_MODEL + PER_MODEL // 2  # fits 10 models, not 11


@pytest.fixture(scope="module")
def slow_load(tmp_path_factory: pytest.TempPathFactory) -> Gate:
    """The load of model `slow` in the server: its process.py waits at this gate as it is imported (in a process
    whose environment sets SLOW_LOAD_GATE), so that requests pile up behind the load until the test opens it."""
    return Gate(tmp_path_factory.mktemp("gates"), "slow-load")


@pytest.fixture(scope="module")
def registry_dir(tmp_path_factory: pytest.TempPathFactory, slow_load: Gate) -> Path:
    root = tmp_path_factory.mktemp("registry")
    registry = ModelRegistry(DirectoryStore(root))
    for name in MODELS:
        registry.push(DIGITS / "model.onnx", name=name, version="1")
    slow_hooks = tmp_path_factory.mktemp("hooks") / "process.py"
    slow_hooks.write_text(slow_load.source(only_with_env="SLOW_LOAD_GATE"))
    registry.push(DIGITS / "model.onnx", name="slow", version="1", process_file=slow_hooks)
    return root


@pytest.fixture(scope="module")
def server(registry_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealtimeServer]:
    logs = tmp_path_factory.mktemp("mme")
    env = {
        "SERVESTACK_REGISTRY_URI": str(registry_dir),
        "SERVESTACK_CACHE_BUDGET_BYTES": str(BUDGET),
        "SERVESTACK_CACHE_SESSION_OVERHEAD_BYTES": str(OVERHEAD),
        "SERVESTACK_CACHE_DIR": str(logs / "cache"),
        "SERVESTACK_DEFAULT_MODEL": "m00",
        "SERVESTACK_PREWARM": "m00,m01@1",
        "SLOW_LOAD_GATE": "on",
    }
    started = RealtimeServer.start(logs, env=env)
    yield started
    started.stop()


def cache(client: httpx.Client) -> dict:
    return client.get("/v1/cache").json()


def predict(client: httpx.Client, target: str) -> httpx.Response:
    return client.post(
        "/invocations",
        content=SAMPLE,
        headers={"Content-Type": "application/json", "X-Amzn-SageMaker-Target-Model": target},
    )


def test_prewarmed_models_are_resident_and_every_target_spelling_serves(server: RealtimeServer) -> None:
    with httpx.Client(base_url=server.url) as client:
        # GIVEN a server whose pre-warm list was loaded before /ping turned ready
        assert {"m00@1", "m01@1"} <= set(cache(client)["resident"])
        # WHEN a model is called by name, name@version, SageMaker's name/version.tar.gz and the REST route
        answers = [
            predict(client, "m01"),
            predict(client, "m01@1"),
            predict(client, "m01/1.tar.gz"),
            client.post("/v1/models/m01@1/predict", content=SAMPLE, headers={"Content-Type": "application/json"}),
            client.post("/invocations", content=SAMPLE, headers={"Content-Type": "application/json"}),
        ]
        # THEN each answers the digits predictions
        for answer in answers:
            assert answer.status_code == 200, answer.text
            assert answer.json()["predictions"] == EXPECTED
        # AND an unknown model is a 404 that lists what the registry holds
        missing = predict(client, "nope")
        assert missing.status_code == 404
        assert missing.json()["error"]["field"] == "model"
        assert "m49" in missing.json()["error"]["allowed"]


def test_twenty_concurrent_first_requests_load_the_model_once(server: RealtimeServer, slow_load: Gate) -> None:
    # GIVEN 20 open connections and a model never requested before, whose load lasts until the test ends it
    request = (
        f"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"X-Amzn-SageMaker-Target-Model: slow\r\nContent-Length: {len(SAMPLE)}\r\n\r\n"
    ).encode() + SAMPLE
    host, port = server.url.removeprefix("http://").split(":")

    def all_waiting_for_the_load(misses_before: int) -> bool:
        misses = httpx.get(f"{server.url}/v1/cache").json()["misses"]
        return slow_load.is_held() and misses - misses_before == 20

    async def burst(misses_before: int) -> list[int]:
        connections = [await asyncio.open_connection(host, int(port)) for _ in range(20)]
        for _, writer in connections:  # WHEN all 20 requests are written before any answer is read
            writer.write(request)
            await writer.drain()
        # ...and all 20 have missed and wait for the one load, which then ends
        await asyncio.to_thread(wait_for, lambda: all_waiting_for_the_load(misses_before), "20 requests on the load")
        slow_load.open()
        statuses = []
        for reader, writer in connections:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))[15:])
            await reader.readexactly(length)
            statuses.append(int(head[9:12]))
            writer.close()
        return statuses

    with httpx.Client(base_url=server.url) as client:
        before = cache(client)
        statuses = asyncio.run(burst(before["misses"]))
        after = cache(client)
    # THEN all 20 succeed, all 20 missed (they arrived while it loaded), and the model was loaded exactly once
    assert statuses == [200] * 20
    assert after["misses"] - before["misses"] == 20
    assert after["loads"] - before["loads"] == 1
    print(f"\n20 concurrent first requests: misses {after['misses'] - before['misses']}, loads 1")


def test_round_robin_over_50_stays_under_budget_and_a_hot_set_hits(server: RealtimeServer) -> None:
    with httpx.Client(base_url=server.url) as client:
        # GIVEN 50 models in the registry and a budget that fits 10
        # WHEN every model is requested in turn, twice
        resident: list[int] = []
        for _ in range(2):
            for name in MODELS:
                answer = predict(client, name)
                assert answer.status_code == 200, answer.text
                assert answer.json()["model"] == name
                metrics = cache(client)
                resident.append(metrics["resident_bytes"])
                assert metrics["resident_models"] <= 10
        metrics = cache(client)
        # THEN resident model memory never exceeded the budget, and LRU evicted as it went
        assert max(resident) <= BUDGET
        assert metrics["peak_resident_bytes"] <= BUDGET
        assert metrics["evictions"] >= 90
        # WHEN a hot set of 5 gets 1000 requests
        before = cache(client)
        for index in range(1000):
            assert predict(client, MODELS[index % 5]).status_code == 200
        after = cache(client)
    hits, misses = after["hits"] - before["hits"], after["misses"] - before["misses"]
    # THEN at least 99% of them are hits
    assert hits / (hits + misses) >= 0.99
    print(
        f"\nround-robin 50 models x2, budget {BUDGET} B (10 models): peak resident {metrics['peak_resident_bytes']} B, "
        f"evictions {metrics['evictions']}, loads {metrics['loads']}, cold-load p50 {metrics['load_ms']['p50']:.2f} ms "
        f"p99 {metrics['load_ms']['p99']:.2f} ms, process RSS {metrics['process_rss_bytes'] / 2**20:.1f} MiB; "
        f"hot set of 5: {hits}/{hits + misses} hits = {hits / (hits + misses):.2%}; "
        f"median resident {statistics.median(resident):.0f} B"
    )


def test_a_corrupted_registry_object_is_refused_at_load(server: RealtimeServer, registry_dir: Path) -> None:
    # GIVEN a registry version whose model bytes were altered after the push
    registry = ModelRegistry(DirectoryStore(registry_dir))
    registry.push(ARTIFACTS / "breast-cancer" / "1" / "model.onnx", name="tampered", version="1")
    with (registry_dir / "tampered" / "1" / "model.onnx").open("ab") as model_file:
        model_file.write(b"\0")
    # WHEN it is requested THEN the checksum check refuses it with a 500 naming the mismatch
    with httpx.Client(base_url=server.url) as client:
        answer = predict(client, "tampered")
    assert answer.status_code == 500
    assert answer.json()["error"]["type"] == "ChecksumMismatch"
