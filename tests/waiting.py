"""Waiting on what the other side did, not on how long it usually takes.

A test that sleeps a fixed time before it acts assumes the server, child or thread has got somewhere by then;
on a busy machine it has not, and the test fails for no fault of the code. These helpers wait for the event
itself, with a deadline far above what the wait takes on an idle machine, so that a slow machine only makes
the test slower:

- `wait_for`: until a check says yes (a file exists, a log line is written, a counter reaches a value);
- `Gate`: a point in code the test does not run (a model's hook, a child process) that says when it is
  reached and then waits there until the test opens it, so the test acts while the other side is
  provably there, for as long as it needs;
- `accept_queue`, `unread_bytes` and `established_to`: what the kernel says of a local server's sockets
  (/proc/net/tcp), for a test that must know the server has accepted its connections, read what they sent, or
  closed them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

# Far above any wait these tests make on an idle machine (a few seconds at most): reached only when what is
# waited for never happens, and then the test fails saying what it waited for.
DEADLINE_SEC = 60.0


def wait_for(check: Callable[[], T | None], what: str, timeout_sec: float = DEADLINE_SEC, poll_sec: float = 0.02) -> T:
    """The first true value `check` returns, tried every `poll_sec`; AssertionError naming `what` if none comes
    within `timeout_sec`."""
    deadline = time.monotonic() + timeout_sec
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_sec:.0f}s waiting for {what}")
        time.sleep(poll_sec)


def log_says(log: Path, text: str) -> Callable[[], bool]:
    """A check for `wait_for`: whether the file holds `text` yet."""
    return lambda: log.exists() and text in log.read_text(errors="replace")


@dataclass(frozen=True)
class Gate:
    """A point that code in another process reaches and waits at until the test opens it.

    The code says it has arrived by creating the file `reached`, then waits for the file `opened` (at most
    `hold_sec`, so that a test that failed before opening it leaves nothing waiting for ever), then creates
    `left`. Files, so that it works across processes: `source()` is the Python that a model's hook or a child's
    program runs."""

    folder: Path
    name: str
    hold_sec: float = DEADLINE_SEC

    @property
    def reached(self) -> Path:
        return self.folder / f"{self.name}.reached"

    @property
    def opened(self) -> Path:
        return self.folder / f"{self.name}.opened"

    @property
    def left(self) -> Path:
        return self.folder / f"{self.name}.left"

    def source(self, indent: str = "", *, only_with_env: str | None = None) -> str:
        """Python statements (standard library only, each line indented by `indent`) that mark the gate reached
        and wait until it is opened. With `only_with_env`, only a process whose environment sets that variable
        stops at the gate (a server started with it, not the test process, which may import the same hooks to
        build the package)."""
        body = [
            f"_gate_paths.Path({str(self.reached)!r}).touch()",
            f"_gate_until = _gate_time.monotonic() + {self.hold_sec!r}",
            f"while not _gate_paths.Path({str(self.opened)!r}).exists() and _gate_time.monotonic() < _gate_until:",
            "    _gate_time.sleep(0.02)",
            f"_gate_paths.Path({str(self.left)!r}).touch()",
        ]
        if only_with_env is not None:
            body = [f"if _gate_os.environ.get({only_with_env!r}):", *(f"    {line}" for line in body)]
        lines = ["import os as _gate_os, pathlib as _gate_paths, time as _gate_time", *body]
        return "".join(f"{indent}{line}\n" for line in lines)

    def wait_reached(self, timeout_sec: float = DEADLINE_SEC) -> None:
        wait_for(self.reached.exists, f"gate {self.name} to be reached", timeout_sec)

    def is_held(self) -> bool:
        """Whether the code is at the gate now: it has reached it and not left it."""
        return self.reached.exists() and not self.left.exists()

    def open(self) -> None:
        self.opened.touch()


# ------------------------------------------------------------------------------------------ the kernel's view

LISTEN, ESTABLISHED = "0A", "01"  # /proc/net/tcp's states


def _sockets(port: int) -> list[tuple[str, int, int]]:
    """(state, receive queue, remote port) of each IPv4 TCP socket whose local port is `port`. For a listening
    socket the receive queue is its accept queue: connections the kernel has completed that the server has not
    accepted yet (the Recv-Q of `ss -lnt`)."""
    found = []
    for row in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = row.split()
        if int(fields[1].rsplit(":", 1)[1], 16) == port:
            found.append((fields[3], int(fields[4].split(":")[1], 16), int(fields[2].rsplit(":", 1)[1], 16)))
    return found


def accept_queue(port: int) -> int:
    """Connections to the local server listening on `port` that it has not accepted yet."""
    queues = [queue for state, queue, _ in _sockets(port) if state == LISTEN]
    assert queues, f"nothing listens on port {port}"
    return sum(queues)


def unread_bytes(server_port: int, client_port: int) -> int | None:
    """Bytes a local client (its own port `client_port`) sent that have reached the server on `server_port` and
    that the server has not read yet (0: it has read all of them); None when there is no such connection."""
    for state, queue, remote_port in _sockets(server_port):
        if state != LISTEN and remote_port == client_port:
            return queue
    return None


def established_to(port: int) -> int:
    """Open connections whose server end is the local port `port` (its side not yet closed)."""
    return sum(1 for state, _, _ in _sockets(port) if state == ESTABLISHED)
