"""What writing 1 KB log lines to a pipe costs the writer, by how the lines are grouped: the pipe is drained by
`wc` on the other core, as a container's log driver reads its stdout. Each case writes the same lines with the
same CPU-bound gap between writes (a server's other work) and prints the writer's system CPU per line; most of it
is waking the reader, which a burst of writes does once (servestack/inference/capture.py, `Capturer.coalesce`).

    .venv/bin/python -m bench.pipe_writes [--lines 200000]

It prints figures; it never passes or fails on time.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time

LINE = b"x" * 1023 + b"\n"
CASES = (  # (lines per write, writes per burst, the gap after a burst in µs: ~20 µs of other work per line)
    (1, 1, 20),
    (3, 1, 60),
    (4, 1, 80),
    (4, 16, 1280),
)


def system_cpu_per_line(lines_per_write: int, writes_per_burst: int, gap_us: float, lines: int) -> float:
    reader = subprocess.Popen(["taskset", "-c", "1", "wc", "-lc"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    assert reader.stdin is not None
    fd, chunk = reader.stdin.fileno(), LINE * lines_per_write
    before, written = os.times(), 0
    while written < lines:
        for _ in range(writes_per_burst):
            os.write(fd, chunk)
            written += lines_per_write
        until = time.perf_counter() + gap_us / 1e6
        while time.perf_counter() < until:  # busy, as a serving loop is: no system call
            pass
    after = os.times()
    reader.stdin.close()
    reader.wait()
    return (after.system - before.system) / written * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=200_000)
    args = parser.parse_args(argv)
    os.sched_setaffinity(0, {0})
    for lines_per_write, writes_per_burst, gap_us in CASES:
        cost = system_cpu_per_line(lines_per_write, writes_per_burst, gap_us, args.lines)
        grouping = f"{lines_per_write} line(s) a write, {writes_per_burst:2d} write(s) a burst"
        print(f"{grouping}: {cost:.2f} µs system CPU a line")


if __name__ == "__main__":
    main()
