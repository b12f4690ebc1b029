"""The local endpoint router against hostile callers, as `local up` runs it (a real router process, a real
realtime child behind it): request smuggling through an encoded CR/LF, bodies over the limit, a 300 MB body,
and pooled connections the child closed while they were idle."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.conftest import ARTIFACTS
from tests.control import control
from tests.functional.test_router import RouterProcess
from tests.waiting import established_to, wait_for

pytestmark = pytest.mark.slow
SAMPLE = json.loads((ARTIFACTS / "digits" / "1" / "sample-request.json").read_text())["instances"]
LABELS = json.loads((ARTIFACTS / "digits" / "1" / "sample-response.json").read_text())["predictions"]


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProcess]:
    primary = {"name": "primary", "model": "digits", "version": "1", "weight": 1,
               "package_dir": str(ARTIFACTS / "digits" / "1")}  # fmt: skip
    started = RouterProcess.start(tmp_path_factory.mktemp("hostile-router"), "digits-rt", [primary])
    yield started
    started.stop()


def address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def row_request(index: int) -> bytes:
    body = json.dumps({"instances": [SAMPLE[index]]}).encode()
    head = "POST /invocations HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


def read_answer(sock: socket.socket) -> tuple[int, bytes]:
    received = b""
    while b"\r\n\r\n" not in received:
        received += sock.recv(65536)
    head, _, body = received.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return int(head[9:12]), body


def child_port(router: RouterProcess) -> int:
    """The realtime child's port, from its start-up line in the router's log (granian: "Listening at: URL";
    uvicorn: "Uvicorn running on URL")."""
    line = next(
        line
        for line in router.log.read_text().splitlines()
        if "Listening at: http://" in line or "Uvicorn running on" in line
    )
    return int(line.split("http://127.0.0.1:")[1].split()[0])


def smuggling_target(port: int) -> bytes:
    """A percent-encoded path that, decoded into a request line, ends the request and starts a second one
    whose body swallows exactly what a router writes after the path, so the child answers twice."""
    rest = f" HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 2\r\n\r\n{{}}"
    headers = "Host: x\r\nContent-Type: application/json\r\n"
    decoded = (
        f"/invocations HTTP/1.1\r\n{headers}Content-Length: 2\r\n\r\n{{}}"
        f"POST /invocations HTTP/1.1\r\n{headers}Content-Length: {len(rest)}\r\n\r\n"
    )
    return urllib.parse.quote(decoded, safe="/:").encode()


def test_an_encoded_crlf_in_the_path_smuggles_no_second_request(router: RouterProcess) -> None:
    # GIVEN a request whose percent-encoded path spells the end of a request line and a second request
    target = smuggling_target(child_port(router))
    with socket.create_connection(address(router.url), timeout=10) as attacker:
        attacker.sendall(b"POST " + target + b" HTTP/1.1\r\nHost: r\r\nContent-Length: 2\r\n\r\n{}")
        status, _ = read_answer(attacker)
    # THEN that caller is answered once, as a request for a path that does not exist...
    assert 400 <= status < 500
    # ...AND every caller after it, on the router's pooled connections, gets its own answer, in order
    with socket.create_connection(address(router.url), timeout=10) as caller:
        for index in [0, 1, 2, 3, 2, 1, 0, 3] * 3:
            caller.sendall(row_request(index))
            status, body = read_answer(caller)
            assert status == 200, body
            assert json.loads(body)["predictions"] == [LABELS[index]]


def test_a_body_over_the_limit_is_the_routers_413_not_a_variant_5xx(router: RouterProcess) -> None:
    before = control("GET", f"{router.control_url}/_servestack/metrics").json()["variants"]["primary"]
    # GIVEN 7 MiB sent by urllib (the whole body before reading), over the 6 MiB limit
    request = urllib.request.Request(f"{router.url}/invocations", data=b" " * (7 * 1024 * 1024), method="POST")
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=30)
    # THEN the answer is a JSON 413 from the router, and no variant is charged a failure for it
    with caught.value as answer:
        assert answer.code == 413
        assert json.loads(answer.read())["error"]["type"] == "PayloadTooLarge"
    after = control("GET", f"{router.control_url}/_servestack/metrics").json()["variants"]["primary"]
    assert after["errors_5xx"] == before["errors_5xx"]
    assert after["requests"] == before["requests"]


def peak_rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:  # noqa: PTH123
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def test_a_300_mb_body_is_never_buffered(router: RouterProcess) -> None:
    # GIVEN a 300 MB chunked body (no length to refuse it by), sent as fast as the router reads
    peak_before = peak_rss_bytes(router.process.pid)
    chunk = b" " * (1024 * 1024)
    sent = 0
    with socket.create_connection(address(router.url), timeout=30) as sock:
        sock.sendall(b"POST /invocations HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\n\r\n")
        try:
            for _ in range(300):
                sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                sent += len(chunk)
            sock.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # the router answered and closed once past its limit and drain
        sock.settimeout(10)
        try:
            answer = sock.recv(4096)
        except OSError:
            answer = b""
    # THEN it stopped taking the body long before 300 MB, and its peak memory grew by far less than the body
    assert sent < 300 * len(chunk) or answer.startswith(b"HTTP/1.1 413")
    assert peak_rss_bytes(router.process.pid) - peak_before < 64 * 1024 * 1024
    assert httpx.post(f"{router.url}/invocations", json={"instances": [SAMPLE[0]]}).status_code == 200


def test_pooled_connections_the_child_closed_while_idle_are_not_client_failures(router: RouterProcess) -> None:
    # GIVEN several pooled connections to the child (concurrent requests), then idle until the child has closed
    # every one of them (its idle timeout: granian's header-read timeout, 10 s; uvicorn's keep-alive, 5 s)
    def one(_: int) -> int:
        return httpx.post(f"{router.url}/invocations", json={"instances": [SAMPLE[0]]}).status_code

    with ThreadPoolExecutor(8) as pool:
        assert set(pool.map(one, range(32))) == {200}
    port = child_port(router)
    assert established_to(port) > 0
    wait_for(lambda: established_to(port) == 0, "the child to close the router's idle connections", poll_sec=0.2)
    # WHEN requests come again THEN none of them fails
    statuses = [one(i) for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        statuses += list(pool.map(one, range(16)))
    assert statuses == [200] * len(statuses)
