"""Overload: 512 connections against one worker of ours, measured by servestack's own load generator (which splits
latency by status: what the admitted requests see, what the refused ones get), then by wrk, whose connections
retry at once; nominal is the same worker at 64 connections just before and just after. Part of
bench/realtime.py's runs and of bench/servers.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from bench.pairs import LOAD_CORE, LoadResult, Payload, median, wrk
from bench.subjects import DEFAULT_SERVER, ours
from servestack.local.hosting.processes import REPO_ROOT, free_port


def ok_per_sec(result: LoadResult, seconds: float) -> float:
    """wrk's 2xx rate: all requests per second less the non-2xx ones (wrk counts those over whole seconds)."""
    return result.requests_per_sec - result.non_2xx / max(1, round(seconds))


def overload(
    payload: Payload, seconds: float, http_server: str = DEFAULT_SERVER, script: Path | None = None
) -> dict[str, Any]:
    """512 connections for `seconds` against one worker, measured by servestack's load generator on core 1
    (which splits latency by status); then, with `script`, the same with wrk, a C client that does not itself
    become the bottleneck: its connections retry at once, and 2xx/s = all/s - non-2xx/s."""
    port = free_port()
    server = ours(port, http_server)
    code = (
        "import json, sys; from servestack.loadtest.driver import Target, run; "
        f"t = Target.from_url('http://127.0.0.1:{port}/invocations', open({str(payload.body_file)!r}, 'rb').read(), "
        f"{payload.content_type!r}); "
        "warm, _ = run(t, duration_sec=3, concurrency=8); "
        f"base, _ = run(t, duration_sec={seconds / 2}, concurrency=64); "
        f"over, _ = run(t, duration_sec={seconds}, concurrency=512, timeout_sec=10); "
        f"polite, _ = run(t, duration_sec={seconds / 2}, concurrency=512, timeout_sec=10, honour_retry_after=True); "
        f"after, _ = run(t, duration_sec={seconds / 2}, concurrency=64); "
        "print(json.dumps({'base': base.__dict__, 'over': over.__dict__, 'polite': polite.__dict__, "
        "'after': after.__dict__}))"
    )
    rss: list[float] = []
    stop = threading.Event()

    def sample_rss() -> None:
        while not stop.wait(0.5):
            rss.append(server.rss_mib())

    try:
        sampler = threading.Thread(target=sample_rss, daemon=True)
        sampler.start()
        out = subprocess.run(
            ["taskset", "-c", LOAD_CORE, sys.executable, "-c", code],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        stop.set()
        sampler.join()
        if script is not None:
            url = f"http://127.0.0.1:{port}/invocations"
            wrk_base = wrk(url, 64, seconds / 2, payload, script)
            wrk_over = wrk(url, 512, seconds, payload, script)
            wrk_after = wrk(url, 64, seconds / 2, payload, script)
    finally:
        server.stop()
    figures = json.loads(out.strip().splitlines()[-1])
    base, over, polite, after = figures["base"], figures["over"], figures["polite"], figures["after"]
    # Nominal is measured just before and again just after the overload phases, and the two averaged: on a
    # shared machine the rate drifts by several percent within a minute, and one side alone would charge
    # that drift to the overload.
    nominal_qps = (base["ok_qps"] + after["ok_qps"]) / 2
    nominal_p99 = (base["ok_latency_ms"]["p99"] + after["ok_latency_ms"]["p99"]) / 2
    # RSS at the end of the first 64-connection phase vs the range seen during the overload phases.
    phases = (3, seconds / 2, seconds, seconds / 2, seconds / 2)  # warm-up, base, over, polite, after
    split = max(1, int(len(rss) * sum(phases[:2]) / sum(phases)))
    end = max(split + 1, int(len(rss) * sum(phases[:4]) / sum(phases)))
    before = rss[split - 1]
    during = rss[split:end] or [before]
    wrk_figures = (
        {
            "wrk_base_qps": sum(ok_per_sec(result, seconds / 2) for result in (wrk_base, wrk_after)) / 2,
            "wrk_over_ok_qps": ok_per_sec(wrk_over, seconds),
            "wrk_over_non_2xx_per_sec": wrk_over.non_2xx / max(1, round(seconds)),
        }
        if script is not None
        else {}
    )
    shares = {  # this run's own ratios; overload_median reports their medians
        "over_share": over["ok_qps"] / nominal_qps,
        "over_p99x": over["ok_latency_ms"].get("p99", float("nan")) / nominal_p99,
        "polite_share": polite["ok_qps"] / nominal_qps,
        "polite_p99x": polite["ok_latency_ms"].get("p99", float("nan")) / nominal_p99,
    }
    if wrk_figures:
        shares["wrk_share"] = wrk_figures["wrk_over_ok_qps"] / wrk_figures["wrk_base_qps"]
    return {
        **wrk_figures,
        **shares,
        "base_qps": nominal_qps,
        "base_p99_ms": nominal_p99,
        "base_before_qps": base["ok_qps"],
        "base_after_qps": after["ok_qps"],
        "over_ok_qps": over["ok_qps"],
        "over_ok_p99_ms": over["ok_latency_ms"].get("p99", float("nan")),
        "over_statuses": over["statuses"],
        "over_errors": over["errors"],
        "retry_after_seen": over["retry_after_seen"],
        "rss_before_mib": before,
        "rss_min_mib": min(during),
        "rss_max_mib": max(during),
        "polite_ok_qps": polite["ok_qps"],
        "polite_ok_p99_ms": polite["ok_latency_ms"].get("p99", float("nan")),
        "polite_statuses": polite["statuses"],
        "polite_errors": polite["errors"],
    }


def overload_median(
    payload: Payload, seconds: float, runs: int, http_server: str = DEFAULT_SERVER, script: Path | None = None
) -> dict[str, Any]:
    """`overload` `runs` times: the median of every figure, the statuses and errors of all runs summed."""
    samples = [overload(payload, seconds, http_server, script) for _ in range(runs)]
    merged: dict[str, Any] = {}
    for key, first in samples[0].items():
        if isinstance(first, dict):
            total: dict[str, int] = {}
            for sample in samples:
                for name, count in (sample[key] or {}).items():
                    total[name] = total.get(name, 0) + count
            merged[key] = total
        else:
            merged[key] = median([float(sample[key]) for sample in samples])
    return merged
