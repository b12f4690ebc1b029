"""Ours against a peer: MLServer (Seldon's V2 inference server, uvicorn + FastAPI), serving the same two
models from the same ONNX files with onnxruntime (bench/mlserver_runtime.py), each server pinned to the server
core, wrk on the load core, in interleaved pairs of short slices at 64 connections:

- the digits MLP, one row per request: ours takes `{"instances": [[...]]}` on /invocations, MLServer the V2
  protocol's FP32 tensor on /v2/models/digits/infer;
- the pipeline with a string column (tests/pipeline_model.py, a ColumnTransformer), 32 rows per request: ours
  takes `dataframe_split`, MLServer its pandas codec (`content_type` "pd", one input per column); the same 32
  rows.

MLServer runs in its lightest configuration for one core: inference in the server's own process
(`parallel_workers` 0), no metrics server, no access log (`debug` false). Before timing, both servers'
answers to the two bodies are compared: the same labels, or the bench stops.

    make bench-peers     (builds .bench/peers from bench/peers-requirements.txt once; not part of make test
                          nor make bench; or: .venv/bin/python -m bench.peers --mlserver .bench/peers/bin/mlserver)

It prints ours as a multiple of MLServer (the median of the pairs' own ratios) and never passes or fails on
time.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.pairs import (
    INTERLEAVED_SLICE_SEC,
    PAIR_CONNECTIONS,
    WRK_SCRIPT,
    Payload,
    PinnedServer,
    Samples,
    interleave,
    markdown_table,
    median,
    ratio_cell,
    wrk,
    wrk_side,
)
from bench.peer_requests import v2_first_output, v2_pandas_request, v2_tensor_request
from bench.subjects import (
    ARTIFACT,
    DEFAULT_SERVER,
    SPLIT_ROWS,
    interface,
    ours,
    payloads,
    pipeline_server,
    split_payload,
)
from servestack.local.hosting.processes import REPO_ROOT, free_port

OURS, PEER = "ours", "MLServer"
JSON1, PANDAS32 = "1-row JSON", f"{SPLIT_ROWS}-row pandas"
TARGET = 10.0  # issue 40: ours at least 10x MLServer on both requests


def peer_payloads(scratch: Path) -> dict[str, Payload]:
    """MLServer's bodies: the same row as ours' 1-row JSON, the same 32 rows as ours' `dataframe_split`."""
    rows = np.asarray(json.loads((ARTIFACT / "sample-request.json").read_text())["instances"], dtype=np.float32)
    tensor = scratch / "v2-single.json"
    tensor.write_text(json.dumps(v2_tensor_request(rows[:1])))
    split = json.loads(split_payload(scratch)[0].body_file.read_text())["dataframe_split"]
    columns = {name: [row[i] for row in split["data"]] for i, name in enumerate(split["columns"])}
    frame = scratch / "v2-pandas32.json"
    frame.write_text(json.dumps(v2_pandas_request(columns)))
    return {
        JSON1: Payload(JSON1, tensor, "application/json", 1),
        PANDAS32: Payload(PANDAS32, frame, "application/json", SPLIT_ROWS),
    }


def model_repository(scratch: Path, http_port: int, grpc_port: int) -> Path:
    """MLServer's settings and its two models, each an `OnnxModel` on the ONNX file ours serves."""
    root = scratch / "mlserver"
    pipeline_onnx = split_payload(scratch)[2]
    for name, onnx_file in (("digits", ARTIFACT / "model.onnx"), ("flowers", pipeline_onnx)):
        (root / name).mkdir(parents=True)
        settings = {"name": name, "implementation": "bench.mlserver_runtime.OnnxModel",
                    "parameters": {"uri": str(onnx_file)}}  # fmt: skip
        (root / name / "model-settings.json").write_text(json.dumps(settings))
    server = {"host": "127.0.0.1", "http_port": http_port, "grpc_port": grpc_port, "parallel_workers": 0,
              "metrics_endpoint": None, "debug": False, "load_models_at_startup": True}  # fmt: skip
    (root / "settings.json").write_text(json.dumps(server))
    return root


def start_mlserver(mlserver: Path, root: Path, port: int) -> PinnedServer:
    # PYTHONPATH: MLServer imports the runtime as bench.mlserver_runtime from this repository. Ready once the
    # pipeline is loaded (MLServer answers health before its models load); the probes check the digits model.
    return PinnedServer(
        [str(mlserver), "start", str(root)],
        {"PYTHONPATH": str(REPO_ROOT)},
        port,
        "/v2/health/ready",
        (200,),
        root,
        root / "mlserver.log",
    )


def answer(url: str, payload: Payload) -> Any:
    reply = httpx.post(
        url, content=payload.body_file.read_bytes(), headers={"Content-Type": payload.content_type}, timeout=30
    )
    if reply.status_code != 200:
        sys.exit(f"{url} answered {payload.name} with {reply.status_code}: {reply.text[:300]}")
    return reply.json()


def same_answers(ours_answer: Any, peer_answer: Any) -> bool:
    """Ours answers `predictions`, MLServer the label output: the same labels, as strings (the digits model's
    labels are int64, which MLServer's JSON keeps as numbers)."""
    return [str(label) for label in ours_answer["predictions"]] == [str(v) for v in v2_first_output(peer_answer)]


def compare(mlserver: Path, pairs: int, slice_sec: float, http_server: str) -> dict[str, Samples]:
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        script = scratch / "post.lua"
        script.write_text(WRK_SCRIPT)
        mine = {JSON1: payloads(scratch)["single"], PANDAS32: split_payload(scratch)[0]}
        theirs = peer_payloads(scratch)
        ports = {name: free_port() for name in ("digits", "pipeline", "mlserver", "grpc")}
        servers: list[PinnedServer] = []
        try:
            servers.append(ours(ports["digits"], http_server))
            servers.append(pipeline_server(ports["pipeline"], http_server, split_payload(scratch)[1]))
            root = model_repository(scratch, ports["mlserver"], ports["grpc"])
            servers.append(start_mlserver(mlserver, root, ports["mlserver"]))
            urls = {
                JSON1: (f"http://127.0.0.1:{ports['digits']}/invocations",
                        f"http://127.0.0.1:{ports['mlserver']}/v2/models/digits/infer"),
                PANDAS32: (f"http://127.0.0.1:{ports['pipeline']}/invocations",
                           f"http://127.0.0.1:{ports['mlserver']}/v2/models/flowers/infer"),
            }  # fmt: skip
            groups = {}
            for name, (ours_url, peer_url) in urls.items():
                if not same_answers(answer(ours_url, mine[name]), answer(peer_url, theirs[name])):
                    sys.exit(f"{name}: ours and MLServer answer different labels; nothing to compare")
                wrk(ours_url, 8, 1, mine[name], script)  # warm up
                wrk(peer_url, 8, 1, theirs[name], script)
                groups[name] = [wrk_side(OURS, ours_url, mine[name], script),
                                wrk_side(PEER, peer_url, theirs[name], script)]  # fmt: skip
            print(
                f"ours ({interface(http_server)}) against MLServer, same answers; {pairs} pairs of {slice_sec:g}s "
                f"slices at {PAIR_CONNECTIONS} connections, one core each, order alternating:",
                flush=True,
            )
            return interleave(groups, pairs, slice_sec)
        finally:
            for server in servers:
                server.stop()


def peers_table(found: dict[str, Samples]) -> list[str]:
    rows = [
        [f"{name}, {PAIR_CONNECTIONS} connections", f"{median(samples.rows_per_sec[OURS]):.0f}",
         f"{median(samples.rows_per_sec[PEER]):.0f}", ratio_cell(samples.ratios(OURS, PEER), "x"),
         f"{samples.non_2xx[OURS]} / {samples.non_2xx[PEER]}"]
        for name, samples in found.items()
    ]  # fmt: skip
    header = ("request", "ours, rows/s", "MLServer, rows/s", f"ours / MLServer [>= {TARGET:g}x]", "non-2xx")
    summary = "; ".join(f"{name}: {samples.ratio(OURS, PEER):.1f}x" for name, samples in found.items())
    return [*markdown_table(header, rows), f"ours / MLServer, {summary}"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mlserver", type=Path, default=REPO_ROOT / ".bench" / "peers" / "bin" / "mlserver")
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--slice-sec", type=float, default=INTERLEAVED_SLICE_SEC)
    parser.add_argument("--http-server", choices=("granian", "uvicorn"), default=DEFAULT_SERVER)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None or shutil.which("taskset") is None:
        sys.exit("bench needs wrk and taskset: apt-get install wrk util-linux")
    if not args.mlserver.exists():
        sys.exit(f"no MLServer at {args.mlserver}: `make bench-peers` builds it")
    found = compare(args.mlserver.resolve(), args.pairs, args.slice_sec, args.http_server)
    print("\n".join(peers_table(found)))
    if args.json:
        args.json.write_text(json.dumps({name: vars(samples) for name, samples in found.items()}, indent=2))


if __name__ == "__main__":
    main()
