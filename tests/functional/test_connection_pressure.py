"""Connection pressure:
- on `serve` (granian), idle connections are bounded by a header-read timeout and a connection cap far above
  what an idle crowd of callers holds, so 5,000 idle sockets do not delay a normal caller, and a connection that
  sends nothing is closed once the header-read timeout passes;
- the threaded local fronts listen with a real backlog, so a burst of callers is queued, not dropped;
- the endpoint router sheds a pipelined flood with 429 once its own queue is full."""

from __future__ import annotations

import json
import resource
import socket
import statistics
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from servestack.local.hosting.http_server import LocalHttpServer, Reply
from tests.conftest import ARTIFACTS, RealtimeServer
from tests.control import control
from tests.functional.test_router import RouterProcess
from tests.waiting import accept_queue, wait_for

SAMPLE = json.loads((ARTIFACTS / "digits" / "1" / "sample-request.json").read_text())["instances"]
IDLE_CONNECTIONS = 5_000
MOST_EXTRA_DELAY_SEC = 0.100


@pytest.fixture
def many_descriptors() -> Iterator[None]:
    """The test process holds 5,000 sockets (and the server inherits the raised limit, as a container's does)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = IDLE_CONNECTIONS * 2 + 1_000
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {wanted}: cannot hold {IDLE_CONNECTIONS} idle sockets")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def ping_seconds(port: int, timeout_sec: float = 10.0) -> float:
    """One `GET /ping` on a fresh connection, as a new caller makes it; the seconds until the whole answer."""
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_sec) as sock:
        sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    elapsed = time.perf_counter() - started
    assert answer.startswith(b"HTTP/1.1 200"), answer[:100]
    return elapsed


def test_five_thousand_idle_connections_do_not_delay_a_normal_caller(tmp_path: Path, many_descriptors: None) -> None:
    server = RealtimeServer.start(tmp_path)
    idle: list[socket.socket] = []
    try:
        port = server.child.port
        baseline = statistics.median(ping_seconds(port) for _ in range(5))
        # GIVEN 5,000 connections that send nothing
        for _ in range(IDLE_CONNECTIONS):
            sock = socket.socket()
            idle.append(sock)
            sock.settimeout(5)
            sock.connect(("127.0.0.1", port))
        # ...every one of them accepted: the server holds them all, none is left in the kernel's accept queue
        wait_for(lambda: accept_queue(port) == 0, f"the server to accept the {IDLE_CONNECTIONS} connections")
        # WHEN a normal caller makes requests THEN none waits more than 100 ms longer than without the crowd
        loaded = [ping_seconds(port) for _ in range(5)]
        print(
            f"baseline {baseline * 1e3:.1f} ms; with {IDLE_CONNECTIONS} idle: {[round(s * 1e3, 1) for s in loaded]} ms"
        )
        assert max(loaded) - baseline <= MOST_EXTRA_DELAY_SEC, (baseline, loaded)
    finally:
        for sock in idle:
            sock.close()
        server.stop()


def test_idle_and_slow_connections_are_closed_after_the_header_read_timeout(tmp_path: Path) -> None:
    server = RealtimeServer.start(tmp_path, env={"SERVESTACK_HEADER_READ_TIMEOUT_SEC": "1"})
    port = server.child.port
    try:
        for sent in (b"", b"GET /ping HTTP/1.1\r\nHo", b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n"):
            # GIVEN a connection that sends nothing, half a request head, or one request and then nothing
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(sent)
                if sent.endswith(b"\r\n\r\n"):
                    assert sock.recv(65536).startswith(b"HTTP/1.1 200")
                started = time.perf_counter()
                # THEN the server closes it (an empty read) once the timeout passes, instead of holding it
                assert sock.recv(1024) == b"", sent
                assert time.perf_counter() - started < 5, sent
    finally:
        server.stop()


# ------------------------------------------------------------------------------------------ the threaded fronts


def test_a_threaded_front_queues_a_burst_of_callers_while_it_is_busy() -> None:
    # GIVEN a local front (the AWS API port, the HTTP API fronts) that has not accepted anyone yet, as while its
    # accept thread is busy
    front = LocalHttpServer("burst", lambda request: Reply(200, {}, b"ok"))
    sockets: list[socket.socket] = []
    try:
        # WHEN 200 callers connect at once THEN the kernel queues every one of them (a backlog of 5 would drop
        # the SYNs past the sixth, and their connects would time out)
        for _ in range(200):
            sock = socket.socket()
            sockets.append(sock)
            sock.settimeout(0.5)
            sock.connect(("127.0.0.1", front.port))
        front.serve_in_background()
        sockets[-1].settimeout(10)
        sockets[-1].sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert sockets[-1].recv(1024).startswith(b"HTTP/1.1 200")
    finally:
        for sock in sockets:
            sock.close()
        front.close()


# ------------------------------------------------------------------------------------------ the router


def pipelined_flood(url: str, connections: int, depth: int) -> Counter[int]:
    """`connections` callers each send `depth` requests back to back on one connection (HTTP/1.1 pipelining)
    before reading any answer; every answer's status is counted (each must come)."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"instances": SAMPLE[:1]}).encode()
    head = "POST /invocations HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
    one = f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body
    statuses: Counter[int] = Counter()

    def caller() -> list[int]:
        with socket.create_connection((host, int(port)), timeout=60) as sock:
            sock.sendall(one * depth)
            reader = sock.makefile("rb")
            found = []
            for _ in range(depth):
                status_line = reader.readline()
                length = 0
                while (line := reader.readline()) not in (b"\r\n", b""):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                reader.read(length)
                found.append(int(status_line[9:12]))
            return found

    with ThreadPoolExecutor(connections) as pool:
        for answered in pool.map(lambda _: caller(), range(connections)):
            statuses.update(answered)
    return statuses


@pytest.mark.slow
def test_the_router_answers_429_when_its_own_queue_is_full(tmp_path: Path) -> None:
    primary = {"name": "primary", "model": "digits", "version": "1", "weight": 1,
               "package_dir": str(ARTIFACTS / "digits" / "1")}  # fmt: skip
    router = RouterProcess.start(tmp_path, "digits-rt", [primary], max_in_flight=4)
    try:
        # WHEN 64 callers pipeline 8 requests each at a router that holds 4 at a time
        statuses = pipelined_flood(router.url, connections=64, depth=8)
        print(f"pipelined flood: {dict(statuses)}")
        # THEN every request is answered: served, or shed with 429 (never queued without end)
        assert sum(statuses.values()) == 64 * 8
        assert set(statuses) <= {200, 429}, statuses
        assert statuses[429] > 0
        assert statuses[200] > 0
        metrics = control("GET", f"{router.control_url}/_servestack/metrics").json()
        assert metrics["shed"] == statuses[429]
    finally:
        router.stop()
