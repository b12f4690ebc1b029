"""The HTTP server, chosen by numbers: uvicorn + httptools (ASGI) against granian (RSGI, as `serve` runs it),
each on one pinned core, on the raw ceiling of its interface (a constant answer), servestack's 1-row JSON and
32-row `.npy` paths (64 connections, wrk) and overload (512 connections, clients retrying at once, then
honouring Retry-After).

    make bench      (or: .venv/bin/python -m bench.servers --runs 3 --duration-sec 5 --overload-sec 10)

`serve` runs granian unless SERVESTACK_HTTP_SERVER=uvicorn (servestack/adapters/realtime.py). Every figure is the median
of --runs runs; the bench prints figures and ratios and never passes or fails on time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.overload import overload_median
from bench.pairs import LOAD_CORE, SERVER_CORE, WRK_SCRIPT, LoadResult, PinnedServer, median
from bench.realtime import measure
from bench.subjects import HTTP_SERVERS, ceiling, ours, payloads


def compare(runs: int, seconds: float, overload_sec: float) -> dict[str, dict[str, Any]]:
    """Each run measures every server in turn, so that a change in the machine's load between runs touches
    every server alike (a shared machine's load drifts over minutes); the figures are medians over the runs."""
    samples: dict[str, dict[str, list[Any]]] = {
        server: {"ceiling": [], "single": [], "npy32": [], "overload": []} for server in HTTP_SERVERS
    }
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        script = scratch / "post.lua"
        script.write_text(WRK_SCRIPT)
        p = payloads(scratch)
        single, npy32 = p["single"], p["npy32"]
        for run in range(runs):
            print(f"run {run + 1} of {runs}:", flush=True)
            for server in HTTP_SERVERS:

                def start_ceiling(port: int, server: str = server) -> PinnedServer:
                    return ceiling(port, server)

                def start_ours(port: int, server: str = server) -> PinnedServer:
                    return ours(port, server)

                ceil = measure(f"{server} ceiling", start_ceiling, [(single, 64)], "/invocations", 1, seconds, script)
                mine = measure(
                    f"{server} servestack", start_ours, [(single, 64), (npy32, 64)], "/invocations", 1, seconds, script
                )
                over = overload_median(single, overload_sec, 1, server, script)
                print(
                    f"  {server} overload: 2xx {over['over_ok_qps']:.0f} req/s retrying at once, "
                    f"{over['polite_ok_qps']:.0f} honouring Retry-After, nominal {over['base_qps']:.0f} req/s; "
                    f"wrk: 2xx {over['wrk_over_ok_qps']:.0f} req/s at once, nominal {over['wrk_base_qps']:.0f}",
                    flush=True,
                )
                found = samples[server]
                found["ceiling"].append(ceil[(single.name, 64)])
                found["single"].append(mine[(single.name, 64)])
                found["npy32"].append(mine[(npy32.name, 64)])
                found["overload"].append(over)
    return {server: _medians(found) for server, found in samples.items()}


def _medians(found: dict[str, list[Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for key in ("ceiling", "single", "npy32"):
        results: list[LoadResult] = found[key]
        merged[key] = LoadResult(
            median([r.requests_per_sec for r in results]),
            median([r.p50_ms for r in results]),
            median([r.p99_ms for r in results]),
            sum(r.non_2xx for r in results),
        )
    overloads: list[dict[str, Any]] = found["overload"]
    merged["overload"] = {
        key: median([float(o[key]) for o in overloads])
        for key, value in overloads[0].items()
        if isinstance(value, int | float)
    }
    return merged


def print_table(figures: dict[str, dict[str, Any]]) -> None:
    print("HTTP servers, one core each, medians (ratios within each server's own run):")
    print(
        "| server | ceiling req/s | 1-row JSON req/s (of ceiling), p99 | 32-row .npy rows/s, p99 "
        "| overload 2xx share / admitted p99 x nominal (at once; Retry-After) | wrk at once: 2xx share |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for server, found in figures.items():
        ceil: LoadResult = found["ceiling"]
        single: LoadResult = found["single"]
        npy32: LoadResult = found["npy32"]
        over = found["overload"]
        print(
            f"| {server} | {ceil.requests_per_sec:.0f} | {single.requests_per_sec:.0f} "
            f"({single.requests_per_sec / ceil.requests_per_sec:.2f}), {single.p99_ms:.2f} ms "
            f"| {npy32.requests_per_sec * 32:.0f}, {npy32.p99_ms:.2f} ms "
            f"| {over['over_share']:.2f} / {over['over_p99x']:.2f}x; {over['polite_share']:.2f} / "
            f"{over['polite_p99x']:.2f}x | {over['wrk_share']:.2f} |"
        )
    if len(figures) == 2:
        first, second = figures
        print(f"{first} / {second}:", end="")
        for key, label in (("ceiling", "ceiling"), ("single", "1-row JSON"), ("npy32", "32-row .npy")):
            ratio = figures[first][key].requests_per_sec / figures[second][key].requests_per_sec
            print(f" {label} {ratio:.2f}x", end=";")
        print()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--duration-sec", type=float, default=5.0)
    parser.add_argument("--overload-sec", type=float, default=10.0)
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None or shutil.which("taskset") is None:
        sys.exit("bench needs wrk and taskset: apt-get install wrk util-linux")
    if len(os.sched_getaffinity(0)) < 2:
        print("warning: fewer than 2 cores; server and load generator will share a core", file=sys.stderr)
    print(f"HTTP server comparison: runs={args.runs}; servers on core {SERVER_CORE}, load on core {LOAD_CORE}")
    print_table(compare(args.runs, args.duration_sec, args.overload_sec))


if __name__ == "__main__":
    main()
