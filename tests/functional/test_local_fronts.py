"""The fronts of local mode against hostile bodies: `HttpFront` (API Gateway in front of the serverless and
async-submit functions) and `LocalHttpServer` (the AWS API front, the Lambda Invoke API, the HTTP APIs). Both
are local mode's one HTTP stack (uvicorn, bodies read by servestack/adapters/body.py); each case runs against both, over
real sockets."""

from __future__ import annotations

import hashlib
import itertools
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from servestack.local.hosting.http_server import LocalHttpServer, Reply, Request
from servestack.local.lambda_.runtime import HttpFront, LocalFunction
from tests.waiting import DEADLINE_SEC

LIMIT = 1024 * 1024
Front = tuple[str, Callable[[], None]]


def echo_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """A Lambda handler that answers the sha256 and length of the body it was given."""
    import base64

    raw = event.get("body") or ""
    body = base64.b64decode(raw) if event.get("isBase64Encoded") else raw.encode()
    answer = {"sha256": hashlib.sha256(body).hexdigest(), "bytes": len(body)}
    return {"statusCode": 200, "headers": {"content-type": "application/json"}, "body": json.dumps(answer)}


def echo(request: Request) -> Reply:
    answer = {"sha256": hashlib.sha256(request.body).hexdigest(), "bytes": len(request.body)}
    return Reply(200, {"Content-Type": "application/json"}, json.dumps(answer).encode())


@pytest.fixture(params=["http-front", "local-http-server"])
def front(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "http-front":
        function = LocalFunction("echo", echo_handler, timeout_sec=5)
        http = HttpFront(function, 0, max_body_bytes=LIMIT, body_timeout_sec=1.0)
        http.serve_in_background()
        yield http.url
        http.close()
        function.close()
    else:
        server = LocalHttpServer("echo", echo, max_body_bytes=LIMIT, body_timeout_sec=1.0).serve_in_background()
        yield server.url
        server.close()


def exchange(url: str, raw: bytes, timeout_sec: float = 10) -> tuple[int, bytes]:
    """Send raw bytes, return the status and the whole answer (the front closes after a refusal)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout_sec) as sock:
        sock.sendall(raw)
        received = b""
        while b"\r\n\r\n" not in received or len(received.split(b"\r\n\r\n", 1)[1]) < _length(received):
            data = sock.recv(65536)
            if not data:
                break
            received += data
    return int(received[9:12]), received


def _length(received: bytes) -> int:
    head = received.split(b"\r\n\r\n", 1)[0].lower()
    for line in head.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


def post_head(extra: str) -> bytes:
    return f"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{extra}\r\n".encode()


def test_a_chunked_body_is_read_whole(front: str) -> None:
    # GIVEN a body sent in three chunks
    body = b'{"instances": [[1, 2, 3]]}' * 100
    chunks = [body[:7], body[7:1000], body[1000:]]
    raw = post_head("Transfer-Encoding: chunked\r\n") + b"".join(
        f"{len(c):x}\r\n".encode() + c + b"\r\n" for c in chunks
    )
    status, answer = exchange(front, raw + b"0\r\n\r\n")
    # THEN the function saw exactly that body
    assert status == 200
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1]) == {"sha256": hashlib.sha256(body).hexdigest(), "bytes": 2600}


@pytest.mark.parametrize("length", ["-1", "+5", "0x10", "1 2", "١٢", "99999999999999999999999"])
def test_a_content_length_that_is_not_a_length_is_400_at_once(front: str, length: str) -> None:
    started = time.monotonic()
    status, _ = exchange(front, post_head(f"Content-Length: {length}\r\n"))
    assert status == 400
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    ("framing", "says"),
    [
        ("Content-Length: 0x10\r\n", "Content-Length"),
        ("Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", "Transfer-Encoding"),
        ("Transfer-Encoding: gzip\r\n", "Transfer-Encoding"),
    ],
)
def test_a_request_that_cannot_be_framed_is_a_json_400_saying_why(front: str, framing: str, says: str) -> None:
    status, answer = exchange(front, post_head(framing) + b"0\r\n\r\n")
    assert status == 400
    head, body = answer.split(b"\r\n\r\n", 1)
    assert b"content-type: application/json" in head.lower()
    error = json.loads(body)["error"]
    assert error["field"] == "request framing"
    assert says in error["message"]
    assert "allowed" in error


def test_content_length_and_transfer_encoding_together_are_refused(front: str) -> None:
    raw = post_head("Content-Length: 5\r\nTransfer-Encoding: chunked\r\n") + b"0\r\n\r\n"
    assert exchange(front, raw)[0] == 400


def test_a_declared_100_mb_body_is_refused_before_a_byte_of_it_is_read(front: str) -> None:
    # GIVEN headers announcing 100 MB, and no body at all
    started = time.monotonic()
    status, answer = exchange(front, post_head(f"Content-Length: {100 * 1024 * 1024}\r\n"))
    # THEN the 413 comes at once: nothing waited for, nothing buffered
    assert status == 413
    assert b"Request Entity Too Large" in answer
    assert time.monotonic() - started < 5


def test_an_announced_body_over_the_limit_is_refused_before_100_continue(front: str) -> None:
    status, _ = exchange(front, post_head(f"Content-Length: {2 * LIMIT}\r\nExpect: 100-continue\r\n"))
    assert status == 413


def test_urllib_sending_a_body_over_the_limit_sees_the_413(front: str) -> None:
    # GIVEN urllib, which writes the whole body before it reads the answer
    request = urllib.request.Request(front + "/invocations", data=b" " * (LIMIT + 4096), method="POST")
    # WHEN it sends 4 KiB over the limit THEN it reads a 413, not a reset
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    with caught.value as answer:
        assert answer.code == 413


def test_a_chunked_body_over_the_limit_is_413(front: str) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(3):
            yield b" " * (LIMIT // 2 + 1)

    request = urllib.request.Request(
        front + "/invocations", data=chunks(), method="POST", headers={"Transfer-Encoding": "chunked"}
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    with caught.value as answer:
        assert answer.code == 413


def test_a_body_that_stalls_is_408_after_the_read_deadline(front: str) -> None:
    # GIVEN a client that announces 100 bytes and sends 1 (the fronts' read deadline is 1 s here)
    started = time.monotonic()
    status, _ = exchange(front, post_head("Content-Length: 100\r\n") + b"{")
    # THEN it is answered 408 once the deadline passes, and the front serves the next caller
    assert status == 408
    assert time.monotonic() - started < 5
    status, _ = exchange(front, post_head("Content-Length: 2\r\n") + b"{}")
    assert status == 200


BUSY_TIMEOUT_SEC = 2.0


def test_a_request_waiting_for_a_busy_function_ends_within_the_function_timeout() -> None:
    # GIVEN a function with a 2 s timeout behind one API, whose first run answers at once and whose later runs go
    # on until the test ends (each is cut at the timeout)
    runs = itertools.count()
    busy = threading.Event()
    test_over = threading.Event()

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        if next(runs) > 0:
            busy.set()
            test_over.wait(DEADLINE_SEC)
        return {"statusCode": 200, "body": "done"}

    function = LocalFunction("busy", handler, timeout_sec=BUSY_TIMEOUT_SEC)
    http = HttpFront(function, 0)
    http.serve_in_background()
    outcomes: dict[str, tuple[int, float]] = {}

    def call(caller: str) -> None:
        started = time.monotonic()
        status, _ = exchange(http.url, post_head("Content-Length: 2\r\n") + b"{}", timeout_sec=DEADLINE_SEC)
        outcomes[caller] = (status, time.monotonic() - started)

    try:
        # WHEN a first caller is served, a second one keeps the function's instance busy, and a third one comes
        # while it is busy
        call("first")
        second = threading.Thread(target=call, args=("second",))
        second.start()
        assert busy.wait(DEADLINE_SEC)
        third = threading.Thread(target=call, args=("third",))
        third.start()
        for caller in (second, third):
            caller.join(timeout=DEADLINE_SEC)
    finally:
        test_over.set()
        http.close()
        function.close()
    # THEN the first is served and the second cut at the timeout; the third, which waited for the busy instance,
    # is throttled or timed out within about the timeout: never queued for the second's run and then its own
    # (which would take about twice the timeout)
    assert outcomes["first"][0] == 200
    assert outcomes["second"][0] == 504
    assert outcomes["third"][0] in (429, 504)
    assert max(elapsed for _, elapsed in outcomes.values()) < 1.5 * BUSY_TIMEOUT_SEC, outcomes


def test_the_source_ip_is_the_peer_whatever_x_forwarded_for_says() -> None:
    # GIVEN an API whose function answers the source IP API Gateway gave it
    def source_ip(event: dict[str, Any], context: Any) -> dict[str, Any]:
        return {"statusCode": 200, "body": event["requestContext"]["http"]["sourceIp"]}

    function = LocalFunction("source-ip", source_ip, timeout_sec=5)
    http = HttpFront(function, 0).serve_in_background()
    try:
        # WHEN a local caller claims another address
        status, answer = exchange(http.url, post_head("X-Forwarded-For: 203.0.113.9\r\nContent-Length: 2\r\n") + b"{}")
    finally:
        http.close()
        function.close()
    # THEN the function sees the connection's own address (IAM's aws:SourceIp is read the same way)
    assert status == 200
    assert answer.split(b"\r\n\r\n", 1)[1] == b"127.0.0.1"
