"""Realtime benchmark, one run, same model and payloads: raw onnxruntime, the HTTP ceiling (a raw app
returning a constant, on the same HTTP server and interface as ours: granian's RSGI, or uvicorn's ASGI), a
naive FastAPI + onnxruntime server (uvicorn, as its users run it), and ours; then overload, every row against
its own ceiling (bench/ceilings.py) and Lambda init; last, issue 13's table with its ratios, issue 23's row
(32-row `dataframe_split` requests to a pipeline with a string column) and the table of every row against its
own ceiling. The HTTP server comparison (uvicorn vs granian) is bench/servers.py; ours against MLServer is
bench/peers.py (`make bench-peers`). Every request asks for its answer in its own media type (`Accept` =
`Content-Type`): `.npy` in, `.npy` out.

    make bench            (or: .venv/bin/python -m bench.realtime --runs 3 --duration-sec 5;
                           --only rows: the rows against their ceilings alone; --only split: issue 23's row;
                           --only capture: issue 39's row, capture at 100% against off, bench/capture_row.py)

Servers are pinned to core 0, load generators to core 1 (taskset); onnxruntime uses one intra-op thread.
Throughput and latency come from wrk; the overload run uses servestack's own load generator, which splits
latency by status. Every figure of the runs is the median of --runs runs. The ratios against a ceiling (each
row's ours vs the HTTP ceiling on the same body, and vs raw onnxruntime on the same arrays) are measured in
--pairs interleaved pairs of short slices (bench/pairs.py), which a noisy machine disturbs less. It prints
figures and ratios; it never passes or fails on time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.capture_row import capture_json, capture_table, measure_capture
from bench.ceilings import (
    CEILING,
    JSON1,
    NPY32,
    OURS,
    RAW,
    ROWS,
    SPLIT32,
    ceilings_table,
    measure_rows,
    print_split_row,
    split_figures,
)
from bench.overload import overload_median
from bench.pairs import (
    LOAD_CORE,
    SERVER_CORE,
    WRK_SCRIPT,
    LoadResult,
    Payload,
    PinnedServer,
    Samples,
    median,
    wrk,
)
from bench.subjects import (
    DEFAULT_SERVER,
    HTTP_SERVERS,
    ceiling,
    granian_asgi_ceiling,
    interface,
    naive,
    ours,
    payloads,
    raw_onnxruntime_rows_per_sec,
)
from servestack.local.hosting.processes import REPO_ROOT, free_port


def measure(
    name: str,
    start: Callable[[int], PinnedServer],
    cases: list[tuple[Payload, int]],
    path: str,
    runs: int,
    seconds: float,
    script: Path,
) -> dict[tuple[str, int], LoadResult]:
    samples: dict[tuple[str, int], list[LoadResult]] = {(p.name, c): [] for p, c in cases}
    for _ in range(runs):
        port = free_port()
        server = start(port)
        try:
            url = f"http://127.0.0.1:{port}{path}"
            wrk(url, 8, 1, cases[0][0], script)  # warm up
            for payload, connections in cases:
                samples[(payload.name, connections)].append(wrk(url, connections, seconds, payload, script))
        finally:
            server.stop()
    results = {}
    for (payload_name, connections), found in samples.items():
        result = LoadResult(
            median([r.requests_per_sec for r in found]),
            median([r.p50_ms for r in found]),
            median([r.p99_ms for r in found]),
            sum(r.non_2xx for r in found),
        )
        results[(payload_name, connections)] = result
        rows = next(p.rows for p, _ in cases if p.name == payload_name)
        print(
            f"  {name:<20} {payload_name:<16} c={connections:<3} {result.requests_per_sec:>8.0f} req/s "
            f"{result.requests_per_sec * rows:>9.0f} rows/s  p50 {result.p50_ms:6.2f} ms  p99 {result.p99_ms:6.2f} ms"
            f"  non-2xx {result.non_2xx}",
            flush=True,
        )
    return results


@dataclass(frozen=True)
class RunFigures:
    """One run's figures, all measured back to back."""

    raw: dict[int, float]
    ceil: dict[tuple[str, int], LoadResult]
    asgi: dict[tuple[str, int], LoadResult]
    base: dict[tuple[str, int], LoadResult]
    mine: dict[tuple[str, int], LoadResult]


def merged(results: list[dict[tuple[str, int], LoadResult]]) -> dict[tuple[str, int], LoadResult]:
    """Per case, the median of each figure over the runs (non-2xx summed)."""
    out = {}
    for key in results[0]:
        found = [r[key] for r in results]
        out[key] = LoadResult(
            median([r.requests_per_sec for r in found]),
            median([r.p50_ms for r in found]),
            median([r.p99_ms for r in found]),
            sum(r.non_2xx for r in found),
        )
    return out


def median_ratios(runs: list[RunFigures]) -> dict[str, float]:
    """Each ratio taken within a run, then the median over the runs."""
    single = ("1-row JSON", 64)
    per_run: dict[str, list[float]] = {"naive": [], "ceiling": [], "npy_raw": [], "asgi_ceiling": []}
    for run in runs:
        ours_qps = run.mine[single].requests_per_sec
        per_run["naive"].append(ours_qps / run.base[single].requests_per_sec)
        per_run["ceiling"].append(ours_qps / run.ceil[single].requests_per_sec)
        per_run["npy_raw"].append(run.mine[("32-row npy", 64)].requests_per_sec * 32 / run.raw[32])
        if run.asgi:
            per_run["asgi_ceiling"].append(ours_qps / run.asgi[single].requests_per_sec)
    return {name: median(values) for name, values in per_run.items() if values}


def print_issue13_table(
    raw: dict[int, float],
    mine: dict[tuple[str, int], LoadResult],
    ratios: dict[str, float],
    over: dict[str, Any],
    http_server: str = DEFAULT_SERVER,
) -> None:
    """Issue 13's table: figures are medians over the runs, ratios the medians of each run's own ratios
    (targets in brackets; the bench never passes or fails)."""
    s64 = mine[("1-row JSON", 64)]
    npy_rows = mine[("32-row npy", 64)].requests_per_sec * 32
    print(f"issue 13 table (servestack on {interface(http_server)}, one server core; targets in brackets):")
    print("| path | this run |")
    print("| --- | --- |")
    asgi = f" ({ratios['asgi_ceiling']:.2f} of granian's ASGI ceiling)" if "asgi_ceiling" in ratios else ""
    print(
        f"| 1-row JSON, 64 connections | {s64.requests_per_sec:.0f} req/s = {ratios['naive']:.2f}x naive FastAPI "
        f"[>= 3x]; {ratios['ceiling']:.2f} of the raw ceiling on {interface(http_server)}{asgi} "
        f"(interleaved: {ratios['ceiling_interleaved']:.2f}) [>= 0.6]; "
        f"p99 {s64.p99_ms:.2f} ms |"
    )
    print(
        f"| 32-row `.npy` per request, 64 connections | {npy_rows:.0f} rows/s = {ratios['npy_raw']:.2f} of raw "
        f"onnxruntime at batch 32 ({raw[32]:.0f} rows/s; interleaved: {ratios['npy_raw_interleaved']:.2f}) "
        "[>= 0.4] |"
    )
    for label, prefix in (("retrying at once", "over"), ("honouring Retry-After", "polite")):
        statuses = over[f"{prefix}_statuses"]
        fives = sum(count for status, count in statuses.items() if status.startswith("5"))
        print(
            f"| 512 connections {label} (8x overload) | 2xx throughput "
            f"{over[f'{prefix}_share']:.2f} of nominal [>= 0.9]; admitted p99 "
            f"{over[f'{prefix}_p99x']:.2f}x nominal [<= 3]; 5xx {fives}, "
            f"errors/timeouts {sum((over[f'{prefix}_errors'] or {}).values())} |"
        )
    if "wrk_base_qps" in over:
        print(
            f"| 512 wrk connections retrying at once (C client) | 2xx throughput "
            f"{over['wrk_share']:.2f} of nominal (wrk, 64 connections) [>= 0.9]; "
            f"{over['wrk_over_non_2xx_per_sec']:.0f} refusals/s |"
        )
    print("| batch job, 1M rows | printed by bench/batch_job.py (next in `make bench`) |")
    print(
        "  nominal = the same worker at 64 connections, just before and just after (their mean); "
        "bench/servers.py compares HTTP servers"
    )


def lambda_init_sec(module: str, runs: int) -> list[float]:
    """Import of a Lambda handler module (model load included) in a fresh interpreter, .pyc present."""
    code = f"import time; t = time.perf_counter(); import {module}; print('INIT', time.perf_counter() - t)"
    subprocess.run([sys.executable, "-m", "compileall", "-q", "servestack", "bench"], cwd=REPO_ROOT, check=True)
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, check=True)  # warm the FS cache
    outputs = [
        subprocess.run(
            ["taskset", "-c", SERVER_CORE, sys.executable, "-c", code],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for _ in range(runs)
    ]
    return [float(out.rsplit("INIT ", 1)[1]) for out in outputs]


def pair_ratio(found: dict[str, Samples | str], row: str, mine: str, other: str) -> float:
    """A row's median pair ratio; NaN when ours refused its body (the table says so)."""
    samples = found[row]
    return float("nan") if isinstance(samples, str) else samples.ratio(mine, other)


def samples_json(found: dict[str, Samples | str]) -> dict[str, Any]:
    return {name: s if isinstance(s, str) else vars(s) for name, s in found.items()}


def rows_only(scratch: Path, script: Path, args: argparse.Namespace) -> None:
    """`--only rows`: the rows against their own ceilings alone; `--only split`: issue 23's row alone."""
    names = ROWS if args.only == "rows" else (SPLIT32,)
    found = measure_rows(scratch, script, args.http_server, args.pairs, names)
    if args.only == "split":
        print(f"issue 23 row (servestack on {interface(args.http_server)}, one server core; target in brackets):")
        print_split_row(split_figures(found))
    print("\n".join(ceilings_table(found, args.http_server)))
    if args.json:
        args.json.write_text(json.dumps({"interleaved": samples_json(found)}, indent=2))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--duration-sec", type=float, default=5.0)
    parser.add_argument("--overload-sec", type=float, default=10.0, help="each overload phase; --runs of them")
    parser.add_argument(
        "--pairs", type=int, default=7, help="interleaved slice pairs for the ratios against the ceilings"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument(
        "--http-server",
        choices=HTTP_SERVERS,
        default=DEFAULT_SERVER,
        help="the server for ours and the ceiling (serve's SERVESTACK_HTTP_SERVER); naive FastAPI stays on uvicorn",
    )
    parser.add_argument(
        "--only",
        choices=("all", "rows", "split", "capture"),
        default="all",
        help="'rows': only the table of every row against its own ceiling (interleaved pairs); 'split': only "
        "issue 23's row (32-row dataframe_split to the pipeline), for work on that path; 'capture': only issue "
        "39's row (capture at 100% against capture off, `make bench` runs it as its own line)",
    )
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None or shutil.which("taskset") is None:
        sys.exit("bench needs wrk and taskset: apt-get install wrk util-linux")
    if len(os.sched_getaffinity(0)) < 2:
        print("warning: fewer than 2 cores; server and load generator will share a core", file=sys.stderr)

    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        script = scratch / "post.lua"
        script.write_text(WRK_SCRIPT)
        if args.only == "capture":
            figures = measure_capture(scratch, script, args.http_server, args.pairs)
            print("\n".join(capture_table(figures, args.http_server)))
            if args.json:
                args.json.write_text(json.dumps({"capture": capture_json(figures)}, indent=2))
            return
        if args.only != "all":
            rows_only(scratch, script, args)
            return
        p = payloads(scratch)
        print(
            f"runs={args.runs} duration={args.duration_sec}s; servers on core {SERVER_CORE}, load on core {LOAD_CORE}"
        )
        single = p["single"]
        # Each run measures everything back to back (raw onnxruntime, the ceilings, naive, ours), so a ratio is
        # taken between figures of one moment, and the ratios reported are medians over the runs: a shared
        # machine's load drifts over minutes.
        runs: list[RunFigures] = []
        for run in range(args.runs):
            print(f"run {run + 1} of {args.runs}:", flush=True)
            raw_run = {b: raw_onnxruntime_rows_per_sec(b, 2.0) for b in (1, 32, 128)}
            print("  raw onnxruntime (one thread, one core): " + ", ".join(
                f"batch {b} {rows:.0f} rows/s" for b, rows in raw_run.items()
            ), flush=True)  # fmt: skip
            ceil_run = measure(
                f"raw constant ({interface(args.http_server)})",
                lambda port: ceiling(port, args.http_server),
                [(single, 64)],
                "/invocations",
                1,
                args.duration_sec,
                script,
            )
            asgi_run = (  # what RSGI is worth against granian's own ASGI
                measure("raw constant (granian ASGI)", granian_asgi_ceiling, [(single, 64)], "/invocations", 1,
                        args.duration_sec, script)
                if args.http_server == "granian"
                else {}
            )  # fmt: skip
            base_run = measure(
                "naive FastAPI", naive, [(single, 1), (single, 64)], "/invocations", 1, args.duration_sec, script
            )
            mine_run = measure(
                "servestack",
                lambda port: ours(port, args.http_server),
                [(single, 1), (single, 64), (p["json32"], 64), (p["npy32"], 64)],
                "/invocations",
                1,
                args.duration_sec,
                script,
            )
            runs.append(RunFigures(raw_run, ceil_run, asgi_run, base_run, mine_run))
        raw = {b: median([r.raw[b] for r in runs]) for b in (1, 32, 128)}
        ceil, base, mine = (merged([getattr(r, part) for r in runs]) for part in ("ceil", "base", "mine"))
        print(f"medians of {args.runs} runs:")
        print("  raw onnxruntime: " + ", ".join(f"batch {b} {rows:.0f} rows/s" for b, rows in raw.items()))
        for name, results in (("ceiling", ceil), ("naive FastAPI", base), ("servestack", mine)):
            for (payload_name, connections), result in results.items():
                print(
                    f"  {name:<20} {payload_name:<16} c={connections:<3} {result.requests_per_sec:>8.0f} req/s  "
                    f"p50 {result.p50_ms:6.2f} ms  p99 {result.p99_ms:6.2f} ms  non-2xx {result.non_2xx}"
                )
        print(
            f"overload (servestack load generator, 512 connections for {args.overload_sec:g}s, one worker, "
            f"median of {args.runs}):"
        )
        over = overload_median(single, args.overload_sec, args.runs, args.http_server, script)
        print(f"  64 connections first: {over['base_qps']:.0f} req/s 2xx, p99 {over['base_p99_ms']:.2f} ms")
        print(
            f"  512 connections: {over['over_ok_qps']:.0f} req/s 2xx, 2xx p99 {over['over_ok_p99_ms']:.2f} ms; "
            f"statuses {over['over_statuses']}; errors/timeouts {over['over_errors'] or 0}; "
            f"429s with Retry-After {over['retry_after_seen']}"
        )
        print(
            f"  512 connections honouring Retry-After: {over['polite_ok_qps']:.0f} req/s 2xx, "
            f"2xx p99 {over['polite_ok_p99_ms']:.2f} ms; statuses {over['polite_statuses']}; "
            f"errors/timeouts {over['polite_errors'] or 0}"
        )
        print(
            f"  RSS {over['rss_before_mib']:.1f} MiB before, {over['rss_min_mib']:.1f}..{over['rss_max_mib']:.1f} "
            "MiB during"
        )
        paired = measure_rows(scratch, script, args.http_server, args.pairs)

    ours_init = lambda_init_sec("servestack.adapters.serverless", max(args.runs, 5))
    naive_init = lambda_init_sec("bench.naive_lambda", max(args.runs, 5))
    print("Lambda init (import + model load, .pyc present), median:")
    print(f"  servestack {median(ours_init) * 1000:.0f} ms; naive FastAPI + Mangum {median(naive_init) * 1000:.0f} ms")

    ratios = median_ratios(runs)
    print(f"ratios (each the median of the {args.runs} runs' own ratios):")
    print(
        f"  ours / naive FastAPI, 1-row JSON at 64 connections: {ratios['naive']:.2f}x "
        f"(p99 {mine[('1-row JSON', 64)].p99_ms:.2f} ms vs {base[('1-row JSON', 64)].p99_ms:.2f} ms)"
    )
    print(f"  ours / raw ceiling ({interface(args.http_server)}) at 64 connections: {ratios['ceiling']:.2f}")
    if "asgi_ceiling" in ratios:
        print(f"  ours / granian's raw ASGI ceiling at 64 connections: {ratios['asgi_ceiling']:.2f}")
    print(f"  ours 1-connection p50: {mine[('1-row JSON', 1)].p50_ms:.2f} ms")
    print(f"  ours 32-row npy rows/s / raw onnxruntime at batch 32: {ratios['npy_raw']:.2f}")
    ratios["ceiling_interleaved"] = pair_ratio(paired, JSON1, OURS, CEILING)
    ratios["npy_raw_interleaved"] = pair_ratio(paired, NPY32, OURS, RAW)
    print(
        f"  the same two, interleaved (median of {args.pairs} pairs): ours / raw ceiling "
        f"{ratios['ceiling_interleaved']:.2f}; 32-row npy / raw onnxruntime {ratios['npy_raw_interleaved']:.2f}"
    )
    print(
        f"  overload 2xx p99 / 64-connection p99: {over['over_p99x']:.2f}x immediate retries, "
        f"{over['polite_p99x']:.2f}x honouring Retry-After; "
        f"RSS change {100 * (over['rss_max_mib'] / over['rss_before_mib'] - 1):+.1f}% max, "
        f"{100 * (over['rss_min_mib'] / over['rss_before_mib'] - 1):+.1f}% min"
    )
    print(f"  Lambda init ours / naive: {median(ours_init) / median(naive_init):.2f}")
    print_issue13_table(raw, mine, ratios, over, args.http_server)
    print(f"issue 23 row (servestack on {interface(args.http_server)}, one server core; target in brackets):")
    print_split_row(split_figures(paired))
    print("\n".join(ceilings_table(paired, args.http_server)))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "raw_rows_per_sec": raw,
                    "http": {
                        f"{name} {payload} c={c}": vars(r)
                        for name, results in (("ceiling", ceil), ("naive", base), ("ours", mine))
                        for (payload, c), r in results.items()
                    },
                    "overload": over,
                    "ratios": ratios,
                    "interleaved": samples_json(paired),
                    "lambda_init_sec": {"ours": ours_init, "naive": naive_init},
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
