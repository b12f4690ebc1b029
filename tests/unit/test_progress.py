"""Progress on stderr: rich's live line on a terminal (a real pty), plain lines on a pipe or file, or when CI is set."""

from __future__ import annotations

import io
import os
import re
import threading

import pytest

from servestack import progress as progress_module
from servestack.progress import Progress, interactive
from tests.waiting import wait_for


def test_plain_lines_off_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setattr(progress_module, "HEARTBEAT_SEC", 0.05)
    out = io.StringIO()
    reporter = Progress(out)
    assert not reporter.live
    with reporter.step("synth") as step:
        step.update("synthesizing: serving.yaml changed")
        wait_for(lambda: "synth: still running" in out.getvalue(), "a heartbeat line")
        step.note("port 8080 is taken: using 41234 instead")
        step.finish("templates written")
    lines = out.getvalue().splitlines()
    assert lines[0] == "synth ..."
    assert lines[1] == "synth: synthesizing: serving.yaml changed"
    assert any(re.match(r"synth: still running \(\d+s\) - synthesizing", line) for line in lines), lines
    assert "port 8080 is taken: using 41234 instead" in lines
    assert lines[-1].startswith("synth: templates written (")
    assert lines[-1].endswith("s)")
    assert "\x1b[" not in out.getvalue()


def test_a_failing_step_says_failed() -> None:
    out = io.StringIO()
    with pytest.raises(RuntimeError), Progress(out).step("provisioning"):
        raise RuntimeError("moto said no")
    assert out.getvalue().splitlines()[-1].startswith("provisioning: failed (")


def test_ci_or_the_setting_means_plain_even_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    controller, terminal = os.openpty()
    try:
        with os.fdopen(terminal, "w", closefd=False) as stream:
            monkeypatch.delenv("CI", raising=False)
            monkeypatch.delenv(progress_module.PROGRESS_ENV, raising=False)
            assert interactive(stream)
            monkeypatch.setenv("CI", "true")
            assert not interactive(stream)
            monkeypatch.delenv("CI")
            monkeypatch.setenv(progress_module.PROGRESS_ENV, "plain")
            assert not interactive(stream)
    finally:
        os.close(controller)
        os.close(terminal)


def test_a_terminal_gets_a_live_line_that_updates_while_the_step_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv(progress_module.PROGRESS_ENV, raising=False)
    controller, terminal = os.openpty()
    seen = bytearray()

    def read() -> None:
        while True:
            try:
                chunk = os.read(controller, 4096)
            except OSError:
                return
            if not chunk:
                return
            seen.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    with os.fdopen(terminal, "w", closefd=False) as stream:
        reporter = Progress(stream)
        assert reporter.live
        with reporter.step("synth") as step:
            step.update("synthesizing: no earlier synth")
            # (the step runs until its line has been redrawn showing a second gone)
            wait_for(lambda: b"0:00:01" in seen, "the live line to show 0:00:01")
            during = bytes(seen)
            step.finish("templates written")
    os.close(terminal)
    reader.join(timeout=5)
    os.close(controller)
    # THEN while it ran: redrawn lines (cursor control) naming the step, with its elapsed time
    assert b"\x1b[" in during
    assert b"synth: synthesizing: no earlier synth" in during
    assert b"0:00:01" in during
    # AND at the end one line that stays
    assert "✓ synth: templates written (".encode() in bytes(seen)
