"""Reading an ASGI request body with a size limit and a deadline: the one reader of every ASGI front
(servestack/adapters/app.py, the local endpoint router in servestack/local/sagemaker/router.py, and local
mode's fronts in servestack/local/hosting/http_server.py).

- Size: a declared `Content-Length` over the limit is refused before any byte is read; a chunked body is
  refused as soon as it passes the limit. Either way the 413 is sent only after the rest of the body has
  been drained (discarded, up to `DRAIN_BYTES`): a client that sends its whole body before reading, as
  Python's urllib does with `Connection: close`, would otherwise see its connection reset instead of the
  answer, because a socket closed with unread data is reset. A request with `Expect: 100-continue` has
  sent no body yet and is answered at once.
- Time: a read that has not finished `timeout_sec` after it started is abandoned with 408. Deadlines cost
  no timer per request (`asyncio.timeout` arms and cancels one for every read, several times the cost of
  the read itself on the hot path): reads register their task in `ReadDeadlines`, and one sweep every
  quarter deadline (at most every second) cancels the reads past theirs.
"""

from __future__ import annotations

import asyncio
import mmap
import tempfile
from collections.abc import Awaitable, Callable, MutableMapping
from typing import IO, Any, Protocol

from servestack.inference.errors import PayloadTooLarge, RequestTimeout

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]

# How much of a refused body is read and thrown away so that the client sees the answer (16 MiB: a body a
# few MiB over a 6 MiB limit is drained; a 300 MB one is not, and that client may see a reset).
DRAIN_BYTES = 16 * 1024 * 1024


# A body declared larger than this is written to an unnamed temporary file as it arrives, never held whole in
# memory (only SageMaker async, at up to 1 GiB, sends such bodies: every other engine's limit is 6 MiB or less, so
# a realtime request never comes here, and pays one comparison of its declared length).
SPOOL_BYTES = 16 * 1024 * 1024


class SpooledBody:
    """A request body in an unnamed temporary file (gone once closed and unmapped). `mapped()` is the file as
    read-only memory: its pages are the page cache's, read from disk when touched and dropped by the kernel
    under pressure, so an `.npy` body decoded in place costs no anonymous memory for its bytes."""

    __slots__ = ("_file", "size")

    def __init__(self, file: IO[bytes], size: int) -> None:
        self._file = file
        self.size = size

    def __len__(self) -> int:
        return self.size

    def mapped(self) -> mmap.mmap:
        """The body as read-only memory; the file closes here, the mapping keeps it until it is collected."""
        try:
            return mmap.mmap(self._file.fileno(), self.size, access=mmap.ACCESS_READ)
        finally:
            self._file.close()

    def read_all(self) -> bytes:
        """The body in memory, for the forms that are parsed rather than viewed (JSON, CSV, encoded bodies)."""
        try:
            self._file.seek(0)
            return self._file.read()
        finally:
            self._file.close()

    def close(self) -> None:
        self._file.close()


async def spool_body(receive: Receive, limit: int, deadlines: ReadDeadlines) -> SpooledBody:
    """The body from `receive`, chunk by chunk, into a temporary file; the limit and the deadline as `read_body`'s.
    The file lives in the temporary directory (SageMaker: the instance's storage volume)."""
    file = tempfile.TemporaryFile(buffering=0)  # noqa: SIM115 - handed over to SpooledBody, which closes it
    size = 0
    task = deadlines.begin()
    try:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnected
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                deadlines.end(task)
                task = None
                if message.get("more_body", False):
                    await drain_body(receive, DRAIN_BYTES, deadlines)
                raise too_large(limit, f"> {limit}")
            file.write(chunk)
            if not message.get("more_body", False):
                return SpooledBody(file, size)
    except asyncio.CancelledError:
        file.close()
        if deadlines.timed_out(task):
            raise too_slow(deadlines) from None
        raise
    except BaseException:
        file.close()
        raise
    finally:
        deadlines.end(task)


class ClientDisconnected(Exception):
    """The caller went away before sending its whole body; nobody is left to answer."""


class ReadDeadlines:
    """Body-read deadlines of one event loop's requests, enforced by a periodic sweep (see the module doc)."""

    def __init__(self, timeout_sec: float) -> None:
        self.timeout_sec = timeout_sec
        self._reading: dict[asyncio.Task[Any], float] = {}
        self._expired: set[asyncio.Task[Any]] = set()
        self._sweeper: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def begin(self) -> asyncio.Task[Any] | None:
        """Start the clock for the current task's read; pair with `end(task)` in a `finally`."""
        # With the loop it ran on last time, `current_task` skips `get_running_loop` (a getpid system call per
        # call on Python 3.11); a task of another loop (Lambda's next invocation) is found the usual way.
        task = asyncio.current_task(self._loop) if self._loop is not None else None
        if task is None:
            task = asyncio.current_task()
            if task is None:
                return None
        loop = task.get_loop()
        self._reading[task] = loop.time() + self.timeout_sec
        if self._sweeper is None or self._loop is not loop:  # Lambda runs each invocation on a fresh loop
            self._loop = loop
            self._sweeper = loop.call_later(self._interval(), self._sweep)
        return task

    def end(self, task: asyncio.Task[Any] | None) -> None:
        if task is not None:
            self._reading.pop(task, None)

    def timed_out(self, task: asyncio.Task[Any] | None) -> bool:
        """Whether the cancellation `task` is seeing came from this sweep; if so it is taken back."""
        if task is None or task not in self._expired:
            return False
        self._expired.discard(task)
        task.uncancel()
        return True

    def _interval(self) -> float:
        return min(1.0, self.timeout_sec / 4)

    def _sweep(self) -> None:
        loop = self._loop
        if loop is None:
            return
        now = loop.time()
        for task, deadline in list(self._reading.items()):
            if deadline <= now:
                del self._reading[task]
                if not task.done():
                    self._expired.add(task)
                    task.cancel()
        self._expired = {task for task in self._expired if not task.done()}
        self._sweeper = loop.call_later(self._interval(), self._sweep) if self._reading else None


def too_large(limit: int, value: int | str) -> PayloadTooLarge:
    if isinstance(value, int) and value >= PAST_ANY_LIMIT:
        value = f">= {PAST_ANY_LIMIT}"
    return PayloadTooLarge(
        f"body of {value} bytes is over the limit" if isinstance(value, int) else "body is over the limit",
        field="body",
        value=value,
        allowed=f"<= {limit} bytes",
    )


async def read_body(
    receive: Receive,
    limit: int,
    declared_length: str | bytes | None,
    deadlines: ReadDeadlines,
    *,
    expect_continue: bool = False,
) -> bytes:
    """The whole body, at most `limit` bytes, read before `deadlines.timeout_sec` passes. Raises
    `PayloadTooLarge` (after draining), `RequestTimeout`, or `ClientDisconnected`."""
    declared = declared_size(declared_length)
    if declared is not None and declared > limit:
        if not expect_continue and declared - limit <= DRAIN_BYTES:
            await drain_body(receive, declared, deadlines)
        raise too_large(limit, declared)
    task = deadlines.begin()
    try:
        message = await receive()
        if not message.get("more_body", False) and message["type"] == "http.request":  # the whole body at once
            body: bytes = message.get("body", b"")
            if len(body) > limit:
                raise too_large(limit, len(body))
            return body
        chunks: list[bytes] = []
        size = 0
        while True:
            if message["type"] == "http.disconnect":
                raise ClientDisconnected
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                deadlines.end(task)
                task = None
                if message.get("more_body", False):
                    await drain_body(receive, DRAIN_BYTES, deadlines)
                raise too_large(limit, f"> {limit}")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)
            message = await receive()
    except asyncio.CancelledError:
        if deadlines.timed_out(task):
            raise too_slow(deadlines) from None
        raise
    finally:
        deadlines.end(task)


async def read_asgi_body(
    receive: Receive, headers: list[tuple[bytes, bytes]], limit: int, deadlines: ReadDeadlines
) -> bytes:
    """`read_body` for a raw ASGI request, its declared length and `Expect` taken from the scope's headers
    (the fronts of local mode and the endpoint router)."""
    return await read_body(
        receive,
        limit,
        next((value for name, value in headers if name == b"content-length"), None),
        deadlines,
        expect_continue=any(name == b"expect" for name, _ in headers),
    )


def too_slow(deadlines: ReadDeadlines) -> RequestTimeout:
    return RequestTimeout(
        f"the body did not arrive within {deadlines.timeout_sec:g}s",
        field="body",
        value=f"{deadlines.timeout_sec:g}s",
        allowed=f"a whole body within {deadlines.timeout_sec:g}s (SERVESTACK_BODY_READ_TIMEOUT_SEC)",
    )


async def drain_body(receive: Receive, max_bytes: int, deadlines: ReadDeadlines) -> None:
    """Read and discard what is left of the body (up to `max_bytes`, within the read deadline), so that an
    answer sent before it was read reaches a client still sending it. Never raises for the body's sake."""
    task = deadlines.begin()
    drained = 0
    try:
        while drained <= max_bytes:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                return
            drained += len(message.get("body", b""))
    except asyncio.CancelledError:
        if not deadlines.timed_out(task):
            raise
    finally:
        deadlines.end(task)


class RequestHeaders(Protocol):
    """A request's headers by lower-case name: a dict, granian's RSGI headers, or Starlette's."""

    def get(self, key: str, /) -> str | None: ...

    def __contains__(self, key: str, /) -> bool: ...


def declared_size(value: str | bytes | None) -> int | None:
    """A Content-Length's value as a number, or None when there is none or it is not one: ASCII digits only (a
    str's `isdigit` also takes "²", which `int` refuses). A value of more than 18 digits (leading zeros aside)
    is past any limit, and is never given to `int` (which refuses 5,000 digits with a ValueError): it reads as
    `PAST_ANY_LIMIT`."""
    if value is None or not value.isascii() or not value.isdigit():
        return None
    if len(value) > _LENGTH_DIGITS:  # `int` counts leading zeros towards its limit too
        value = (value.lstrip(b"0") or b"0") if isinstance(value, bytes) else (value.lstrip("0") or "0")
        if len(value) > _LENGTH_DIGITS:
            return PAST_ANY_LIMIT
    return int(value)


_LENGTH_DIGITS = 18
PAST_ANY_LIMIT = 10**18


class BodySource(Protocol):
    """Where a prediction route reads its body from: ASGI's `receive` (`ASGIBody`), or granian's RSGI protocol
    (servestack/adapters/rsgi.py), which hands over a declared body in one call. Same limits, deadlines and errors."""

    def read(
        self, limit: int, declared_length: str | None, deadlines: ReadDeadlines, *, expect_continue: bool = False
    ) -> Awaitable[bytes | SpooledBody]:
        """`read_body`'s contract; a body declared larger than `SPOOL_BYTES` (and within the limit) is spooled."""

    def drain(self, max_bytes: int, deadlines: ReadDeadlines) -> Awaitable[None]:
        """`drain_body`'s contract."""


class ASGIBody:
    """`BodySource` over ASGI's `receive`: `read_body` and `drain_body` themselves (their coroutines are
    returned, not wrapped in another)."""

    __slots__ = ("receive",)

    def __init__(self, receive: Receive) -> None:
        self.receive = receive

    def read(
        self, limit: int, declared_length: str | None, deadlines: ReadDeadlines, *, expect_continue: bool = False
    ) -> Awaitable[bytes | SpooledBody]:
        declared = declared_size(declared_length)
        if declared is not None and SPOOL_BYTES < declared <= limit:
            return spool_body(self.receive, limit, deadlines)
        return read_body(self.receive, limit, declared_length, deadlines, expect_continue=expect_continue)

    def drain(self, max_bytes: int, deadlines: ReadDeadlines) -> Awaitable[None]:
        return drain_body(self.receive, max_bytes, deadlines)
