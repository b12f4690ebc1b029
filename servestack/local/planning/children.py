"""A child of `local up`: a process started, health-checked and stopped, its output pumped to the one tagged
stream, its file and its log group. The service packages plan them; `local up` starts and supervises them."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from servestack.local.hosting import http_status, stop_process
from servestack.local.planning.errors import PlanError

# ------------------------------------------------------------------------------------------ children


def pump(
    tag: str, stream: IO[bytes], out: IO[str], log: Path | None = None, sinks: tuple[Callable[[str], None], ...] = ()
) -> threading.Thread:
    def copy() -> None:
        from servestack.local.logs import LineLog

        sink = LineLog(log) if log is not None else None
        for raw in iter(stream.readline, b""):
            text = raw.decode(errors="replace").rstrip()
            out.write(f"[{tag}] {text}\n")
            out.flush()
            if sink is not None:
                sink.write(text)
            for ship in sinks:  # its CloudWatch Logs group, as its role (servestack/local/logs/shipping.py)
                ship(text)
        stream.close()
        if sink is not None:
            sink.close()

    thread = threading.Thread(target=copy, name=f"log-{tag}", daemon=True)
    thread.start()
    return thread


@dataclass
class Child:
    """A child process local up keeps running: restarted with backoff when it exits."""

    name: str
    argv: list[str]
    env: dict[str, str]
    ready_url: str
    ready_status: int | None = None  # None: any answer means ready
    cwd: Path | None = None  # its working directory (a Lambda's, its code); default local up's own
    process: Any = None
    restarts: int = 0
    started_at: float = 0.0
    next_start: float | None = None
    threads: list[threading.Thread] = field(default_factory=list)
    log_path: Path | None = None  # its own log file (.servestack/logs/<deployment>/<child>.log)
    sinks: list[Callable[[str], None]] = field(default_factory=list)  # where each output line also goes

    def start(self) -> None:
        from servestack.local.hosting import GroupLeader, die_with_parent

        # Its own process group: whatever it forked (a server's workers) is stopped, or killed, with it.
        self.process = GroupLeader(
            self.argv, cwd=self.cwd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
        )  # fmt: skip
        assert self.process.stdout is not None
        self.threads = [pump(self.name, self.process.stdout, sys.stdout, self.log_path, tuple(self.sinks))]
        self.started_at = time.monotonic()
        self.next_start = None

    def ready(self) -> bool:
        status = http_status(self.ready_url)
        return status is not None and (self.ready_status is None or status == self.ready_status)

    def wait_ready(self, timeout_sec: float = 120) -> None:
        deadline = time.monotonic() + timeout_sec
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise PlanError(f"{self.name}: exited with code {self.process.returncode} while starting (see its log)")
            if self.ready():
                return
            time.sleep(0.1)
        raise PlanError(f"{self.name}: not ready after {timeout_sec:.0f}s ({self.ready_url})")

    def stop(self, grace_sec: float = 10.0) -> None:
        if self.process is not None:
            stop_process(self.process, grace_sec)
        for thread in self.threads:
            thread.join(timeout=2)
