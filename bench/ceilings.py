"""Every realtime row against its own ceiling: the 1-row JSON row, the 32-row `.npy` row (digits MLP) and the
32-row `dataframe_split` row (the pipeline with a string column), each measured in interleaved pairs against
the HTTP ceiling on the same body (bench/ceiling_server.py: a constant answer on the same HTTP server and
interface, so the most any app there could show) and, as information, against raw onnxruntime on the same
arrays. Three servers are up throughout (the ceiling, ours with the digits model, ours with the pipeline), all
on the server core; only the one being loaded works.

    .venv/bin/python -m bench.realtime --only rows --pairs 7     (also the last table of `make bench`)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.pairs import (
    INTERLEAVED_SLICE_SEC,
    PAIR_CONNECTIONS,
    Payload,
    PinnedServer,
    Samples,
    Side,
    Slice,
    interleave,
    markdown_table,
    median,
    ratio_cell,
    wrk,
    wrk_side,
)
from bench.subjects import (
    SPLIT_ROWS,
    ceiling,
    interface,
    ours,
    payloads,
    pipeline_server,
    raw_onnxruntime_rows_per_sec,
    raw_pipeline_rows_per_sec,
    split_payload,
)
from servestack.local.hosting.processes import free_port

OURS, CEILING, RAW = "ours", "ceiling", "raw onnxruntime"
JSON1, NPY32, SPLIT32 = "1-row JSON", "32-row .npy", "32-row dataframe_split"
ROWS = (JSON1, NPY32, SPLIT32)


@dataclass(frozen=True)
class Row:
    name: str
    payload: Payload
    model_dir: Path | None  # ours serves the pipeline from here; None: the digits model
    raw: Callable[[float], float]  # raw onnxruntime's rows/s over a slice of that many seconds


def rows(scratch: Path, names: Sequence[str] = ROWS) -> list[Row]:
    p = payloads(scratch)
    chosen = []
    if JSON1 in names:
        chosen.append(Row(JSON1, p["single"], None, lambda seconds: raw_onnxruntime_rows_per_sec(1, seconds)))
    if NPY32 in names:
        chosen.append(Row(NPY32, p["npy32"], None, lambda seconds: raw_onnxruntime_rows_per_sec(32, seconds)))
    if SPLIT32 in names:  # builds the pipeline (a few seconds): only when asked for
        split, model_dir, onnx_file, columns = split_payload(scratch)
        chosen.append(Row(SPLIT32, split, model_dir, lambda s: raw_pipeline_rows_per_sec(onnx_file, columns, s)))
    return chosen


def probe(url: str, payload: Payload) -> str | None:
    """None when `url` answers `payload` with a 200, else what it answered (a refusal is reported, not timed)."""
    answer = httpx.post(
        url, content=payload.body_file.read_bytes(), headers={"Content-Type": payload.content_type}, timeout=30
    )
    return None if answer.status_code == 200 else f"{answer.status_code} {answer.text[:300]}"


def measure_rows(
    scratch: Path, script: Path, http_server: str, pairs: int, names: Sequence[str] = ROWS,
    slice_sec: float = INTERLEAVED_SLICE_SEC,
) -> dict[str, Samples | str]:  # fmt: skip
    """Each row's samples (ours, its ceiling, raw onnxruntime: one slice each per pair), or why it was not
    measured (ours refused the body)."""
    chosen = rows(scratch, names)
    ports = {"ceiling": free_port(), "digits": free_port(), "pipeline": free_port()}
    servers: list[PinnedServer] = [ceiling(ports["ceiling"], http_server)]
    try:
        if any(row.model_dir is None for row in chosen):
            servers.append(ours(ports["digits"], http_server))
        servers += [pipeline_server(ports["pipeline"], http_server, r.model_dir) for r in chosen if r.model_dir]
        ceiling_url = f"http://127.0.0.1:{ports['ceiling']}/invocations"
        groups: dict[str, list[Side]] = {}
        refused: dict[str, str] = {}
        for row in chosen:
            url = f"http://127.0.0.1:{ports['digits' if row.model_dir is None else 'pipeline']}/invocations"
            if (why := probe(url, row.payload)) is not None:
                refused[row.name] = why
                continue
            for target in (url, ceiling_url):
                wrk(target, 8, 1, row.payload, script)  # warm up
            groups[row.name] = [
                wrk_side(OURS, url, row.payload, script),
                wrk_side(CEILING, ceiling_url, row.payload, script),
                Side(RAW, lambda seconds, row=row: Slice(row.raw(seconds))),
            ]
        print(
            f"rows against their own ceilings ({pairs} pairs of {slice_sec:g}s slices at {PAIR_CONNECTIONS} "
            f"connections, ours on {interface(http_server)}, order alternating):",
            flush=True,
        )
        found: dict[str, Samples | str] = dict(interleave(groups, pairs, slice_sec))
    finally:
        for server in servers:
            server.stop()
    found.update(refused)
    return {name: found[name] for name in names if name in found}


def ceilings_table(found: dict[str, Samples | str], http_server: str) -> list[str]:
    """One line per row: ours' rows/s, ours / its own ceiling, ours / raw onnxruntime (information), and the
    ceiling / raw (what the HTTP exchange alone leaves of raw); medians of the pairs' own ratios, their range in
    brackets."""
    lines = [f"every realtime row against its own ceiling (servestack on {interface(http_server)}, one core):"]
    table = []
    for name, samples in found.items():
        if isinstance(samples, str):
            table.append([name, f"not measured: ours answers {samples}", "", "", ""])
            continue
        refusals = samples.non_2xx[OURS]
        table.append([
            f"{name}, {PAIR_CONNECTIONS} connections",
            f"{median(samples.rows_per_sec[OURS]):.0f}" + (f" (non-2xx {refusals})" if refusals else ""),
            ratio_cell(samples.ratios(OURS, CEILING)),
            ratio_cell(samples.ratios(OURS, RAW)),
            ratio_cell(samples.ratios(CEILING, RAW)),
        ])  # fmt: skip
    header = ("row", "ours, rows/s", "ours / its ceiling", "ours / raw onnxruntime (information)", "ceiling / raw")
    return lines + markdown_table(header, table)


def split_figures(found: dict[str, Samples | str]) -> dict[str, Any]:
    """Issue 23's row as figures: `refused`, or ours, the ceiling and raw (rows/s per pair) and the ratios."""
    samples = found[SPLIT32]
    if isinstance(samples, str):
        return {"refused": samples}
    return {
        "rows": SPLIT_ROWS, **samples.rows_per_sec, "non_2xx": samples.non_2xx[OURS],
        "ratio": samples.ratio(OURS, RAW), "of_ceiling": samples.ratio(OURS, CEILING),
        "ceiling_ratio": samples.ratio(CEILING, RAW),
    }  # fmt: skip


def print_split_row(split: dict[str, Any]) -> None:
    """Issue 23's row, in the table's style (target in brackets)."""
    print("| path | this run |")
    print("| --- | --- |")
    if "refused" in split:
        print(f"| 32-row `dataframe_split`, pipeline with a string column | not measured: the server answers "
              f"{split['refused']} |")  # fmt: skip
        return
    print(
        f"| 32-row `dataframe_split` per request (pipeline with a string column), {PAIR_CONNECTIONS} connections | "
        f"{median(split[OURS]):.0f} rows/s = {split['ratio']:.2f} of raw onnxruntime at batch 32 on the same "
        f"arrays ({median(split[RAW]):.0f} rows/s) [>= 0.35]; {split['of_ceiling']:.2f} of the HTTP ceiling on the "
        f"same body, which is itself {split['ceiling_ratio']:.2f} of raw; non-2xx {split['non_2xx']} |"
    )
