"""The load generator against a real server: closed and open loop, the report, the plot, and the CLI."""

from __future__ import annotations

import asyncio
import http.server
import itertools
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import types
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from servestack.failures import ExitCode
from servestack.loadtest import driver as loadtest
from servestack.loadtest.command import draw, plot, region_of
from servestack.loadtest.driver import Sample, Target, run, summarize
from servestack.local.hosting.processes import free_port, http_status, stop_process
from tests.conftest import ARTIFACTS, REPO_ROOT, RealtimeServer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SERVESTACK = str(Path(sys.executable).parent / "servestack")

pytestmark = pytest.mark.slow
SAMPLE = (ARTIFACTS / "digits" / "1" / "sample-request.json").read_bytes()


def test_closed_loop_reports_qps_latency_and_provisioning(realtime_server: RealtimeServer, tmp_path: Path) -> None:
    target = Target.from_url(f"{realtime_server.url}/invocations", SAMPLE, "application/json")
    report, samples = run(target, duration_sec=1.0, concurrency=4)
    assert report.statuses == {"200": report.requests}
    assert report.requests > 50
    assert 0 < report.latency_ms["p50"] <= report.latency_ms["p99"] <= report.latency_ms["max"]
    # without a target QPS: the measured capacity per instance, and no instance count
    assert report.provisioning["per_instance_qps"] == pytest.approx(report.ok_qps)
    assert "instances" not in report.provisioning
    assert "pass --target-qps N" in report.summary()
    picture = tmp_path / "latency.png"
    plot(samples, picture, "test")
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_open_loop_sends_at_the_asked_rate(realtime_server: RealtimeServer) -> None:
    # GIVEN a real server (which, as any server, may shed some of a burst with 429 when the machine is busy)
    target = Target.from_url(f"{realtime_server.url}/invocations", SAMPLE, "application/json")
    # WHEN the open loop is asked for 200 requests/s for one second
    started = time.monotonic()
    report, samples = run(target, duration_sec=1.0, rate=200)
    took = time.monotonic() - started
    print(f"open loop: statuses {report.statuses}, errors {report.errors}, {took:.2f}s")
    # THEN it sent rate x duration requests, one every 1/rate s of the schedule whatever the answers (an open loop
    # never waits for an answer before the next send), and did not send them faster than asked: the last one
    # went out no sooner than 199/200 s after the first
    assert report.requests == len(samples) == 200
    assert report.mode == "open loop, 200 req/s"
    starts = sorted(sample.started for sample in samples)
    assert [round(later - earlier, 6) for earlier, later in itertools.pairwise(starts)] == [0.005] * 199
    assert took >= 0.995
    # AND every request is accounted for once: answered with a status, or failed without one (none here); every
    # status is counted, a 429 as shed load, and at least some were served
    assert sum(report.statuses.values()) + sum(report.errors.values()) == report.requests
    assert report.errors == {}, report.errors
    assert set(report.statuses) <= {"200", "429"}, report.statuses
    assert report.statuses.get("200", 0) > 0
    assert report.retry_after_seen == report.statuses.get("429", 0)


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
            "servestack.cli.main",
            "loadtest",
            f"{realtime_server.url}/invocations",
            "--data",
            str(ARTIFACTS / "digits" / "1" / "sample-request.json"),
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


def test_unknown_schemes_are_refused_naming_the_accepted_ones() -> None:
    with pytest.raises(ValueError, match="sagemaker://ENDPOINT"):
        Target.from_url("ftp://example.com/invocations", SAMPLE, "application/json")


def test_https_targets_use_port_443_and_sign_the_host_as_botocore_does() -> None:
    # GIVEN an API Gateway URL
    url = "https://abc123.execute-api.eu-west-1.amazonaws.com/prod/invocations?x=1"
    target = Target.from_url(url, SAMPLE, "application/json")
    # THEN TLS on 443, the Host header without the default port, the path with its query, the region from the host
    assert (target.scheme, target.port, target.host_header) == (
        "https",
        443,
        "abc123.execute-api.eu-west-1.amazonaws.com",
    )
    assert target.path == "/prod/invocations?x=1"
    assert region_of(None, url) == "eu-west-1"
    assert region_of("us-east-2", url) == "us-east-2"


def test_capacity_advice_needs_a_target_for_a_count_and_sizes_from_per_instance_capacity() -> None:
    # GIVEN 10 s of 2xx answers at 1000 req/s, 20 ms each, measured on 2 instances
    samples = [Sample(i / 1000, 0.020, 200) for i in range(10_000)]
    # WHEN summarized without and with a target
    bare = summarize(samples, "closed loop", 10.0, instances_measured=2)
    sized = summarize(samples, "closed loop", 10.0, instances_measured=2, target_qps=3000)
    # THEN the capacity is per instance (500 req/s), and counts come only with the target:
    # 3000 x 1.5 / 500 = 9 instances; concurrency 3000 x 0.020 x 1.5 = 90
    assert bare.provisioning["per_instance_qps"] == pytest.approx(500)
    assert "instances" not in bare.provisioning
    assert "pass --target-qps N" in bare.summary()
    assert sized.provisioning["instances"] == 9
    assert sized.provisioning["concurrency"] == 90
    assert "9 instance(s)" in sized.summary()


def test_a_signed_request_is_signed_again_before_its_signature_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a signed target, and the load generator's clock in the test's hands (a real one, on a busy machine,
    # may pass the re-signing interval between two calls meant to fall within it)
    signed: list[str] = []

    def signer(target: Target) -> dict[str, str]:
        signed.append(f"sig-{len(signed) + 1}")
        return {"Authorization": signed[-1]}

    now = [1_000.0]
    monkeypatch.setattr(loadtest, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    target = Target.from_url("http://127.0.0.1:1/invocations", SAMPLE, "application/json", signer=signer)
    request = loadtest.RequestBytes(target)
    first = request.current()
    # WHEN the interval has not passed THEN the same bytes are sent
    now[0] += loadtest.SIGN_EVERY_SEC / 2
    assert request.current() == first
    # WHEN it has THEN the request is signed again
    now[0] += loadtest.SIGN_EVERY_SEC
    assert b"Authorization: sig-2" in request.current()


@pytest.fixture
def sigv4_server(tmp_path: Path) -> Iterator[str]:
    """tests/fixtures/sigv4_server.py: answers 200 only to correctly signed requests (for eu-west-1/execute-api)."""
    port = free_port()
    env = {**os.environ, "AWS_SECRET_ACCESS_KEY": "server-secret"}
    with (tmp_path / "sigv4.log").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, str(FIXTURES / "sigv4_server.py"), "--port", str(port), "--region", "eu-west-1",
             "--service", "execute-api"],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while http_status(f"{url}/stats") != 200:
        assert process.poll() is None, (tmp_path / "sigv4.log").read_text()
        assert time.monotonic() < deadline, (tmp_path / "sigv4.log").read_text()
        time.sleep(0.05)
    yield url
    stop_process(process, 5)


def loadtest_cli(url: str, tmp_path: Path, secret: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env |= {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": secret, "AWS_SESSION_TOKEN": "token-1"}
    argv = [sys.executable, "-m", "servestack.cli.main", "loadtest", f"{url}/prod/invocations", "--sigv4",
            "--region", "eu-west-1", "--duration", "1", "--concurrency", "2",
            "--data", str(ARTIFACTS / "digits" / "1" / "sample-request.json"),
            "--report", str(tmp_path / "r.json"), "--plot", str(tmp_path / "r.png"), *extra]  # fmt: skip
    return subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_sigv4_signed_load_passes_an_independent_signature_check(sigv4_server: str, tmp_path: Path) -> None:
    # GIVEN a server that checks SigV4 signatures with its own implementation of the specification
    # WHEN loadtest signs with the credentials the server knows (botocore's chain: the environment here)
    done = loadtest_cli(sigv4_server, tmp_path, "server-secret")
    stats = json.loads(urllib.request.urlopen(f"{sigv4_server}/stats").read())
    # THEN every request was accepted, with the session token sent
    assert done.returncode == 0, done.stderr
    assert stats["invalid"] == 0, stats["reasons"]
    assert stats["valid"] == json.loads((tmp_path / "r.json").read_text())["requests"] > 10
    assert stats["tokens"] == ["token-1"]


def test_a_wrong_secret_is_refused_and_loadtest_exits_1(sigv4_server: str, tmp_path: Path) -> None:
    done = loadtest_cli(sigv4_server, tmp_path, "wrong-secret")
    stats = json.loads(urllib.request.urlopen(f"{sigv4_server}/stats").read())
    assert done.returncode == 1
    assert stats["valid"] == 0
    assert set(stats["reasons"]) == {"signature mismatch"}
    assert "'403'" in done.stdout


Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def closed_loop_against(serve: Serve, seconds: float) -> list[Sample]:
    """The closed loop's samples (2 connections for `seconds`) against a raw TCP server answering with `serve`."""

    async def measure() -> list[Sample]:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        target = Target.from_url(f"http://127.0.0.1:{port}/invocations", b"payload", "application/json")
        async with server:
            return await loadtest._closed_loop(target, 2, seconds, 5.0, honour_retry_after=False)

    return asyncio.run(measure())


def test_responses_split_anywhere_and_closed_connections_are_read_as_a_server_sends_them() -> None:
    # GIVEN a server that writes each response in 3-byte pieces (the head, then a body) and closes every
    # third connection after answering with `Connection: close`, and a 503 with Retry-After on every fourth
    answered = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal answered
        while True:
            try:
                await reader.readuntil(b"\r\n\r\n")
                await reader.readexactly(len(b"payload"))
            except (asyncio.IncompleteReadError, ConnectionError):
                break
            answered += 1
            closing = answered % 3 == 0
            status = b"503 Service Unavailable\r\nRetry-After: 2" if answered % 4 == 0 else b"200 OK"
            body = b'{"predictions": [1, 2, 3]}'
            response = (
                b"HTTP/1.1 " + status + b"\r\nContent-Length: " + str(len(body)).encode()
                + (b"\r\nConnection: close" if closing else b"") + b"\r\n\r\n" + body
            )  # fmt: skip
            for start in range(0, len(response), 3):
                writer.write(response[start : start + 3])
                await writer.drain()
            if closing:
                break
        writer.close()

    samples = closed_loop_against(serve, seconds=0.5)
    # THEN every answer is read whole: 200s and 503s (with their Retry-After) by status, and each answer
    # that closed its connection counted as a reset, after which the client reconnects and goes on
    statuses = {sample.status for sample in samples}
    assert statuses == {0, 200, 503}
    assert {sample.retry_after for sample in samples if sample.status == 503} == {"2"}
    assert {sample.retry_after for sample in samples if sample.status == 0} == {"ConnectionResetError"}
    assert len(samples) == answered > 30


def test_an_answer_that_is_not_http_is_counted_as_an_error_of_its_own_name() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
            await reader.read()  # until the client drops the connection
        finally:
            writer.close()

    samples = closed_loop_against(serve, seconds=0.3)
    assert len(samples) > 5  # each one dropped its connection, and the next opened a new one
    assert {(sample.status, sample.retry_after) for sample in samples} == {(0, "MalformedResponse")}


class ChunkedHandler(http.server.BaseHTTPRequestHandler):
    """Answers every POST with `Transfer-Encoding: chunked`: the JSON body in three chunks, as streaming servers
    (and proxies that do not buffer) send it."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for piece in (b'{"predictions": ', b"[1, 2, 3]", b"}"):
            self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: one line per request would flood the test's output."""


@pytest.fixture
def chunked_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ChunkedHandler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/invocations"
    server.shutdown()
    server.server_close()


def test_chunked_answers_count_as_answers(chunked_server: str) -> None:
    # GIVEN a real HTTP/1.1 server whose every answer is chunked (no Content-Length)
    target = Target.from_url(chunked_server, SAMPLE, "application/json")
    # WHEN the closed loop drives it over keep-alive connections
    report, _ = run(target, duration_sec=0.5, concurrency=2)
    # THEN every answer is read as the 200 it is: no MalformedResponse, no reset, no timeout
    assert report.errors == {}
    assert report.statuses == {"200": report.requests}
    assert report.requests > 20


# ------------------------------------------------------------------------------------------ the command's defaults

CANCER_SAMPLE = ARTIFACTS / "breast-cancer" / "1" / "sample-request.json"


@pytest.fixture(scope="module")
def cancer_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealtimeServer]:
    """A realtime container serving the breast-cancer model at /invocations (30 features, not digits' 64)."""
    server = RealtimeServer.start(tmp_path_factory.mktemp("cancer"), env={"SERVESTACK_DEFAULT_MODEL": "breast-cancer"})
    yield server
    server.stop()


def project_with_local_up(root: Path, deployments: dict[str, dict[str, object]]) -> Path:
    """A project (the repository's serving.yaml) whose running local up's state file lists `deployments`; the
    state's process is this test's, so it counts as running."""
    (root / "notebooks").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "serving.yaml", root / "serving.yaml")
    state = root / ".servestack" / "local.json"
    state.parent.mkdir()
    state.write_text(json.dumps({"pid": os.getpid(), "deployments": deployments}))
    return root


def loadtest_here(cwd: Path, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`servestack loadtest ARGV` from `cwd`, as a user types it (report and plot in cwd)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SERVESTACK_", "AWS_"))}
    return subprocess.run(
        [SERVESTACK, "loadtest", *argv, "--duration", "0.5", "--concurrency", "2"],
        cwd=cwd, env={**clean, **(env or {})}, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_without_data_the_target_deployments_own_sample_is_sent(cancer_server: RealtimeServer, tmp_path: Path) -> None:
    # GIVEN a project whose local up serves the breast-cancer deployment on this container's port
    project = project_with_local_up(tmp_path / "project", {"cancer-async": {"mode": "async", "url": cancer_server.url}})
    # WHEN the user load-tests it from a subfolder without --data
    done = loadtest_here(project / "notebooks", f"{cancer_server.url}/invocations")
    # THEN the breast-cancer package's sample request went (not the digits one), and the model answered 2xx
    assert done.returncode == 0, done.stderr
    assert "sending the sample request of cancer-async (model breast-cancer@1)" in done.stderr
    written = json.loads((project / "notebooks" / "loadtest.json").read_text())
    assert written["request_bytes"] == len(CANCER_SAMPLE.read_bytes())
    assert set(written["statuses"]) == {"200"}


def test_a_target_of_no_deployment_without_data_is_refused_naming_the_fixes(tmp_path: Path) -> None:
    project = project_with_local_up(tmp_path / "project", {})
    done = loadtest_here(project, f"http://127.0.0.1:{free_port()}/invocations")
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert "pass --data FILE, or --deployment NAME (one of digits-realtime, digits-api" in done.stderr
    assert "Traceback" not in done.stderr


def test_non_2xx_answers_show_what_the_server_said(cancer_server: RealtimeServer, tmp_path: Path) -> None:
    # GIVEN a request of another model (digits' 64 features) for the breast-cancer container
    digits = str(ARTIFACTS / "digits/1/sample-request.json")
    done = loadtest_here(tmp_path, f"{cancer_server.url}/invocations", "--data", digits)
    # THEN it exits 1, and the summary quotes the container's error body once (every answer said the same)
    assert done.returncode == 1
    said = done.stdout.split("what the server said", 1)[1].splitlines()
    assert said[0] == " (the first 1 distinct non-2xx bodies):"
    assert said[1].startswith("  400: {")
    assert "30" in said[1], said[1]  # the error names the width the model takes
    assert "64" in said[1], said[1]  # and the one it was given
    assert json.loads((tmp_path / "loadtest.json").read_text())["error_bodies"][0][0] == 400


def test_a_local_target_without_credentials_names_local_ups_keys(tmp_path: Path) -> None:
    # GIVEN no AWS credentials anywhere (no environment keys, no ~/.aws)
    env = {"HOME": str(tmp_path), "AWS_CONFIG_FILE": str(tmp_path / "none"),
           "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}  # fmt: skip
    data = ["--data", str(CANCER_SAMPLE), "--region", "us-east-1"]
    # WHEN loadtest targets local up's SageMaker front, or signs for a local HTTP API
    local = f"http://127.0.0.1:{free_port()}"
    sagemaker = loadtest_here(
        tmp_path, "sagemaker://servestack-digits-realtime", "--endpoint-url", local, *data, env=env
    )
    signed = loadtest_here(tmp_path, f"{local}/invocations", "--sigv4", *data, env=env)
    # THEN both name the keys local up takes; a cloud target still says how to configure AWS
    for done in (sagemaker, signed):
        assert done.returncode == ExitCode.AWS, done.stderr
        assert "local up takes the developer keys local/local: export AWS_ACCESS_KEY_ID=local" in done.stderr
    cloud = loadtest_here(tmp_path, "sagemaker://servestack-digits-realtime", *data, env=env)
    assert cloud.returncode == ExitCode.AWS
    assert "run `aws configure`" in cloud.stderr
    assert "local/local" not in cloud.stderr


def test_the_plots_percentile_labels_do_not_overlap() -> None:
    import matplotlib.pyplot  # here, not at collection: every worker collects this module
    import matplotlib.text

    # GIVEN latencies whose p50 and p99 are a hair apart (the case where labels at the lines overlapped)
    samples = [Sample(i / 1000, 0.0100 + (i % 100) * 1e-7, 200) for i in range(2000)]
    figure = draw(samples, "http://127.0.0.1:8080/invocations - closed loop, 64 connections")
    try:
        figure.canvas.draw()
        renderer = figure.canvas.get_renderer()  # type: ignore[attr-defined]
        histogram = figure.axes[1]
        texts = [t for t in histogram.findobj(matplotlib.text.Text) if t.get_visible() and t.get_text().strip()]
        names = [t.get_text() for t in texts]
        # THEN both percentiles are named, and no two texts of the histogram overlap
        assert any(n.startswith("p50 ") for n in names), names
        assert any(n.startswith("p99 ") for n in names), names
        boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
        for index, (first, a) in enumerate(boxes):
            for second, b in boxes[index + 1 :]:
                assert not a.overlaps(b), (first, second)
    finally:
        matplotlib.pyplot.close(figure)
