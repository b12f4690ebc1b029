"""The local endpoint router, as `local up` runs it: real realtime children behind it, real HTTP.

A/B: a 90/10 split over 10,000 requests. Shadow: every copy goes to a different model; the primary answers
are byte-identical to the primary's own, and the report compares the two."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest

from servestack.local.hosting.processes import free_port, http_status, stop_process
from tests.conftest import ARTIFACTS, REPO_ROOT
from tests.control import ROUTER_ENVIRONMENT, control

pytestmark = pytest.mark.slow
SAMPLE = (ARTIFACTS / "digits" / "1" / "sample-request.json").read_bytes()


@dataclass
class RouterProcess:
    process: subprocess.Popen[bytes]
    url: str
    log: Path
    control_url: str  # the admin routes' port

    @classmethod
    def start(cls, tmp: Path, deployment: str, variants: list[dict], shadow: dict | None = None,
              shadow_percent: float = 0.0, **settings: object) -> RouterProcess:  # fmt: skip
        """The endpoint process with the config local up writes from an endpoint's template."""
        config = tmp / "endpoint.json"
        config.write_text(json.dumps({
            "deployment": deployment, "endpoint": f"servestack-{deployment}", "variants": variants,
            "shadow": shadow, "shadow_percent": shadow_percent, "cache_dir": str(tmp / "cache"), **settings,
        }))  # fmt: skip
        port, control_port = free_port(), free_port()
        log = tmp / "router.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "servestack.local.sagemaker.endpoint", "--config", str(config),
                 "--port", str(port), "--control-port", str(control_port)],
                cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **ROUTER_ENVIRONMENT},
            )  # fmt: skip
        router = cls(process, f"http://127.0.0.1:{port}", log, f"http://127.0.0.1:{control_port}")
        deadline = time.monotonic() + 60
        while http_status(f"{router.url}/ping") != 200:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"router did not start:\n{log.read_text()}")
            time.sleep(0.1)
        return router

    def stop(self) -> None:
        stop_process(self.process, 20)


async def _send(url: str, total: int, concurrency: int) -> tuple[Counter[str], Counter[int]]:
    """`total` POSTs over keep-alive connections; counts the variant header and the statuses."""
    host, port = url.removeprefix("http://").split(":")
    request = (
        f"POST /invocations HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(SAMPLE)}\r\n\r\n"
    ).encode() + SAMPLE
    variants: Counter[str] = Counter()
    statuses: Counter[int] = Counter()
    remaining = [total]

    async def worker() -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        while remaining[0] > 0:
            remaining[0] -= 1
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            fields = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:] if b": " in line)
            await reader.readexactly(int(fields[b"content-length"]))
            statuses[int(head[9:12])] += 1
            variants[fields.get(b"x-amzn-invoked-production-variant", b"?").decode()] += 1
        writer.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return variants, statuses


@pytest.fixture(scope="module")
def ab_router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProcess]:
    def variant(name: str, weight: int) -> dict:
        return {"name": name, "model": "digits", "version": "1", "weight": weight,
                "package_dir": str(ARTIFACTS / "digits" / "1")}  # fmt: skip

    variants = [variant("current", 9), variant("candidate", 1)]
    router = RouterProcess.start(tmp_path_factory.mktemp("ab"), "digits-ab", variants)
    yield router
    router.stop()


def test_a_90_10_split_over_10000_requests_lands_within_3_points(ab_router: RouterProcess) -> None:
    # GIVEN variants weighted 9:1 behind the router
    # WHEN 10,000 requests go through it
    started = time.perf_counter()
    variants, statuses = asyncio.run(_send(ab_router.url, 10_000, 16))
    elapsed = time.perf_counter() - started
    # THEN every answer names its variant, and the candidate's share is 10% +- 3 points
    assert statuses == {200: 10_000}
    assert set(variants) == {"current", "candidate"}
    share = variants["candidate"] / 10_000
    assert abs(share - 0.10) <= 0.03
    # AND the router's per-variant metrics agree with what the client saw
    metrics = control("GET", f"{ab_router.control_url}/_servestack/metrics").json()["variants"]
    assert {name: m["requests"] for name, m in metrics.items()} == dict(variants)
    assert all(m["errors_5xx"] == 0 and m["latency_ms"]["p99"] > 0 for m in metrics.values())
    # AND SageMaker's TargetVariant header picks a variant outright
    targeted = httpx.post(
        f"{ab_router.url}/invocations",
        content=SAMPLE,
        headers={"Content-Type": "application/json", "X-Amzn-SageMaker-Target-Variant": "candidate"},
    )
    assert targeted.headers["x-amzn-invoked-production-variant"] == "candidate"
    print(
        f"\nA/B 90/10: candidate {share:.2%} of 10,000 ({10_000 / elapsed:.0f} req/s through the router); "
        f"p99 ms current {metrics['current']['latency_ms']['p99']:.2f}, "
        f"candidate {metrics['candidate']['latency_ms']['p99']:.2f}"
    )


def _noisy_digits(model_dir: Path) -> None:
    """`digits-noisy@1`: the digits MLP with noise on its first weight matrix (same signature, other answers)."""
    import onnx
    from onnx import numpy_helper

    from servestack.inference.packaging import create_package

    model = onnx.load(str(ARTIFACTS / "digits" / "1" / "model.onnx"))
    first = next(i for i in model.graph.initializer if numpy_helper.to_array(i).size > 64)
    weights = numpy_helper.to_array(first)
    noise = np.random.default_rng(0).normal(0, 0.5, weights.shape).astype(weights.dtype)
    first.CopyFrom(numpy_helper.from_array(weights + noise, first.name))
    onnx.save(model, str(model_dir / "noisy.onnx"))
    create_package(model_dir / "noisy.onnx", model_dir / "digits-noisy" / "1", name="digits-noisy", version="1")


@pytest.fixture(scope="module")
def shadow_router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProcess]:
    tmp = tmp_path_factory.mktemp("shadow")
    model_dir = tmp / "models"
    shutil.copytree(ARTIFACTS / "digits", model_dir / "digits")
    _noisy_digits(model_dir)
    primary = {"name": "primary", "model": "digits", "version": "1", "weight": 1,
               "package_dir": str(model_dir / "digits" / "1")}  # fmt: skip
    shadow = {"name": "shadow", "model": "digits-noisy", "version": "1", "weight": 1,
              "package_dir": str(model_dir / "digits-noisy" / "1")}  # fmt: skip
    router = RouterProcess.start(tmp, "digits-shadowed", [primary], shadow, shadow_percent=100)
    yield router
    router.stop()


def test_the_shadow_never_changes_a_primary_answer_and_is_reported(shadow_router: RouterProcess) -> None:
    # GIVEN a primary and a shadow that answers differently, every request copied
    metrics = control("GET", f"{shadow_router.control_url}/_servestack/metrics").json()
    primary_url = metrics["variants"]["primary"]["url"]
    headers = {"Content-Type": "application/json"}
    direct = httpx.post(f"{primary_url}/invocations", content=SAMPLE, headers=headers).content
    # WHEN 300 requests go through the router
    with httpx.Client(base_url=shadow_router.url) as client:
        answers = [client.post("/invocations", content=SAMPLE, headers=headers) for _ in range(300)]
    # THEN each primary answer is byte-identical to the primary's own, from the primary variant
    assert all(a.status_code == 200 and a.content == direct for a in answers)
    assert {a.headers["x-amzn-invoked-production-variant"] for a in answers} == {"primary"}
    assert json.loads(direct)["model"] == "digits"
    # AND the report compares the shadow with the primary
    deadline = time.monotonic() + 60
    report = control("GET", f"{shadow_router.control_url}/_servestack/shadow").json()
    while report["copied"] + report["dropped"] < 300 and time.monotonic() < deadline:
        time.sleep(0.1)
        report = control("GET", f"{shadow_router.control_url}/_servestack/shadow").json()
    assert report["copied"] + report["dropped"] == 300
    assert report["copied"] > 0
    assert report["shadow_errors"] == 0
    assert report["compared_rows"] == 4 * report["copied"]  # the sample request has 4 rows
    assert 0 <= report["label_agreement"] <= 1
    assert report["mean_abs_probability_diff"] > 0
    assert report["latency_ms"]["primary"]["p50"] > 0
    assert report["latency_ms"]["shadow"]["p50"] > 0
    print(f"\nshadow report: {json.dumps(report)}")


@pytest.fixture(scope="module")
def component_router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProcess]:
    def component(name: str, model: str) -> dict:
        return {"name": name, "model": model, "version": "1", "weight": 1, "component": name,
                "package_dir": str(ARTIFACTS / model / "1")}  # fmt: skip

    components = [component("ep-digits", "digits"), component("ep-cancer", "breast-cancer")]
    router = RouterProcess.start(tmp_path_factory.mktemp("components"), "two-models", components)
    yield router
    router.stop()


def test_inference_components_are_routed_by_name_and_refused_as_sagemaker_refuses(
    component_router: RouterProcess,
) -> None:
    cancer = (ARTIFACTS / "breast-cancer" / "1" / "sample-request.json").read_bytes()
    with httpx.Client(base_url=component_router.url, headers={"Content-Type": "application/json"}) as client:

        def call(body: bytes, component: str | None) -> httpx.Response:
            named = {"X-Amzn-SageMaker-Inference-Component": component} if component else {}
            return client.post("/invocations", content=body, headers=named)

        # WHEN each component is named THEN its own model answers, the answer naming the component's container
        digits_answer, cancer_answer = call(SAMPLE, "ep-digits"), call(cancer, "ep-cancer")
        assert (digits_answer.json()["model"], cancer_answer.json()["model"]) == ("digits", "breast-cancer")
        assert digits_answer.headers["x-amzn-invoked-production-variant"] == "ep-digits"
        # AND no name or an unknown one is a 400 naming the header, the value and the components
        missing, unknown = call(SAMPLE, None).json()["error"], call(SAMPLE, "ep-nope").json()["error"]
        assert missing["message"].startswith("Inference Component Name header is required")
        assert (unknown["field"], unknown["value"], unknown["allowed"]) == (
            "X-Amzn-SageMaker-Inference-Component", "ep-nope", "ep-digits, ep-cancer"
        )  # fmt: skip
        # WHEN a component is set to zero copies THEN its container stops and it has no capacity
        control_url = component_router.control_url
        zero = control("POST", f"{control_url}/_servestack/components/ep-cancer", {"copies": 0}, timeout=60)
        assert zero.json()["ep-cancer"] == {"copies": 0, "backends": [], "serving": 0}
        no_capacity = call(cancer, "ep-cancer")
        assert no_capacity.status_code == 400
        assert no_capacity.json()["error"]["message"].startswith("Inference Component has no capacity")
        assert call(SAMPLE, "ep-digits").status_code == 200  # the other one serves on
        # WHEN it gets copies again THEN it answers again; a bad copy count is refused with what is allowed
        again = control("POST", f"{control_url}/_servestack/components/ep-cancer", {"copies": 2}, timeout=60)
        assert again.status_code == 200
        assert call(cancer, "ep-cancer").json()["model"] == "breast-cancer"
        bad = control("POST", f"{control_url}/_servestack/components/ep-cancer", {"copies": -1})
        assert (bad.status_code, bad.json()["error"]["allowed"]) == (400, "0..1000")
