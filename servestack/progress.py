"""Progress of the slow steps of a command (synth, provisioning, children starting, a batch run), on stderr.

On a terminal, a step is one live line drawn by `rich`: a spinner, what is happening and the time so far; it
is replaced by a line saying how the step ended. When stderr is not a terminal (a file, a pipe, CI), or `CI`
is set, or `SERVESTACK_PROGRESS=plain`, a step is plain lines instead: one when it starts, one when its detail
changes, one every `HEARTBEAT_SEC` while it runs, and one when it ends. Nothing goes to stdout, which stays
what scripts read.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

PROGRESS_ENV = "SERVESTACK_PROGRESS"  # "plain": plain lines even on a terminal
HEARTBEAT_SEC = 10.0


def interactive(stream: TextIO) -> bool:
    """Whether `stream` gets live progress: a terminal, outside CI, and not asked for plain lines."""
    if os.environ.get("CI") or os.environ.get(PROGRESS_ENV) == "plain":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or fake stream
        return False


class Step:
    """One running step: `update` its detail while it runs, `finish` with how it ended (else "done")."""

    def __init__(self, title: str, reporter: Progress) -> None:
        self.title = title
        self.detail = ""
        self.outcome = "done"
        self.started = time.monotonic()
        self._reporter = reporter

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def update(self, detail: str) -> None:
        if detail != self.detail:
            self.detail = detail
            self._reporter.changed(self)

    def finish(self, outcome: str) -> None:
        self.outcome = outcome

    def note(self, line: str) -> None:
        """A line that stays (a port that moved, a deployment that failed), printed above the live line."""
        self._reporter.line(line)

    def relay(self, line: str) -> None:
        """Another process's progress line: the live line's detail on a terminal, the line itself otherwise."""
        if self._reporter.live:
            self.detail = line
            self._reporter.changed(self)
        else:
            self._reporter.line(line)


class Progress:
    """Steps reported on `stream` (default stderr): live with rich on a terminal, plain lines otherwise."""

    def __init__(self, stream: TextIO | None = None, *, live: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.live = interactive(self.stream) if live is None else live
        self._lock = threading.Lock()
        self._rich: Any = None
        self._task: Any = None

    @contextmanager
    def step(self, title: str, detail: str = "", *, heartbeat: bool = True) -> Iterator[Step]:
        """A step; `heartbeat`: in plain lines, say every HEARTBEAT_SEC that it still runs."""
        step = Step(title, self)
        step.detail = detail
        stop = threading.Event()
        if self.live:
            self._start_live(step)
        else:
            self._plain(f"{title}{': ' + detail if detail else ''} ...")
            if heartbeat:
                threading.Thread(target=self._heartbeat, args=(step, stop), name="progress", daemon=True).start()
        failed = True
        try:
            yield step
            failed = False
        finally:
            stop.set()
            ending = "failed" if failed else step.outcome
            final = f"{title}: {ending} ({step.elapsed:.1f}s)"
            if self.live:
                self._stop_live(("✗ " if failed else "✓ ") + final)
            else:
                self._plain(final)

    def line(self, text: str) -> None:
        if self._rich is not None:
            self._rich.console.print(text, markup=False, highlight=False)
        else:
            self._plain(text)

    def changed(self, step: Step) -> None:
        if self._rich is not None and self._task is not None:
            self._rich.update(self._task, description=self._describe(step))
        elif not self.live:
            self._plain(f"{step.title}: {step.detail}")

    # ------------------------------------------------------------------------------------ the two ways
    def _plain(self, text: str) -> None:
        with self._lock:
            self.stream.write(text + "\n")
            self.stream.flush()

    def _heartbeat(self, step: Step, stop: threading.Event) -> None:
        while not stop.wait(HEARTBEAT_SEC):
            detail = f" - {step.detail}" if step.detail else ""
            self._plain(f"{step.title}: still running ({step.elapsed:.0f}s){detail}")

    @staticmethod
    def _describe(step: Step) -> str:
        return f"{step.title}{': ' + step.detail if step.detail else ''}"

    def _start_live(self, step: Step) -> None:
        from rich.console import Console
        from rich.progress import Progress as RichProgress
        from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

        console = Console(file=self.stream, force_terminal=True, highlight=False)
        self._rich = RichProgress(
            SpinnerColumn(),
            TextColumn("{task.description}", markup=False),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            refresh_per_second=8,
            # sys.stdout stays the real stdout: threads started meanwhile (children's log pumps) keep writing
            # there after the step, and stdout is what scripts read.
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self._rich.start()
        self._task = self._rich.add_task(self._describe(step), total=None)

    def _stop_live(self, final: str) -> None:
        if self._rich is None:
            return
        self._rich.stop()
        self._rich.console.print(final, markup=False, highlight=False)
        self._rich = self._task = None


__all__ = ["HEARTBEAT_SEC", "PROGRESS_ENV", "Progress", "Step", "interactive"]
