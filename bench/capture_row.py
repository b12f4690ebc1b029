"""Issue 39's capture row: what data capture at 100% costs the realtime container, over HTTP. Two servers of
ours on the same HTTP server and core (granian RSGI, one worker, the digits model), one with capture off, one
with `SERVESTACK_CAPTURE` at 100%, whose stdout (a capture line per request) goes to a pipe drained by `wc` on
the load core, as a container's log driver reads it. Both take the same 1-row JSON body from wrk at 64
connections, in interleaved pairs of slices (the order alternating); the figures are the medians of the pairs'
own ratios (100% / off) of p99 and of req/s.

This is the path servestack pays in realtime mode only when `exclude_columns` is set (else SageMaker's own data
capture records the bodies, docs/monitoring.md), and in the Lambda modes, which write the same line.

    .venv/bin/python -m bench.realtime --only capture --pairs 7     (also a line of `make bench`)
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.pairs import (
    LOAD_CORE,
    PAIR_CONNECTIONS,
    LoadResult,
    PinnedServer,
    markdown_table,
    median,
    ratio_cell,
    wrk,
)
from bench.subjects import interface, ours, payloads
from servestack.local.hosting.processes import free_port

OFF, FULL = "off", "100%"
CAPTURE_SETTING = json.dumps({"deployment": "bench", "mode": "realtime", "sample_percent": 100})
CAPTURE_SLICE_SEC = 3.0


@dataclass
class CaptureFigures:
    """Each side's wrk figures and server CPU µs per request, one per pair, and what the capture side wrote on
    its stdout."""

    results: dict[str, list[LoadResult]]
    cpu_us: dict[str, list[float]]
    lines: int
    bytes_written: int

    def cpu_ratios(self) -> list[float]:
        return [full / off for full, off in zip(self.cpu_us[FULL], self.cpu_us[OFF], strict=True)]

    def ratios(self, figure: str) -> list[float]:
        """The pairs' own ratios of 100% to off, of `figure` (a field of LoadResult)."""
        return [
            getattr(full, figure) / getattr(off, figure)
            for full, off in zip(self.results[FULL], self.results[OFF], strict=True)
        ]


def measure_capture(scratch: Path, script: Path, http_server: str, pairs: int) -> CaptureFigures:
    payload = payloads(scratch)["single"]
    # `wc` on the load core reads the capture side's stdout as fast as it comes, as a log driver would.
    drain = subprocess.Popen(
        ["taskset", "-c", LOAD_CORE, "wc", "-lc"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert drain.stdin is not None
    ports = {OFF: free_port(), FULL: free_port()}
    servers: list[PinnedServer] = []
    try:
        servers.append(ours(ports[OFF], http_server))
        servers.append(ours(ports[FULL], http_server, {"SERVESTACK_CAPTURE": CAPTURE_SETTING}, stdout=drain.stdin))
        drain.stdin.close()  # the server holds the pipe's write end now: wc ends when it exits
        urls = {side: f"http://127.0.0.1:{port}/invocations" for side, port in ports.items()}
        for url in urls.values():
            wrk(url, 8, 1, payload, script)  # warm up
        print(
            f"capture row ({pairs} pairs of {CAPTURE_SLICE_SEC:g}s slices, 1-row JSON at {PAIR_CONNECTIONS} "
            f"connections, ours on {interface(http_server)}, order alternating):",
            flush=True,
        )
        results: dict[str, list[LoadResult]] = {OFF: [], FULL: []}
        cpu_us: dict[str, list[float]] = {OFF: [], FULL: []}
        for pair in range(pairs):
            for side in (OFF, FULL) if pair % 2 == 0 else (FULL, OFF):
                server = servers[0 if side == OFF else 1]
                used = server.cpu_sec()
                result = wrk(urls[side], PAIR_CONNECTIONS, CAPTURE_SLICE_SEC, payload, script)
                results[side].append(result)
                cpu_us[side].append((server.cpu_sec() - used) * 1e6 / (result.requests_per_sec * CAPTURE_SLICE_SEC))
            cells = (
                f"capture {side} {r.requests_per_sec:.0f} req/s p99 {r.p99_ms:.2f} ms, {cpu_us[side][-1]:.0f} µs CPU"
                for side, r in latest(results)
            )
            print(f"  pair {pair + 1}: " + ", ".join(cells), flush=True)
    finally:
        for server in servers:
            server.stop()
        if not drain.stdin.closed:
            drain.stdin.close()
    assert drain.stdout is not None
    counts = drain.stdout.read()  # wc's counts, once the server (the pipe's last writer) has exited
    drain.wait(timeout=60)
    lines, written = (int(n) for n in counts.split())
    return CaptureFigures(results, cpu_us, lines, written)


def latest(results: dict[str, list[LoadResult]]) -> list[tuple[str, LoadResult]]:
    return [(side, results[side][-1]) for side in (OFF, FULL)]


def capture_table(figures: CaptureFigures, http_server: str) -> list[str]:
    """The row: each side's median figures, and the medians of the pairs' ratios (their range in brackets)."""
    off, full = figures.results[OFF], figures.results[FULL]
    p99, qps, cpu = figures.ratios("p99_ms"), figures.ratios("requests_per_sec"), figures.cpu_ratios()
    answered = sum(r.requests_per_sec for r in full) * CAPTURE_SLICE_SEC
    lines = [
        f"issue 39 row: capture at 100% against capture off (servestack on {interface(http_server)}, one core; "
        "target in brackets):"
    ]
    lines += markdown_table(
        ("row", "off: req/s, p99, CPU/request", "100%: req/s, p99, CPU/request", "p99 100% / off",
         "req/s 100% / off", "server CPU per request, 100% / off"),
        [[
            f"1-row JSON, {PAIR_CONNECTIONS} connections",
            f"{median([r.requests_per_sec for r in off]):.0f}, {median([r.p99_ms for r in off]):.2f} ms, "
            f"{median(figures.cpu_us[OFF]):.0f} µs",
            f"{median([r.requests_per_sec for r in full]):.0f}, {median([r.p99_ms for r in full]):.2f} ms, "
            f"{median(figures.cpu_us[FULL]):.0f} µs",
            ratio_cell(p99, " [<= 1.10]"),
            ratio_cell(qps),
            ratio_cell(cpu),
        ]],
    )  # fmt: skip
    lines.append(
        f"  capture lines written: {figures.lines} ({figures.bytes_written / figures.lines:.0f} bytes each) for "
        f"about {answered:.0f} answers in the timed slices (plus warm-up and what wrk left queued)"
        if figures.lines
        else "  capture lines written: none (capture did not run)"
    )
    return lines


def capture_json(figures: CaptureFigures) -> dict[str, Any]:
    """The row's figures, pair by pair, for `--json`."""
    return {
        side: {"wrk": [vars(r) for r in figures.results[side]], "cpu_us_per_request": figures.cpu_us[side]}
        for side in (OFF, FULL)
    } | {"capture_lines": figures.lines, "capture_bytes": figures.bytes_written}
