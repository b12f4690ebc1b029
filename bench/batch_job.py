"""Batch acceptance run: a large input, peak RSS, rows/s next to raw onnxruntime, resume equality.

    .venv/bin/python -m bench.batch_job --rows 1000000                       # JSON Lines in, JSON Lines out
    .venv/bin/python -m bench.batch_job --rows 1000000 --input-format parquet --output-format parquet

The input is the same rows either way: JSON Lines files of 30 numbers a line, or those rows as Parquet files of
30 float32 columns (the layout of a feature table). For JSON Lines the bench also prints the floor: the job's
own decoding of the same bytes (servestack/inference/tabular `decode_piece`, in chunks of `--chunk-rows`), in this
process on one core, with nothing else: how far JSON text can go whatever the rest of the job costs.

A `moto_server` subprocess (or AWS_ENDPOINT_URL) holds the data. Each job is a real batch process, the entry
the Fargate task runs (`python -m handlers.batch`, settings from `SERVESTACK_BATCH_*`); its peak RSS is the
child's `ru_maxrss` (getrusage RUSAGE_CHILDREN,
read after each job, so it is the largest job so far). Run A goes through uninterrupted; run B is
SIGKILLed once about half its parts exist, then rerun; every object under B's output must equal A's
byte for byte. Raw onnxruntime rows/s is measured in this process on the same rows, in the same chunks.

The target (issue 13: >= 0.5 of raw onnxruntime) is read on the job's run, from its first read to its manifest:
every stage of the pipeline, S3 to S3. The process's start-up (end to end minus that run: the interpreter,
imports, the model load; ~0.55 s, whatever the job's size) is printed on its own, and with the run as well.
The job runs byte-compiled, as in the images (containers/*.Dockerfile compile every package at build): its
`.pyc` go to a cache of this bench's own (PYTHONPYCACHEPREFIX), which an untimed warm-up job on a small input
fills first. `--from-source` runs it writing none (PYTHONDONTWRITEBYTECODE=1), so that the dependencies compile
at every start, as in an image that does not byte-compile them: about 0.6 CPU s more start-up on this kind of
machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from servestack.local.emulator.moto_server import aws_environment, clients
from servestack.local.hosting.processes import REPO_ROOT, free_port, http_status
from tests.integration.resources import ensure_bucket

BUCKET = "servestack-bench"  # the bucket rule for deployment "bench"
# What the Fargate task definition runs (servestack/cdk/batch.py FARGATE_COMMAND, after `python`; the infra tests
# hold the two equal), from the project's root as the image's PYTHONPATH has it. Not `-m servestack.adapters.batch`:
# on CPython 3.11 running that module as `__main__` costs the start-up ~0.035 CPU s more (its imports run one frame
# deeper, where each call crossing the frame stack's 16 KB chunk maps and unmaps a fresh chunk: ~4,800 mmap/munmap
# pairs and page faults), which the task does not pay.
TASK_ENTRY = ("-m", "handlers.batch")
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


def make_parquet_input(path: Path, jsonl_files: list[Path]) -> list[Path]:
    """The rows of each JSON Lines file as a Parquet file of 30 float32 columns `f0`..`f29` (the float32
    values the job reads from the text)."""
    import pyarrow as pa
    import pyarrow.csv as pa_csv
    import pyarrow.parquet as pq

    made: list[Path] = []
    for source in jsonl_files:
        text = source.read_bytes().translate(None, b"[]")
        width = text[: text.index(b"\n")].count(b",") + 1
        names = [f"f{i}" for i in range(width)]
        table = pa_csv.read_csv(
            pa.py_buffer(text),
            read_options=pa_csv.ReadOptions(column_names=names),
            convert_options=pa_csv.ConvertOptions(column_types=dict.fromkeys(names, pa.float64())),
        )
        table = pa.table({name: table.column(name).cast(pa.float32()) for name in names})
        target = path / source.with_suffix(".parquet").name
        pq.write_table(table, target)
        made.append(target)
    return made


def start_moto() -> tuple[subprocess.Popen[bytes] | None, str]:
    if os.environ.get("AWS_ENDPOINT_URL"):
        return None, os.environ["AWS_ENDPOINT_URL"]
    port = free_port()
    moto = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        if http_status(f"{url}/moto-api/") is not None:
            break
        time.sleep(0.1)
    return moto, url


def pin(cores: int) -> Any:
    """A preexec_fn that keeps the job on its first `cores` CPUs (the issue's target is for one core)."""
    if cores <= 0 or not hasattr(os, "sched_setaffinity"):
        return None
    chosen = set(sorted(os.sched_getaffinity(0))[:cores])
    return lambda: os.sched_setaffinity(0, chosen)


def bytecode_environment(cache: Path, *, from_source: bool) -> dict[str, str]:
    """The job's environment for `.pyc`: written to and read from `cache` only (byte-compiled, as in the
    images), or, `from_source`, none written, so that only those already beside the sources are read (the
    interpreter's own standard library's, as in an image without compiled dependencies). An empty
    PYTHONPYCACHEPREFIX is no prefix to Python."""
    if from_source:
        return {"PYTHONPYCACHEPREFIX": "", "PYTHONDONTWRITEBYTECODE": "1"}
    return {"PYTHONPYCACHEPREFIX": str(cache), "PYTHONDONTWRITEBYTECODE": ""}


def run_job(
    output: str,
    url: str,
    chunk_rows: int,
    kill_when: Any = None,
    cores: int = 1,
    output_format: str = "jsonl",
    *,
    input_prefix: str = INPUT,
    environment: dict[str, str] | None = None,
) -> tuple[int, float, float, float]:
    """(exit code, seconds end to end, seconds of the run itself: from after the model loaded to the manifest,
    as the job reports it, and the CPU seconds of its start-up, as it reports them; nan when it did not)."""
    started = time.perf_counter()
    settings = {"BUCKET": BUCKET, "INPUT_PREFIX": input_prefix, "OUTPUT_PREFIX": output,
                "CHUNK_ROWS": str(chunk_rows), "DEPLOYMENT": "bench", "MODEL": "breast-cancer",
                "OUTPUT_FORMAT": output_format}  # fmt: skip
    process = subprocess.Popen(
        [sys.executable, *TASK_ENTRY],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env={**os.environ, **aws_environment(url), "SERVESTACK_DEFAULT_MODEL": "breast-cancer",
             **(environment or {}), **{f"SERVESTACK_BATCH_{k}": v for k, v in settings.items()}},
        preexec_fn=pin(cores),
    )  # fmt: skip
    # Waiting on the process (not polling it) ends the clock when the job ends; communicate() also drains its
    # stdout (the progress log) as it goes. With kill_when, the wait wakes every 0.2 s to ask; a timed-out
    # communicate() loses no output when called again.
    while True:
        try:
            stdout, _ = process.communicate(timeout=None if kill_when is None else 0.2)
            break
        except subprocess.TimeoutExpired:
            if kill_when():
                process.send_signal(signal.SIGKILL)
                stdout, _ = process.communicate()
                break
    seconds = time.perf_counter() - started
    run_seconds = startup_cpu = float("nan")
    for line in stdout.splitlines():
        if line.startswith(b"{") and b'"run_seconds"' in line:
            outcome = json.loads(line)
            run_seconds, startup_cpu = float(outcome["run_seconds"]), float(outcome["startup_cpu_seconds"])
    return process.returncode, seconds, run_seconds, startup_cpu


def warm_up_input(work: Path, files: list[Path], rows: int = 1000) -> Path:
    """A small input in the format of `files`: the first `rows` rows of the first file."""
    source = files[0]
    target = work / "warm-up" / source.name
    target.parent.mkdir()
    if source.suffix == ".parquet":
        import pyarrow.parquet as pq

        pq.write_table(pq.read_table(source).slice(0, rows), target)
    else:
        with source.open("rb") as lines:
            target.write_bytes(b"".join(line for _, line in zip(range(rows), lines, strict=False)))
    return target


def objects(s3: Any, prefix: str) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        for o in page.get("Contents", []):
            out[o["Key"].removeprefix(prefix)] = s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read()
    return out


@contextlib.contextmanager
def on_the_jobs_core() -> Iterator[None]:
    """This process on the core the job is pinned to (its first CPU), so that what the job is compared with
    runs under the same load as the job did."""
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    if affinity:
        os.sched_setaffinity(0, {min(affinity)})
    try:
        yield
    finally:
        if affinity:
            os.sched_setaffinity(0, affinity)


def raw_onnxruntime_rows_per_sec(files: list[Path], chunk: int) -> tuple[float, float]:
    """The model alone on the same rows, in the same chunk size (parsing excluded), on the job's core: the
    ceiling. (rows/s, CPU seconds per million rows)."""
    from servestack.inference.service import ModelRepository
    from servestack.inference.settings import ServingSettings

    repository = ModelRepository(ServingSettings(max_batch_rows=chunk))
    repository.load_all()
    model = repository.get("breast-cancer")
    with files[0].open() as f:
        lines = [line for _, line in zip(range(200_000), f, strict=False)]
    data = np.array([[float(v) for v in line.strip()[1:-1].split(",")] for line in lines], dtype=np.float32)
    with on_the_jobs_core():
        started, cpu = time.perf_counter(), time.process_time()
        done = 0
        while done < 1_000_000:
            for start in range(0, len(data), chunk):
                model.predict({"input": data[start : start + chunk]})
            done += len(data)
        seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu
    return done / seconds, cpu_seconds * 1e6 / done


def json_floor_rows_per_sec(files: list[Path], chunk: int) -> float:
    """The job's own decoding of JSON Lines (lines found in blocks, cut into chunks, `decode_piece` on each),
    on the bytes of the first input file, in this process pinned to the job's core: the text-to-array floor."""
    from servestack.inference.service import ModelRepository
    from servestack.inference.settings import ServingSettings
    from servestack.inference.tabular.chunking import chunks
    from servestack.inference.tabular.decode import decode_piece
    from servestack.inference.tabular.rows import Progress, block_lines

    repository = ModelRepository(ServingSettings(max_batch_rows=chunk))
    repository.load_all()
    model = repository.get("breast-cancer")
    data = files[0].read_bytes()
    blocks = [data[start : start + (8 << 20)] for start in range(0, len(data), 8 << 20)]
    with on_the_jobs_core():
        started = time.perf_counter()
        rows = 0
        for pieces in chunks(block_lines(blocks, files[0].name, "application/json", Progress()), chunk):
            for piece in pieces:
                decoded = decode_piece(model, piece)
                rows += len(decoded.good)
        seconds = time.perf_counter() - started
    return rows / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--chunk-rows", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3, help="uninterrupted runs; the median is reported")
    parser.add_argument("--cores", type=int, default=1, help="CPUs the job may use (0: all)")
    parser.add_argument("--input-format", choices=("jsonl", "parquet"), default="jsonl")
    parser.add_argument("--output-format", choices=("jsonl", "parquet"), default="jsonl")
    parser.add_argument("--from-source", action="store_true", help="run the job writing no .pyc (see above)")
    args = parser.parse_args()
    moto, url = start_moto()
    os.environ.update(aws_environment(url))
    s3 = clients(url)["s3"]
    ensure_bucket(s3, BUCKET)
    work = Path(tempfile.mkdtemp())
    started = time.perf_counter()
    jsonl_files = make_input(work, args.rows, args.files)
    files = make_parquet_input(work, jsonl_files) if args.input_format == "parquet" else jsonl_files
    size = sum(f.stat().st_size for f in files)
    for f in files:
        s3.upload_file(str(f), BUCKET, f"{INPUT}{f.name}")
    kind = "Parquet (30 float32 columns)" if args.input_format == "parquet" else "JSON Lines"
    print(f"input: {args.rows:,} rows, {size / 1e6:.0f} MB in {len(files)} {kind} files (made and uploaded in "
          f"{time.perf_counter() - started:.0f}s); load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    formats = f"{args.input_format} in, {args.output_format} out"
    bytecode = bytecode_environment(work / "pycache", from_source=args.from_source)
    if not args.from_source:
        warm_up = warm_up_input(work, files)
        s3.upload_file(str(warm_up), BUCKET, f"bench/warm-up-input/{warm_up.name}")
        code, seconds, _, _ = run_job(
            "bench/warm-up/", url, args.chunk_rows, cores=args.cores, output_format=args.output_format,
            input_prefix="bench/warm-up-input/", environment=bytecode,
        )  # fmt: skip
        print(f"warm-up job (untimed; writes the .pyc the runs below read): exit {code}, {seconds:.1f}s")
    rates: list[float] = []
    startups: list[float] = []
    run_rates: list[float] = []
    cpu_per_million: list[float] = []
    startup_cpus: list[float] = []
    for attempt in range(max(1, args.repeat)):
        output = "bench/whole/" if attempt == 0 else f"bench/again-{attempt}/"
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        code, seconds, run_seconds, startup_cpu = run_job(
            output, url, args.chunk_rows, cores=args.cores, output_format=args.output_format, environment=bytecode
        )
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)  # the job's, start-up included
        cpu_per_million.append(cpu * 1e6 / args.rows)
        peak_mib = after.ru_maxrss / 1024
        rates.append(args.rows / seconds)
        run_rates.append(args.rows / run_seconds)
        startups.append(seconds - run_seconds)
        startup_cpus.append(startup_cpu)
        where = f"{args.cores or 'all'} core(s), {formats}"
        print(f"run A{attempt + 1} (uninterrupted, {where}): exit {code}, {seconds:.2f}s, "
              f"{args.rows / seconds:,.0f} rows/s end to end; start-up {seconds - run_seconds:.2f}s; the run "
              f"after start-up {run_seconds:.2f}s, {args.rows / run_seconds:,.0f} rows/s; {cpu:.2f} CPU s "
              f"({startup_cpu:.2f} of them start-up); peak RSS {peak_mib:.0f} MiB")  # fmt: skip
    median = float(np.median(rates))
    run_median = float(np.median(run_rates))
    total_parts = -(-args.rows // args.chunk_rows)

    def half_done() -> bool:
        listed = s3.list_objects_v2(Bucket=BUCKET, Prefix="bench/resumed/parts/")
        return bool(int(listed.get("KeyCount", 0)) >= total_parts // 2)

    code, seconds, _, _ = run_job(
        "bench/resumed/", url, args.chunk_rows, kill_when=half_done, cores=args.cores,
        output_format=args.output_format, environment=bytecode,
    )  # fmt: skip
    kept = s3.list_objects_v2(Bucket=BUCKET, Prefix="bench/resumed/parts/").get("KeyCount", 0)
    print(f"run B: SIGKILLed after {seconds:.1f}s (exit {code}) with {kept}/{total_parts} parts written")
    code, seconds, _, _ = run_job(
        "bench/resumed/", url, args.chunk_rows, cores=args.cores, output_format=args.output_format,
        environment=bytecode,
    )  # fmt: skip
    print(f"run B rerun: exit {code}, {seconds:.1f}s")
    whole, resumed = objects(s3, "bench/whole/"), objects(s3, "bench/resumed/")
    identical = whole == resumed and "manifest.json" in whole
    print(f"B == A byte for byte: {identical} ({len(whole)} objects, {sum(map(len, whole.values())) / 1e6:.0f} MB)")
    raw, raw_cpu = raw_onnxruntime_rows_per_sec(jsonl_files, args.chunk_rows)
    print(f"raw onnxruntime (same rows, chunks of {args.chunk_rows}, on the job's core): {raw:,.0f} rows/s, "
          f"{raw_cpu:.2f} CPU s per million rows")  # fmt: skip
    print(f"batch job, {args.rows:,} rows, {formats}, from its first read to its manifest (S3 in, decode, model, "
          f"encode, checksums, S3 out; the target's measure): median {run_median:,.0f} rows/s of {len(rates)} runs "
          f"= {run_median / raw:.3f} of raw onnxruntime [>= 0.5]; load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"  the same runs with the process's start-up too (interpreter, imports, model load: a fixed cost per job, "
          f"whatever its size): median {median:,.0f} rows/s = {median / raw:.3f} of raw onnxruntime")  # fmt: skip
    pyc = "no .pyc written (--from-source)" if args.from_source else "byte-compiled, as in the images"
    print(f"  start-up (end to end minus the run after start-up; {pyc}): median {np.median(startups):.2f}s")
    job_cpu = float(np.median(cpu_per_million))
    startup_cpu = float(np.median(startup_cpus))
    print(f"  CPU per million rows, the figure to compare (the least disturbed by other load on the machine): the "
          f"job {job_cpu:.2f} s, start-up included ({startup_cpu * 1e6 / args.rows:.2f} s of it; start-up "
          f"{startup_cpu:.2f} CPU s a job), raw onnxruntime {raw_cpu:.2f} s: the job spends {job_cpu / raw_cpu:.2f}x "
          f"raw's [<= 2x]; {(job_cpu - startup_cpu * 1e6 / args.rows) / raw_cpu:.2f}x without start-up")  # fmt: skip
    if args.input_format == "jsonl":
        floor = json_floor_rows_per_sec(jsonl_files, args.chunk_rows)
        print(f"JSON Lines floor (the job's decoding alone, one core): {floor:,.0f} rows/s = {floor / raw:.3f} of raw")
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"peak RSS of any job process: {peak_mib:.0f} MiB ({'<=' if peak_mib <= 500 else '>'} 500 MB)")
    if moto is not None:
        moto.terminate()
        moto.wait()
    return 0 if identical and peak_mib <= 500 else 1


if __name__ == "__main__":
    sys.exit(main())
