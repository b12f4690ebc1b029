"""Snapshot and restore of the embedded emulator's state: N objects, N messages, N items.

    .venv/bin/python -m bench.emulator_state --count 1000 [--large-mib 256]

Fills an embedded moto server (`EmbeddedEmulator`, as `local up` runs it) over HTTP with boto3, then prints
how long `EmulatorState` takes to: write the first snapshot; check for changes when there are none (what
autosave does every interval); save after one message is received and after one object is put; restore
everything in a fresh interpreter (a second process, as after a restart). `--large-mib` adds one object of
that size (put through moto's backend, not HTTP) to show that unchanged blobs are not written again.
Prints figures; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from servestack.local.emulator.moto_server import EmbeddedEmulator, clients
from servestack.local.emulator.persistence import EmulatorState
from servestack.local.hosting.processes import REPO_ROOT

BUCKET, QUEUE, TABLE = "bench-state", "bench-state-jobs", "bench-state-table"
REPEAT = 7  # steady-state figures: the fastest and the median of this many runs (this machine is shared)


def create_resources(aws: dict[str, Any]) -> str:
    aws["s3"].create_bucket(Bucket=BUCKET)
    aws["dynamodb"].create_table(
        TableName=TABLE,
        KeySchema=[{"AttributeName": "job_id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "job_id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    return str(aws["sqs"].create_queue(QueueName=QUEUE)["QueueUrl"])


def fill(aws: dict[str, Any], queue: str, count: int, object_bytes: int) -> None:
    for i in range(count):
        aws["s3"].put_object(Bucket=BUCKET, Key=f"results/{i:06d}.json", Body=(b"%06d" % i) * (object_bytes // 6))
    for start in range(0, count, 10):
        entries = [
            {"Id": str(i), "MessageBody": json.dumps({"job_id": f"job-{i:06d}", "bucket": BUCKET})}
            for i in range(start, min(start + 10, count))
        ]
        aws["sqs"].send_message_batch(QueueUrl=queue, Entries=entries)
    for start in range(0, count, 25):
        requests = [
            {
                "PutRequest": {
                    "Item": {
                        "job_id": {"S": f"job-{i:06d}"},
                        "status": {"S": "queued"},
                        "created_at": {"N": str(1_800_000_000 + i)},
                        "expires_at": {"N": str(1_900_000_000 + i)},
                        "input": {"M": {"bucket": {"S": BUCKET}, "key": {"S": f"uploads/{i:06d}.json"}}},
                    }
                }
            }
            for i in range(start, min(start + 25, count))
        ]
        aws["dynamodb"].batch_write_item(RequestItems={TABLE: requests})


def peak_rss_mib() -> float:
    """This process's peak RSS: VmHWM on Linux (ru_maxrss survives execve there, so a child reports its parent's)."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(label: str, action: Any, *, before: Any = None, repeat: int = 1) -> Any:
    """Run `action` `repeat` times (`before` untimed ahead of each); print the fastest and the median run."""
    seconds, result = [], None
    for _ in range(repeat):
        if before is not None:
            before()
        started = time.perf_counter()
        result = action()
        seconds.append(time.perf_counter() - started)
    figures = f"{1000 * min(seconds):8.1f} ms"
    if repeat > 1:
        figures += f"  (median {1000 * statistics.median(seconds):.1f} ms of {repeat})"
    print(f"{label:<48} {figures}", flush=True)
    return result


def restore_in_new_process(directory: Path) -> None:
    """Run in the second interpreter: create the resources as local up would, restore, print the figures."""
    started = time.perf_counter()
    emulator = EmbeddedEmulator()
    aws = clients(emulator.url)
    create_resources(aws)
    print(f"new interpreter: emulator up, resources created  {time.perf_counter() - started:8.1f} s", flush=True)
    summary = timed("restore (fresh interpreter)", EmulatorState(directory).restore)
    for line in summary.lines():
        print(line)
    print(f"peak RSS of the restoring process: {peak_rss_mib():.0f} MiB")
    emulator.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=1000, help="objects, messages and items (each)")
    parser.add_argument("--object-bytes", type=int, default=1024)
    parser.add_argument("--large-mib", type=int, default=0, help="add one object of this many MiB")
    parser.add_argument("--restore", type=Path, help=argparse.SUPPRESS)  # the second interpreter
    args = parser.parse_args()
    if args.restore:
        restore_in_new_process(args.restore)
        return 0

    emulator = EmbeddedEmulator()
    aws = clients(emulator.url)
    queue = create_resources(aws)
    started = time.perf_counter()
    fill(aws, queue, args.count, args.object_bytes)
    print(
        f"filled {args.count} objects of {args.object_bytes} B, {args.count} messages, {args.count} items "
        f"over HTTP in {time.perf_counter() - started:.1f} s"
    )
    if args.large_mib:
        from moto.s3.models import s3_backends

        s3_backends["123456789012"]["aws"].put_object(BUCKET, "uploads/large.bin", b"\x5a" * (args.large_mib << 20))
        print(f"added one object of {args.large_mib} MiB (moto's put holds it in memory twice: peak RSS before)")

    peak_before_mib = peak_rss_mib()
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch) / "state"
        state = EmulatorState(directory)
        first = timed("first snapshot (every blob written)", state.snapshot)
        print(f"  {first.blobs_written} blobs, {first.blob_bytes_written / 1e6:.1f} MB, {first.parts_written} parts")
        timed("autosave check, nothing changed", state.save_if_changed, repeat=REPEAT)
        again = timed("snapshot again, nothing changed (forced)", state.snapshot, repeat=REPEAT)
        print(f"  {again.blobs_written} blobs and {again.parts_written} parts written")

        def receive_one() -> None:
            aws["sqs"].receive_message(QueueUrl=queue, VisibilityTimeout=60)

        one = timed("autosave after one message was received", state.save_if_changed, before=receive_one, repeat=REPEAT)
        print(f"  {one.blobs_written} blobs and {one.parts_written} parts written")
        puts = iter(range(REPEAT))

        def put_one() -> None:
            n = next(puts)
            aws["s3"].put_object(Bucket=BUCKET, Key=f"results/new-{n}.json", Body=b'{"n": %d}' % n)

        one = timed("autosave after one object was put", state.save_if_changed, before=put_one, repeat=REPEAT)
        print(f"  {one.blobs_written} blobs and {one.parts_written} parts written")
        on_disk = sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
        print(f"state directory: {on_disk / 1e6:.1f} MB in {sum(1 for _ in directory.rglob('*'))} entries")
        emulator.stop()
        subprocess.run(
            [sys.executable, "-m", "bench.emulator_state", "--restore", str(directory)], cwd=REPO_ROOT, check=True
        )
    print(f"peak RSS of the snapshotting process: {peak_before_mib:.0f} MiB before the snapshots, "
          f"{peak_rss_mib():.0f} MiB after (objects are copied in 8 MiB chunks)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
