"""A serving container's capture lines, written in bursts that never stall its event loop (`LineBursts`).

A line waits at most `FLUSH_AFTER_SEC`, or until `FLUSH_BYTES` of lines wait, and goes out with the others in writes
of whole lines of at most `select.PIPE_BUF` bytes each (a longer line alone): the workers of a container share its
stdout, and a write up to PIPE_BUF is not interleaved with another's, so CloudWatch takes each line as one event.
A pipe's reader (the container's log driver) wakes once a burst rather than once a line, and that wake-up is
most of what a write costs its writer: 1 KB lines to a pipe drained on another core cost 4.9-6.7 µs of system CPU
a line written alone, 2.8-3.2 in writes of 3 lines and 0.65-1.0 in bursts (`python -m bench.pipe_writes`).

stdout is the container's pipe, and a write to a full pipe blocks until its reader drains it: the event loop
that answers every request would then stop. Under load, with the log driver's core busy, bursts took a median
0.17 ms and a p99 of 6.1 ms in the capture bench (docs/performance.md, "Data capture at 100%"), which was most
of capture's cost to the p99 latency. So where stdout is a pipe, a burst asks it first how much it takes now
(`PipeSpace`), writes what it takes, and keeps the rest for a moment later, in order; the pipe is also widened to 1 MiB
(Linux's `pipe-max-size` by default), so that its reader's hiccups are absorbed rather than waited for. Only past
`MAX_CARRY_BYTES` kept, or at shutdown, does a burst wait for the pipe: capture records are never dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import select
import stat
from collections.abc import Callable

FLUSH_AFTER_SEC = 0.05
# 64 KiB is Linux's default pipe capacity: a burst fits in a drained pipe of the default size.
FLUSH_BYTES = 64 * 1024
# What a pipe could not take yet is offered again this soon, and at most this much is kept before a burst waits.
RETRY_AFTER_SEC = 0.005
MAX_CARRY_BYTES = 16 * 1024 * 1024
WANTED_PIPE_BYTES = 1024 * 1024


class PipeSpace:
    """Whether a pipe takes a write of at most PIPE_BUF bytes now without blocking. Linux keeps a pipe's bytes in a
    ring of pages and reports it writable (POLLOUT) while a page is free; a write of at most a page fills the last
    page's room and takes at most that one page more. (Counting the unread bytes instead, with FIONREAD, misjudges
    how many pages they take: a page holds only as much as the writes that filled it, and a hang in a test showed
    it.) Another worker's write may take the page between the question and the write: that write then waits for
    the reader as every write did before."""

    def __init__(self, fd: int) -> None:
        self._poll = select.poll()
        self._poll.register(fd, select.POLLOUT)

    @classmethod
    def of(cls, fd: int) -> PipeSpace | None:
        """The space of `fd` where it is a pipe on Linux (widened to `WANTED_PIPE_BYTES` where allowed), else None:
        a file or a terminal takes a write without waiting on a reader."""
        getter, setter = getattr(fcntl, "F_GETPIPE_SZ", None), getattr(fcntl, "F_SETPIPE_SZ", None)
        try:
            if getter is None or setter is None or not stat.S_ISFIFO(os.fstat(fd).st_mode):
                return None
            if fcntl.fcntl(fd, getter) < WANTED_PIPE_BYTES:
                with contextlib.suppress(OSError):  # past this user's pipe limits: the pipe keeps its size
                    fcntl.fcntl(fd, setter, WANTED_PIPE_BYTES)
            return cls(fd)
        except OSError:
            return None

    def takes_a_write(self) -> bool:
        return bool(self._poll.poll(0))


class LineBursts:
    """The lines of one serving process on `loop`, written by `write` in bursts (the module's docstring). `space`:
    what the pipe `write` writes to takes now (None: never ask; a file, a test's list)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, write: Callable[[bytes], object], space: PipeSpace | None
    ) -> None:
        self._loop, self._write, self._space = loop, write, space
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._carry = b""  # the bytes of whole lines a pipe could not take yet, written before any newer line
        self._timer: asyncio.TimerHandle | None = None

    @classmethod
    def to_fd(cls, loop: asyncio.AbstractEventLoop, fd: int) -> LineBursts:
        def write(data: bytes) -> None:
            os.write(fd, data)  # a pipe takes a write of at most PIPE_BUF whole

        return cls(loop, write, PipeSpace.of(fd))

    def add(self, line: bytes) -> None:
        self._pending.append(line)
        self._pending_bytes += len(line)
        if self._pending_bytes >= FLUSH_BYTES:
            self.flush()
        elif self._timer is None:
            self._timer = self._loop.call_later(FLUSH_AFTER_SEC, self.flush)

    def flush(self, *, wait: bool = False) -> None:
        """Write what waits, as much as the pipe takes now (all of it with `wait`, or past `MAX_CARRY_BYTES`)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        data = self._carry + b"".join(pending) if self._carry else b"".join(pending)
        space = None if wait or len(data) > MAX_CARRY_BYTES else self._space
        # The lines cut at the last line's end within each PIPE_BUF (a longer line alone): a search per write.
        start, size = 0, len(data)
        while start < size:
            if space is not None and not space.takes_a_write():
                break
            end = start + select.PIPE_BUF
            if end < size:
                cut = data.rfind(b"\n", start, end)
                end = cut + 1 if cut >= start else data.index(b"\n", start) + 1
            self._write(data[start:end])
            start = end
        self._carry = data[start:]
        if self._carry:
            self._timer = self._loop.call_later(RETRY_AFTER_SEC, self.flush)
