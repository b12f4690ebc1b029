"""The realtime container against clients that stall, oversend or encode: the real `serve` process, real sockets.

A client that stalls mid-body holds a connection until the read deadline, never an admission slot; a body over
the limit is answered 413 even to a client that sends it all before reading (urllib); `Content-Encoding` is
decoded with a bound or refused."""

from __future__ import annotations

import functools
import gzip
import io
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest

from servestack.inference import codecs, media_types
from tests.conftest import ARTIFACTS, RealtimeServer
from tests.waiting import DEADLINE_SEC, unread_bytes, wait_for

pytestmark = pytest.mark.slow
SAMPLE = (ARTIFACTS / "digits" / "1" / "sample-request.json").read_bytes()
# Long enough that a caller served while the stalled uploads wait is served before any of their deadlines, however
# busy the machine (the test waits this long for their 408s).
READ_TIMEOUT_SEC = 5


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealtimeServer]:
    started = RealtimeServer.start(
        tmp_path_factory.mktemp("hostile"), env={"SERVESTACK_BODY_READ_TIMEOUT_SEC": str(READ_TIMEOUT_SEC)}
    )
    yield started
    started.stop()


def stalled_upload(url: str) -> socket.socket:
    """Headers that promise 1,000 bytes of body, then one byte, then nothing."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(
        b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
    )
    return sock


def read_status(sock: socket.socket, timeout_sec: float) -> int | None:
    sock.settimeout(timeout_sec)
    try:
        head = sock.recv(4096)
    except (TimeoutError, OSError):
        return None
    return int(head[9:12]) if head.startswith(b"HTTP/1.1 ") else None


def answered(sock: socket.socket) -> bool:
    """Whether the server has answered on (or closed) this connection yet; nothing is taken off it."""
    try:
        sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return False
    return True


def all_read_by_the_server(server: RealtimeServer, socks: list[socket.socket]) -> bool:
    """Whether the server has read everything these connections sent (it is waiting for the rest of each body)."""
    port = server.child.port
    return all(unread_bytes(port, sock.getsockname()[1]) == 0 for sock in socks)


def test_64_stalled_uploads_do_not_lock_out_a_well_behaved_caller(server: RealtimeServer) -> None:
    # GIVEN 64 connections (as many as the worker has admission slots) that sent headers and one body byte, all
    # of it read by the server, which waits for the rest of each body
    stalled = [stalled_upload(server.url) for _ in range(64)]
    try:
        wait_for(lambda: all_read_by_the_server(server, stalled), "the server to read the 64 stalled uploads")
        # WHEN a well-behaved caller sends a whole request
        answer = httpx.post(f"{server.url}/invocations", content=SAMPLE, timeout=DEADLINE_SEC)
        # THEN it is served while every stalled upload still waits for its answer: the stalled reads hold
        # connections, not slots (a slot held by one would be freed only by its read deadline, which answers it)
        assert answer.status_code == 200, answer.text
        assert not any(answered(sock) for sock in stalled), "a stalled upload was answered before the caller"
        # AND each stalled upload is answered 408 once its read deadline has passed
        deadline = time.monotonic() + READ_TIMEOUT_SEC + DEADLINE_SEC
        statuses = [read_status(sock, max(0.1, deadline - time.monotonic())) for sock in stalled]
        assert statuses == [408] * 64
    finally:
        for sock in stalled:
            sock.close()
    assert httpx.post(f"{server.url}/invocations", content=SAMPLE).status_code == 200


def test_a_body_over_the_limit_reaches_urllib_as_413(server: RealtimeServer) -> None:
    # GIVEN 7 MiB (the limit is 6 MiB), sent by urllib, which writes the whole body before reading anything
    body = b" " * (7 * 1024 * 1024)
    request = urllib.request.Request(
        f"{server.url}/invocations", data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    # WHEN it is sent THEN the answer is the JSON 413, not a reset connection
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=30)
    with caught.value as answer:
        assert answer.code == 413
        assert json.loads(answer.read())["error"]["type"] == "PayloadTooLarge"


def test_a_chunked_body_over_the_limit_reaches_urllib_as_413(server: RealtimeServer) -> None:
    # GIVEN a chunked body (no Content-Length) that passes the limit only as it arrives
    def chunks() -> Iterator[bytes]:
        for _ in range(7):
            yield b" " * (1024 * 1024)

    request = urllib.request.Request(
        f"{server.url}/invocations",
        data=chunks(),
        headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=30)
    with caught.value as answer:
        assert answer.code == 413


def test_a_chunked_body_within_the_limit_gets_the_same_answer_as_a_declared_one(server: RealtimeServer) -> None:
    # GIVEN the sample sent with a Content-Length, and the same bytes sent chunked (read chunk by chunk)
    def chunks() -> Iterator[bytes]:
        for start in range(0, len(SAMPLE), 64):
            yield SAMPLE[start : start + 64]

    declared = httpx.post(f"{server.url}/invocations", content=SAMPLE, headers={"Content-Type": "application/json"})
    # WHEN the chunked one is sent
    chunked = httpx.post(f"{server.url}/invocations", content=chunks(), headers={"Content-Type": "application/json"})
    # THEN both are answered 200 with the same predictions
    assert declared.status_code == 200, declared.text
    assert chunked.status_code == 200, chunked.text
    assert chunked.json() == declared.json()


def test_callers_that_hang_up_mid_body_leave_the_worker_serving(server: RealtimeServer) -> None:
    # GIVEN callers that hang up halfway through a declared body, a chunked body, and a refused-then-drained one
    host, port = server.url.removeprefix("http://").split(":")
    heads = [
        b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n{",
        b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Transfer-Encoding: chunked\r\n\r\n10\r\n{"instances": [[\r\n',
        b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 7340032\r\n\r\n",
        b"POST /v1/models/digits/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 900\r\n\r\n[",
    ]
    for _ in range(5):
        for head in heads:
            sock = socket.create_connection((host, int(port)))
            sock.sendall(head)
            # (the caller goes once the server has read what it sent: the worker is inside the body read)
            wait_for(functools.partial(all_read_by_the_server, server, [sock]), "the server to read the head")
            sock.close()
    # WHEN a well-behaved caller follows them
    answer = httpx.post(f"{server.url}/invocations", content=SAMPLE, headers={"Content-Type": "application/json"})
    # THEN the same worker answers it, and is ready
    assert answer.status_code == 200, answer.text
    assert httpx.get(f"{server.url}/ping").status_code == 200


def test_gzip_is_decoded_with_a_bound_and_other_codings_are_415(server: RealtimeServer) -> None:
    # GIVEN the sample gzipped, a gzip bomb (50 MB of spaces in ~50 KB) and a coding the server does not read
    plain = httpx.post(f"{server.url}/invocations", content=SAMPLE).json()
    zipped = httpx.post(
        f"{server.url}/invocations", content=gzip.compress(SAMPLE), headers={"Content-Encoding": "gzip"}
    )
    bomb = httpx.post(
        f"{server.url}/invocations",
        content=gzip.compress(b" " * 50_000_000),
        headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
    )
    brotli = httpx.post(f"{server.url}/invocations", content=SAMPLE, headers={"Content-Encoding": "br"})
    # THEN the gzipped sample predicts what the plain one does, the bomb is 413, and br is 415 naming the header
    assert zipped.status_code == 200
    assert zipped.json() == plain
    assert bomb.status_code == 413
    assert brotli.status_code == 415
    assert brotli.json()["error"]["field"] == "Content-Encoding"


def test_an_accept_with_q_0_for_every_writable_type_is_406(server: RealtimeServer) -> None:
    refused = httpx.post(f"{server.url}/invocations", content=SAMPLE, headers={"Accept": "application/json;q=0"})
    preferred = httpx.post(
        f"{server.url}/invocations", content=SAMPLE, headers={"Accept": "application/json;q=0.1, text/csv"}
    )
    assert refused.status_code == 406
    assert preferred.status_code == 200
    assert preferred.headers["content-type"] == "text/csv"


def test_error_bodies_name_no_server_path(tmp_path: Path) -> None:
    # GIVEN a server whose model package fails its checksum (the failure message names the file's path)
    import shutil

    models = tmp_path / "models"
    shutil.copytree(ARTIFACTS / "digits", models / "digits")
    (models / "digits" / "1" / "model.onnx").write_bytes(b"tampered")
    failed = RealtimeServer.start(tmp_path, env={"SERVESTACK_MODEL_DIR": str(models)}, wait_ready=False)
    try:
        ping = wait_for(failed.ping_once_loaded, "the model's load to end")
        answer = httpx.post(f"{failed.url}/invocations", content=SAMPLE)
        # THEN neither /ping nor the invocation reveals where the server keeps its models
        for text in (ping.text, answer.text):
            assert str(tmp_path) not in text
            assert "sha256 mismatch" in text
        assert str(tmp_path) in failed.log_path.read_text()  # the operator's log keeps it
    finally:
        failed.stop()


# ------------------------------------------------------------------------------------------ on both HTTP servers
# The requests below were answered 500 (or by the wrong model) on one server or both; each server runs them.


@pytest.fixture(scope="module", params=["granian", "uvicorn"])
def either_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealtimeServer]:
    started = RealtimeServer.start(
        tmp_path_factory.mktemp("hostile-both"), env={"SERVESTACK_HTTP_SERVER": request.param}
    )
    yield started
    started.stop()


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


FLOAT_DESCRIPTORS = sorted(descr for descr in codecs.NPY_DTYPES if descr[1] == "f")


def test_npy_bodies_of_every_float_dtype_and_byte_order_are_answered(either_server: RealtimeServer) -> None:
    # GIVEN the sample's rows as .npy of every float dtype the codec accepts, in both byte orders
    rows = np.asarray(json.loads(SAMPLE)["instances"], dtype=np.float16)  # pixel values 0..16: exact in every width
    assert {descr[0] for descr in FLOAT_DESCRIPTORS} == {"<", ">"}
    assert len(FLOAT_DESCRIPTORS) == 6
    expected = httpx.post(f"{either_server.url}/invocations", content=SAMPLE).json()
    for descr in FLOAT_DESCRIPTORS:
        # WHEN each is sent THEN it predicts what the JSON sample predicts
        answer = httpx.post(
            f"{either_server.url}/invocations",
            content=npy(rows.astype(descr)),
            headers={"Content-Type": media_types.NPY},
        )
        assert answer.status_code == 200, (descr, answer.text)
        assert answer.json() == expected, descr
        # AND an infinity in it is a 400 naming the value's place, not a 500
        infinite = rows.astype(descr)
        infinite[1, 3] = np.inf
        refused = httpx.post(
            f"{either_server.url}/invocations", content=npy(infinite), headers={"Content-Type": media_types.NPY}
        )
        assert refused.status_code == 400, (descr, refused.text)
        assert refused.json()["error"]["field"] == "body[1][3]"


def raw_request(url: str, head: bytes, body: bytes) -> tuple[int, bytes]:
    """One request written byte for byte (httpx would refuse a non-ASCII header), and its status and body."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head + b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


@pytest.mark.parametrize("value", [b"dig\xe9its", b"\xe9", b"digits\x80"])
def test_a_non_ascii_target_model_header_is_refused_with_400(either_server: RealtimeServer, value: bytes) -> None:
    # GIVEN a prediction whose X-Amzn-SageMaker-Target-Model holds a byte outside ASCII
    head = b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    status, body = raw_request(either_server.url, head + b"X-Amzn-SageMaker-Target-Model: " + value + b"\r\n", SAMPLE)
    # THEN it is a 400 naming the header, never the default model's 200
    assert status == 400, body
    assert orjson.loads(body)["error"]["field"] == "target model"
    # AND the same request naming the model in ASCII is served
    status, body = raw_request(either_server.url, head + b"X-Amzn-SageMaker-Target-Model: digits\r\n", SAMPLE)
    assert status == 200, body
