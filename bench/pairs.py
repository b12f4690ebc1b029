"""Measurement primitives of the benches: wrk runs against servers pinned to one core, and ratios measured in
interleaved pairs of short slices, which a shared machine disturbs less than figures taken minutes apart.

A ratio between two things (ours and its HTTP ceiling, ours and raw onnxruntime, ours and a peer server) is
taken within one pair: one slice of each, back to back, the order alternating from pair to pair so that a
trend within a pair favours neither side; the figure reported is the median of the pairs' own ratios.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from servestack.local.hosting.processes import REPO_ROOT, http_status

SERVER_CORE, LOAD_CORE = "0", "1"


@dataclass
class LoadResult:
    requests_per_sec: float
    p50_ms: float
    p99_ms: float
    non_2xx: int


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = os.getenv("CONTENT_TYPE")
wrk.headers["Accept"] = os.getenv("CONTENT_TYPE")
local f = io.open(os.getenv("BODY_FILE"), "rb"); wrk.body = f:read("*a"); f:close()
"""


@dataclass(frozen=True)
class Payload:
    name: str
    body_file: Path
    content_type: str
    rows: int


# After each wrk run, before the next phase: wrk closes its connections with requests still queued in the worker,
# which finishes them (nobody reads the answers). Those count against the worker's 64 request slots, so a phase
# started at once met a full worker: a few 429s after a 1 s pause, which made the next phase's p99 about 1 s.
SETTLE_SEC = 0.3


def wrk(url: str, connections: int, seconds: float, payload: Payload, script: Path) -> LoadResult:
    """One wrk run of `seconds` on the load core, then `SETTLE_SEC` for the worker to finish what it left."""
    out = subprocess.run(
        [
            "taskset",
            "-c",
            LOAD_CORE,
            "wrk",
            "-t1",
            f"-c{connections}",
            f"-d{max(1, round(seconds))}s",
            "--latency",
            "-s",
            str(script),
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "BODY_FILE": str(payload.body_file), "CONTENT_TYPE": payload.content_type},
    ).stdout
    time.sleep(SETTLE_SEC)

    def latency_ms(label: str) -> float:
        match = re.search(rf"^\s+{label}%\s+([\d.]+)(us|ms|s)\s*$", out, re.MULTILINE)
        assert match, out
        value, unit = float(match.group(1)), match.group(2)
        return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value

    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    assert rps, out
    return LoadResult(float(rps.group(1)), latency_ms("50"), latency_ms("99"), int(non_2xx.group(1)) if non_2xx else 0)


class PinnedServer:
    """A server started on the server core, ready once `ready_path` answers one of `ready_statuses`; with
    `log`, its output goes there, and a server that does not start is reported with the log's end; with
    `stdout`, its stdout alone goes there instead (a pipe, as a container's log driver reads it)."""

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        port: int,
        ready_path: str = "/ping",
        ready_statuses: tuple[int, ...] = (200, 404, 405),
        cwd: Path = REPO_ROOT,
        log: Path | None = None,
        stdout: IO[bytes] | None = None,
    ) -> None:
        self.port = port
        with (log or Path(os.devnull)).open("wb") as output:
            self.process = subprocess.Popen(
                ["taskset", "-c", SERVER_CORE, *argv],
                cwd=cwd,
                env={**os.environ, **env},
                stdout=output if stdout is None else stdout,
                stderr=subprocess.STDOUT if stdout is None else output,
            )
        deadline = time.monotonic() + 60
        while http_status(f"http://127.0.0.1:{port}{ready_path}") not in ready_statuses:
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.stop()
                tail = log.read_text(errors="replace")[-2000:] if log else ""
                raise RuntimeError(f"server {argv} did not start\n{tail}")
            time.sleep(0.1)

    def rss_mib(self) -> float:
        # taskset execs the server, so the pid is the server's own.
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        match = re.search(r"VmRSS:\s+(\d+) kB", status)
        return int(match.group(1)) / 1024 if match else float("nan")

    def cpu_sec(self) -> float:
        """CPU seconds (user and system) the server and its processes (granian's workers) have used so far: what a
        request costs the server core, which other load on a shared machine shifts far less than its latency."""
        return sum(_process_cpu_sec(pid) for pid in _tree(self.process.pid))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
        self.process.wait(timeout=20)


def _tree(pid: int) -> list[int]:
    """`pid` and its descendants, each process once."""
    found, i = [pid], 0
    while i < len(found):
        for children in Path(f"/proc/{found[i]}/task").glob("*/children"):
            try:
                found += [int(child) for child in children.read_text().split()]
            except OSError:  # the thread or process has just ended
                continue
        i += 1
    return list(dict.fromkeys(found))


def _process_cpu_sec(pid: int) -> float:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()  # after the command's name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


# ------------------------------------------------------------------------------------------ interleaved pairs
INTERLEAVED_SLICE_SEC = 2.0
PAIR_CONNECTIONS = 64


@dataclass(frozen=True)
class Slice:
    rows_per_sec: float
    non_2xx: int = 0


@dataclass(frozen=True)
class Side:
    """One side of a comparison: `measure(seconds)` loads it for one slice."""

    label: str
    measure: Callable[[float], Slice]


def wrk_side(label: str, url: str, payload: Payload, script: Path, connections: int = PAIR_CONNECTIONS) -> Side:
    """A server loaded by wrk with `payload`: rows/s (requests/s times the payload's rows)."""

    def measure(seconds: float) -> Slice:
        result = wrk(url, connections, seconds, payload, script)
        return Slice(result.requests_per_sec * payload.rows, result.non_2xx)

    return Side(label, measure)


@dataclass
class Samples:
    """Each side's rows/s, one figure per pair, and the non-2xx answers it got."""

    rows_per_sec: dict[str, list[float]]
    non_2xx: dict[str, int]

    def ratios(self, mine: str, other: str) -> list[float]:
        """The pairs' own ratios of `mine` to `other`."""
        return [a / b for a, b in zip(self.rows_per_sec[mine], self.rows_per_sec[other], strict=True)]

    def ratio(self, mine: str, other: str) -> float:
        return median(self.ratios(mine, other))


def interleave(groups: dict[str, Sequence[Side]], pairs: int, slice_sec: float) -> dict[str, Samples]:
    """`pairs` rounds; in each, every group's sides are loaded one slice each, back to back, in their order on
    even rounds and reversed on odd ones. A group is a row of a table: its sides are what it compares."""
    found = {
        name: Samples({side.label: [] for side in sides}, {side.label: 0 for side in sides})
        for name, sides in groups.items()
    }
    for pair in range(pairs):
        for name, sides in groups.items():
            samples = found[name]
            for side in sides if pair % 2 == 0 else list(reversed(sides)):
                cut = side.measure(slice_sec)
                samples.rows_per_sec[side.label].append(cut.rows_per_sec)
                samples.non_2xx[side.label] += cut.non_2xx
            print(
                f"  pair {pair + 1}, {name}: "
                + ", ".join(f"{side.label} {samples.rows_per_sec[side.label][-1]:.0f}" for side in sides)
                + " rows/s",
                flush=True,
            )
    return found


def ratio_cell(values: Sequence[float], suffix: str = "") -> str:
    """A median of pair ratios, with the range of the pairs: `0.62 (0.55-0.70)`."""
    return f"{median(values):.2f}{suffix} ({min(values):.2f}-{max(values):.2f})"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines
