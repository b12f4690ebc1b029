"""A batch job's CPU before and after a change, in interleaved pairs of whole jobs.

    .venv/bin/python -m bench.batch_pairs --before /tmp/before --pairs 10     # /tmp/before: `git archive <rev>`

Each pair runs the Fargate task's entry (`python -m handlers.batch`, bench/batch_job.py TASK_ENTRY) once from the
tree given as `--before` and once from this one, on the same Parquet input (bench/batch_job.py's rows, Parquet in
and out), pinned to one core, the order alternating from pair to pair; each job writes to an output prefix of its
own, emptied after it. A job's CPU is its user and system time (getrusage of the child), start-up and exit included:
what a shared machine moves least. Printed: each pair, each side's median and range, and the median of the pairs'
own differences with their range (bench/pairs.py says why pairs). Each tree's first job is an untimed warm-up that
writes its `.pyc` (to a cache of its own, as the images byte-compile).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.batch_job import BUCKET, INPUT, TASK_ENTRY, make_input, make_parquet_input, pin, start_moto
from servestack.local.emulator.moto_server import aws_environment, clients
from servestack.local.hosting.processes import REPO_ROOT
from tests.integration.resources import ensure_bucket


def job(tree: Path, url: str, output: str, chunk_rows: int, cache: Path) -> tuple[float, float]:
    """(CPU seconds of one job run from `tree`, start-up CPU seconds as the job reports them)."""
    settings = {"BUCKET": BUCKET, "INPUT_PREFIX": INPUT, "OUTPUT_PREFIX": output, "CHUNK_ROWS": str(chunk_rows),
                "DEPLOYMENT": "bench", "MODEL": "breast-cancer", "OUTPUT_FORMAT": "parquet"}  # fmt: skip
    environment = {**os.environ, **aws_environment(url), "SERVESTACK_DEFAULT_MODEL": "breast-cancer",
                   "PYTHONPATH": str(tree), "PYTHONPYCACHEPREFIX": str(cache), "PYTHONDONTWRITEBYTECODE": "",
                   **{f"SERVESTACK_BATCH_{k}": v for k, v in settings.items()}}  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [sys.executable, *TASK_ENTRY],
        cwd=tree, env=environment, capture_output=True, preexec_fn=pin(1), check=False,
    )  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise RuntimeError(f"the job from {tree} failed ({done.returncode}): {done.stderr.decode()[-2000:]}")
    outcome = json.loads(done.stdout.splitlines()[-1])
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return cpu, float(outcome["startup_cpu_seconds"])


def empty(s3: Any, prefix: str) -> None:
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        for found in page.get("Contents", []):
            s3.delete_object(Bucket=BUCKET, Key=found["Key"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--before", type=Path, required=True, help="a tree of the code before the change")
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--chunk-rows", type=int, default=50_000)
    args = parser.parse_args()
    moto, url = start_moto()
    os.environ.update(aws_environment(url))
    s3 = clients(url)["s3"]
    ensure_bucket(s3, BUCKET)
    work = Path(tempfile.mkdtemp())
    for made in make_parquet_input(work, make_input(work, args.rows, 4)):
        s3.upload_file(str(made), BUCKET, f"{INPUT}{made.name}")
    trees = {"before": args.before.resolve(), "after": REPO_ROOT}
    cpu: dict[str, list[float]] = {side: [] for side in trees}
    startup: dict[str, list[float]] = {side: [] for side in trees}
    for side, tree in trees.items():  # warm-up: each tree's .pyc
        job(tree, url, f"pairs/{side}/", args.chunk_rows, work / f"pycache-{side}")
        empty(s3, f"pairs/{side}/")
    for pair in range(args.pairs):
        for side in trees if pair % 2 == 0 else reversed(trees):
            used, started = job(trees[side], url, f"pairs/{side}/", args.chunk_rows, work / f"pycache-{side}")
            empty(s3, f"pairs/{side}/")
            cpu[side].append(used)
            startup[side].append(started)
        print(f"pair {pair + 1}: before {cpu['before'][-1]:.3f} CPU s (start-up {startup['before'][-1]:.3f}), "
              f"after {cpu['after'][-1]:.3f} (start-up {startup['after'][-1]:.3f}); "
              f"load average {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    for side in trees:
        print(f"{side}: median {statistics.median(cpu[side]):.3f} CPU s ({min(cpu[side]):.3f}-{max(cpu[side]):.3f}), "
              f"start-up median {statistics.median(startup[side]):.3f}")  # fmt: skip
    saved = [b - a for b, a in zip(cpu["before"], cpu["after"], strict=True)]
    print(f"before - after, the pairs' own differences: median {statistics.median(saved):+.3f} CPU s "
          f"({min(saved):+.3f} to {max(saved):+.3f}; {sum(s > 0 for s in saved)} of {len(saved)} pairs less after); "
          f"load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    if moto is not None:
        moto.terminate()
        moto.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
