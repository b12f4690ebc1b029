"""The endpoint router with an async endpoint's large bodies: it forwards them whole, in slices, over a pooled
connection, and waits for them as long as its containers do."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

from servestack.local.sagemaker.backends import VariantPlan
from servestack.local.sagemaker.endpoint import read_timeout_sec
from servestack.local.sagemaker.upstream import Upstream


async def _digest_server() -> tuple[asyncio.Server, int, asyncio.Event]:
    """A child that answers each request with the SHA-256 of the body it read (by its Content-Length); the event
    is set once its connection is closed."""
    served = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                break
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            digest = hashlib.sha256(await reader.readexactly(length)).hexdigest().encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: " + str(len(digest)).encode() + b"\r\n\r\n" + digest)
            await writer.drain()
        writer.close()
        await writer.wait_closed()
        served.set()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], served


def test_a_body_past_the_slice_size_arrives_whole_and_the_connection_is_reused() -> None:
    async def scenario() -> list[bytes]:
        server, port, served = await _digest_server()
        upstream = Upstream("127.0.0.1", port)
        bodies = [bytes(range(256)) * (5 * 4096 + 3), b"small"]  # 5 MiB and more, in slices; then one write
        try:
            answers = [(await upstream.request("POST", "/invocations", [], body))[2] for body in bodies]
            assert len(upstream._idle) == 1  # one connection, kept for the next request after each answer
            return answers
        finally:
            writers = [writer for _, writer, _ in upstream._idle]
            upstream.close()
            for writer in writers:
                await writer.wait_closed()
            if writers:  # the child's side of that connection closes too
                await asyncio.wait_for(served.wait(), 30)
            server.close()
            await server.wait_closed()

    big, small = asyncio.run(scenario())
    assert big == hashlib.sha256(bytes(range(256)) * (5 * 4096 + 3)).hexdigest().encode()
    assert small == hashlib.sha256(b"small").hexdigest().encode()


def plan(environment: dict[str, str]) -> VariantPlan:
    return VariantPlan("primary", "breast-cancer", "1", 1.0, Path("/nonexistent"), environment)


def test_the_router_waits_for_a_body_as_long_as_its_slowest_container() -> None:
    # An async endpoint's container waits 300 s for a body (the template's environment); a realtime one, its own
    assert read_timeout_sec(10.0, [plan({"SERVESTACK_BODY_READ_TIMEOUT_SEC": "300"}), plan({})]) == 300.0
    assert read_timeout_sec(10.0, [plan({})]) == 10.0
    assert read_timeout_sec(30.0, [plan({"SERVESTACK_BODY_READ_TIMEOUT_SEC": "5"})]) == 30.0
