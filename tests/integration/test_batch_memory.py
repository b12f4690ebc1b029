"""Peak resident memory of the batch job (`python -m servestack.adapters.batch`, the Fargate task's entry, as a child
process on a real S3 endpoint) on hostile input, against the job's memory setting.

The peak is the child's own (`RUSAGE_CHILDREN` of a wrapper whose only child is the job), so the test process's
memory (and the S3 server's, which runs in it) is not counted. Each hostile run is compared with the same job
over a few ordinary rows: the hostile line or file may cost little more than that. The bound is a quarter of
serving.yaml's default memory for the runner that reads the format (Lambda for lines, Fargate for Parquet,
which the Lambda bundle cannot read), so the job keeps three quarters for its model and its chunks.

A run may also be capped, as a container's memory limit caps it: the wrapper kills the job as soon as its
resident size passes the cap (the kernel's OOM killer, in effect), and the run then fails the test.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sklearn.datasets import load_breast_cancer

from servestack.inference.tabular.parquet_reading import MAX_CHUNK_DECODED_BYTES
from servestack.spec import BatchDeployment
from tests.conftest import REPO_ROOT
from tests.integration.conftest import Aws
from tests.integration.resources import ensure_bucket
from tests.tabular_fixtures import site_package

pytestmark = [pytest.mark.localstack, pytest.mark.slow]

MIB = 1024 * 1024
LAMBDA_MEMORY = BatchDeployment.model_fields["memory_mib"].default * MIB
FARGATE_MEMORY = BatchDeployment.model_fields["fargate_memory_mib"].default * MIB
# What a hostile input may add to the peak of the same job over ordinary rows: a few of the 8 MiB blocks the
# job reads from S3 at a time, and the 1 MiB record limit.
GROWTH_BOUND = 64 * MIB
ROWS = load_breast_cancer().data.astype(np.float32)[:4]
HUGE_LINE_BYTES = 100 * 1000 * 1000

WRAPPER = """
import json, os, resource, subprocess, sys, tempfile, threading
cap = int(os.environ.pop("TEST_RSS_CAP", "0"))
with tempfile.TemporaryFile() as err:
    job = subprocess.Popen([sys.executable, "-m", "servestack.adapters.batch"], stdout=subprocess.DEVNULL, stderr=err)
    killed = []
    def watch():  # the job's resident size, every 10 ms: past the cap it is killed, as a container would be
        status = f"/proc/{job.pid}/status"
        while job.poll() is None:
            try:
                with open(status) as handle:
                    rss = next((int(line.split()[1]) * 1024 for line in handle if line.startswith("VmRSS:")), 0)
            except OSError:
                return
            if rss > cap:
                killed.append(rss)
                job.kill()
                return
            threading.Event().wait(0.01)
    if cap:
        threading.Thread(target=watch, daemon=True).start()
    rc = job.wait()
    err.seek(0)
    stderr = err.read().decode(errors="replace")[-2000:]
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
print(json.dumps({"rc": rc, "peak": peak, "killed_at": killed[0] if killed else None, "stderr": stderr}))
"""


def job_peak_rss(bucket: str, prefix: str, *, cap: int = 0, env: dict[str, str] | None = None) -> int:
    """Run the batch job over `in/<prefix>` as a child process; its peak resident size in bytes. With `cap`, the
    job is killed the moment its resident size passes `cap` bytes, which fails the test."""
    environment = os.environ | {
        "SERVESTACK_BATCH_BUCKET": bucket,
        "SERVESTACK_BATCH_INPUT_PREFIX": f"in/{prefix}",
        "SERVESTACK_BATCH_OUTPUT_PREFIX": f"out/{prefix}",
        "SERVESTACK_BATCH_MODEL": "breast-cancer",
        "SERVESTACK_BATCH_CHUNK_ROWS": "1000",
        "TEST_RSS_CAP": str(cap),
    }
    done = subprocess.run(
        [sys.executable, "-c", WRAPPER],
        env=environment | (env or {}),
        cwd=REPO_ROOT,
        capture_output=True,
        check=True,
        timeout=240,
    )
    report = json.loads(done.stdout)
    assert report["killed_at"] is None, f"killed at {report['killed_at']} bytes, over the cap of {cap}"
    assert report["rc"] == 0, report["stderr"]
    return int(report["peak"])


def rows_text(suffix: str) -> list[bytes]:
    if suffix == ".jsonl":
        return [json.dumps(row.tolist()).encode() for row in ROWS]
    return [",".join(map(str, row.tolist())).encode() for row in ROWS]


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_a_100_mb_line_costs_the_job_little_more_than_ordinary_rows(aws: Aws, unique: str, suffix: str) -> None:
    # GIVEN ordinary rows, and the same rows around one line of 100 MB of numbers
    ensure_bucket(aws.s3, unique)
    ordinary = rows_text(suffix)
    huge = (
        b"[" + b"1.5," * (HUGE_LINE_BYTES // 4) + b"1]"
        if suffix == ".jsonl"
        else b"1.5," * (HUGE_LINE_BYTES // 4) + b"1"
    )
    aws.s3.put_object(Bucket=unique, Key=f"in/plain/a{suffix}", Body=b"\n".join(ordinary) + b"\n")
    aws.s3.put_object(Bucket=unique, Key=f"in/huge/a{suffix}", Body=b"\n".join([*ordinary[:2], huge, *ordinary[2:]]))
    # WHEN the job scores each
    plain = job_peak_rss(unique, "plain/")
    hostile = job_peak_rss(unique, "huge/")
    print(f"{suffix}: peak RSS {plain / MIB:.0f} MiB on ordinary rows, {hostile / MIB:.0f} MiB with a 100 MB line")
    # THEN the long line is an error row and the others are scored
    manifest = json.loads(aws.s3.get_object(Bucket=unique, Key="out/huge/manifest.json")["Body"].read())
    assert manifest["rows"] == {"total": 5, "succeeded": 4, "failed": 1}
    # AND it cost the job at most GROWTH_BOUND more than ordinary rows, within a quarter of its memory
    assert hostile - plain < GROWTH_BOUND
    assert hostile < LAMBDA_MEMORY / 4


def test_a_one_row_parquet_file_of_300000_columns_costs_the_job_little(aws: Aws, unique: str, tmp_path: Path) -> None:
    # GIVEN ordinary Parquet rows, and a one-row Parquet file of 300,000 columns (written by a child process:
    # building it takes pyarrow ~1.3 GB and half a minute)
    ensure_bucket(aws.s3, unique)
    wide = tmp_path / "wide.parquet"
    subprocess.run([sys.executable, "-c", WIDE_WRITER, str(wide)], check=True, timeout=240, capture_output=True)
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_arrays([pa.array(ROWS[:, i]) for i in range(30)], [f"f{i}" for i in range(30)]), sink)
    aws.s3.put_object(Bucket=unique, Key="in/plain/a.parquet", Body=sink.getvalue())
    aws.s3.put_object(Bucket=unique, Key="in/wide/a.parquet", Body=sink.getvalue())
    aws.s3.put_object(Bucket=unique, Key="in/wide/b.parquet", Body=wide.read_bytes())
    # WHEN the job scores each
    plain = job_peak_rss(unique, "plain/")
    hostile = job_peak_rss(unique, "wide/")
    print(f"parquet: peak RSS {plain / MIB:.0f} MiB on ordinary rows, {hostile / MIB:.0f} MiB with 300,000 columns")
    # THEN the wide file is one error record, and the other file is scored
    manifest = json.loads(aws.s3.get_object(Bucket=unique, Key="out/wide/manifest.json")["Body"].read())
    assert manifest["rows"] == {"total": 5, "succeeded": 4, "failed": 1}
    assert [entry["outcome"] for entry in manifest["inputs"]] == ["read", "failed"]
    # AND it cost the job at most GROWTH_BOUND more than ordinary rows, within a quarter of its memory
    assert hostile - plain < GROWTH_BOUND
    assert hostile < FARGATE_MEMORY / 4


WIDE_WRITER = """
import sys
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
schema = pa.schema([pa.field(f"c{i}", pa.float32()) for i in range(300_000)])
column = pa.array(np.zeros(1, np.float32))
with pq.ParquetWriter(sys.argv[1], schema, write_statistics=False, use_dictionary=False, compression="none") as out:
    out.write_batch(pa.RecordBatch.from_arrays([column] * 300_000, schema=schema))
"""


def test_a_parquet_file_of_one_string_repeated_300000_times_is_scored_within_the_chunk_budget(
    aws: Aws, unique: str, tmp_path: Path
) -> None:
    # GIVEN a model that takes a string column (any text: tests/tabular_fixtures.py `site_package`), good rows in
    # three files, and beside them a 68 KB Parquet file: one dictionary-encoded 2,000-character string over
    # 300,000 rows in one row group (600 MB decoded; it took the job to 1.7 GB)
    site_package(tmp_path / "models")
    ensure_bucket(aws.s3, unique)
    good = {
        "a.jsonl": "\n".join(json.dumps({"site": site}) for site in ["north", "south", "east"] * 11).encode(),
        "b.csv": ("site\n" + "\n".join(["south", "west", "north"] * 12) + "\n").encode(),
    }
    sink = io.BytesIO()
    pq.write_table(pa.table({"site": ["east", "north"] * 16}), sink)
    good["c.parquet"] = sink.getvalue()
    hostile = io.BytesIO()
    pq.write_table(pa.table({"site": pa.array(["x" * 2000] * 300_000)}), hostile, use_dictionary=True,
                   row_group_size=300_000)  # fmt: skip
    assert len(hostile.getvalue()) < 70_000
    for name, body in good.items():
        for prefix in ("plain", "hostile"):
            aws.s3.put_object(Bucket=unique, Key=f"in/{prefix}/{name}", Body=body)
    aws.s3.put_object(Bucket=unique, Key="in/hostile/d.parquet", Body=hostile.getvalue())
    env = {
        "SERVESTACK_MODEL_DIR": str(tmp_path / "models"),
        "SERVESTACK_DEFAULT_MODEL": "sites",
        "SERVESTACK_BATCH_MODEL": "sites",
        "SERVESTACK_BATCH_CHUNK_ROWS": "10000",  # the default: a chunk of these rows decodes to 20 MB
    }
    # WHEN the job scores the good files, then the same beside the hostile one, under a cap of the first run's
    # peak plus twice the documented chunk budget (the chunk being scored, and one read ahead)
    plain = job_peak_rss(unique, "plain/", env=env)
    cap = plain + 2 * MAX_CHUNK_DECODED_BYTES
    hostile_peak = job_peak_rss(unique, "hostile/", cap=cap, env=env)
    print(f"parquet strings: peak RSS {plain / MIB:.0f} MiB on ordinary rows, {hostile_peak / MIB:.0f} MiB with "
          f"300,000 rows of 2,000 characters (cap {cap / MIB:.0f} MiB)")  # fmt: skip
    # THEN it ran within the cap, and the manifest accounts for every row: the 101 good ones and the 300,000
    manifest = json.loads(aws.s3.get_object(Bucket=unique, Key="out/hostile/manifest.json")["Body"].read())
    assert manifest["rows"] == {"total": 300_101, "succeeded": 300_101, "failed": 0}
    assert [entry["outcome"] for entry in manifest["inputs"]] == ["read"] * 4
    assert hostile_peak < FARGATE_MEMORY / 4
