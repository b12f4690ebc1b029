"""Batch acceptance run: a large JSON Lines input, peak RSS, rows/s next to raw onnxruntime, resume equality.

    .venv/bin/python -m bench.batch_job --rows 1000000

A `moto_server` subprocess (or AWS_ENDPOINT_URL) holds the data. Each job is a real
`servestack local run-batch` process; its peak RSS is the child's `ru_maxrss` (getrusage RUSAGE_CHILDREN,
read after each job, so it is the largest job so far). Run A goes through uninterrupted; run B is
SIGKILLed once about half its parts exist, then rerun; every object under B's output must equal A's
byte for byte. Raw onnxruntime rows/s is measured in this process on the same rows, in the same chunks.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from bench.async_jobs import start_moto
from servestack.local.emulator import aws_environment, clients
from servestack.local.processes import REPO_ROOT
from tests.integration.resources import ensure_bucket

BUCKET = "servestack-bench"  # the bucket rule for deployment "bench"
INPUT = "bench/input/"


def make_input(path: Path, rows: int, files: int) -> list[Path]:
    """`rows` breast-cancer-like rows (dataset rows plus noise), 4 significant digits, over `files` files."""
    from sklearn.datasets import load_breast_cancer

    base = load_breast_cancer().data.astype(np.float32)
    rng = np.random.default_rng(7)
    made: list[Path] = []
    per_file = -(-rows // files)
    for f in range(files):
        target = path / f"part-{f:03d}.jsonl"
        with target.open("w") as out:
            for start in range(f * per_file, min(rows, (f + 1) * per_file), 50_000):
                n = min(50_000, min(rows, (f + 1) * per_file) - start)
                block = base[rng.integers(0, len(base), n)] * rng.uniform(0.95, 1.05, (n, 30)).astype(np.float32)
                out.writelines("[" + ",".join(f"{v:.4g}" for v in row) + "]\n" for row in block.tolist())
        made.append(target)
    return made


def run_job(output: str, spec: Path, url: str, chunk_rows: int, kill_when: Any = None) -> tuple[int, float]:
    started = time.perf_counter()
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "servestack"), "local", "run-batch", "bench", "--spec", str(spec),
         "--endpoint-url", url, "--output-prefix", output, "--chunk-rows", str(chunk_rows)],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    while process.poll() is None:
        if kill_when is not None and kill_when():
            process.send_signal(signal.SIGKILL)
            break
        time.sleep(0.2)
    code = process.wait()
    if process.stdout is not None:
        process.stdout.close()
    return code, time.perf_counter() - started


def objects(s3: Any, prefix: str) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        for o in page.get("Contents", []):
            out[o["Key"].removeprefix(prefix)] = s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read()
    return out


def raw_onnxruntime_rows_per_sec(files: list[Path], chunk: int) -> float:
    """The model alone on the same rows, in the same chunk size (parsing excluded): the ceiling."""
    from models.service import ModelRepository
    from models.settings import ServingSettings

    repository = ModelRepository(ServingSettings(max_batch_rows=chunk))
    repository.load_all()
    model = repository.get("breast-cancer")
    with files[0].open() as f:
        lines = [line for _, line in zip(range(200_000), f, strict=False)]
    data = np.array([[float(v) for v in line.strip()[1:-1].split(",")] for line in lines], dtype=np.float32)
    started = time.perf_counter()
    done = 0
    while done < 1_000_000:
        for start in range(0, len(data), chunk):
            model.predict({"input": data[start : start + chunk]})
        done += len(data)
    return done / (time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--chunk-rows", type=int, default=10_000)
    args = parser.parse_args()
    moto, url = start_moto()
    os.environ.update(aws_environment(url))
    s3 = clients(url)["s3"]
    ensure_bucket(s3, BUCKET)
    work = Path(tempfile.mkdtemp())
    started = time.perf_counter()
    files = make_input(work, args.rows, args.files)
    size = sum(f.stat().st_size for f in files)
    for f in files:
        s3.upload_file(str(f), BUCKET, f"{INPUT}{f.name}")
    print(f"input: {args.rows:,} rows, {size / 1e6:.0f} MB in {len(files)} JSON Lines files "
          f"(made and uploaded in {time.perf_counter() - started:.0f}s)")  # fmt: skip
    spec = work / "serving.yaml"
    spec.write_text(yaml.safe_dump({
        "models": [{"name": "breast-cancer", "version": 1}],
        "deployments": {"bench": {"mode": "batch", "model": "breast-cancer", "input_prefix": INPUT}},
    }))  # fmt: skip

    code, seconds = run_job("bench/whole/", spec, url, args.chunk_rows)
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"run A (uninterrupted): exit {code}, {seconds:.1f}s, {args.rows / seconds:,.0f} rows/s, "
          f"peak RSS {peak_mib:.0f} MiB")  # fmt: skip
    total_parts = -(-args.rows // args.chunk_rows)

    def half_done() -> bool:
        listed = s3.list_objects_v2(Bucket=BUCKET, Prefix="bench/resumed/parts/")
        return int(listed.get("KeyCount", 0)) >= total_parts // 2

    code, seconds = run_job("bench/resumed/", spec, url, args.chunk_rows, kill_when=half_done)
    kept = s3.list_objects_v2(Bucket=BUCKET, Prefix="bench/resumed/parts/").get("KeyCount", 0)
    print(f"run B: SIGKILLed after {seconds:.1f}s (exit {code}) with {kept}/{total_parts} parts written")
    code, seconds = run_job("bench/resumed/", spec, url, args.chunk_rows)
    print(f"run B rerun: exit {code}, {seconds:.1f}s")
    whole, resumed = objects(s3, "bench/whole/"), objects(s3, "bench/resumed/")
    identical = whole == resumed and "manifest.json" in whole
    print(f"B == A byte for byte: {identical} ({len(whole)} objects, {sum(map(len, whole.values())) / 1e6:.0f} MB)")
    print(f"raw onnxruntime (same rows, chunks of {args.chunk_rows}): "
          f"{raw_onnxruntime_rows_per_sec(files, args.chunk_rows):,.0f} rows/s")  # fmt: skip
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"peak RSS of any job process: {peak_mib:.0f} MiB ({'<=' if peak_mib <= 500 else '>'} 500 MB)")
    if moto is not None:
        moto.terminate()
        moto.wait()
    return 0 if identical and peak_mib <= 500 else 1


if __name__ == "__main__":
    sys.exit(main())
