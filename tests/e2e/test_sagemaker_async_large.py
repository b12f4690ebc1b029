"""A 200 MB SageMaker async job through the whole `local up` (issue 38): the payload uploaded to the emulator's S3
as a developer's boto3 does it, `InvokeEndpointAsync` on cancer-sm (tests/e2e/conftest.py's SHARED_SPEC), the
stand-in streaming the object to the container and the container's answer back to S3, and the container's peak
memory read from /proc once the answer is in: under three times the payload, as the issue asks.

The peak is the sum of the container's processes' VmHWM (the most resident memory each ever held, file-backed
pages of the spooled body included): its master and its serving workers. The router's and local up's peaks during
the job are printed beside it, for the record (local up's process holds the embedded emulator, which reads an
object whole to serve it, and joins a multipart upload's parts in memory)."""

from __future__ import annotations

import io
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from botocore.exceptions import ClientError

from tests.e2e.conftest import LocalUp
from tests.waiting import wait_for

pytestmark = pytest.mark.slow
FEATURES = 30  # breast-cancer: float32 x 30 per row
PAYLOAD_BYTES = 200_000_000
ROWS = PAYLOAD_BYTES // (4 * FEATURES)
ROWS_PER_WRITE = 200_000  # the test's own memory: the array is written to its file a slice at a time


@pytest.fixture(scope="module")
def up(shared_up: LocalUp) -> LocalUp:
    return shared_up


def memory_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise LookupError(field)


def processes() -> dict[int, tuple[int, bytes]]:
    """pid -> (parent pid, command line) of every process, from /proc (Linux)."""
    found: dict[int, tuple[int, bytes]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            command = (proc / "cmdline").read_bytes()
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        found[int(proc.name)] = (parent, command)
    return found


def descendants(table: dict[int, tuple[int, bytes]], root: int) -> list[int]:
    found, frontier = [], [root]
    while frontier:
        current = frontier.pop()
        children = [pid for pid, (parent, _) in table.items() if parent == current]
        found += children
        frontier += children
    return found


def container_processes(up: LocalUp, container_url: str) -> tuple[int, int, list[int]]:
    """The endpoint's router (started with `--port` of the container URL local up records), its realtime
    container (`python -m servestack.adapters.realtime serve`, or the image's `handlers.realtime serve`), and the
    container's serving workers."""
    table = processes()
    port = container_url.rsplit(":", 1)[1].encode()
    mine = descendants(table, up.process.pid)
    (router,) = [
        pid
        for pid in mine
        if b"servestack.local.sagemaker.endpoint" in table[pid][1] and b"\0--port\0" + port + b"\0" in table[pid][1]
    ]
    (container,) = [
        pid
        for pid, (parent, command) in table.items()
        if parent == router and (b"servestack.adapters.realtime" in command or b"handlers.realtime\0serve" in command)
    ]
    workers = descendants(table, container)
    assert workers, "the container's serving workers"
    return router, container, workers


def write_payload(path: Path) -> None:
    """A float32 (ROWS, FEATURES) .npy, about PAYLOAD_BYTES, values around the training data's scale."""
    rng = np.random.default_rng(38)
    array = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(ROWS, FEATURES))
    for start in range(0, ROWS, ROWS_PER_WRITE):
        stop = min(ROWS, start + ROWS_PER_WRITE)
        array[start:stop] = rng.normal(10.0, 5.0, size=(stop - start, FEATURES)).astype(np.float32)
    array.flush()
    del array


def test_a_200_mb_async_job_completes_with_the_containers_peak_under_three_times_the_payload(
    up: LocalUp, tmp_path: Path
) -> None:
    entry = up.deployment("cancer-sm")
    bucket = entry["bucket"]
    router, container, workers = container_processes(up, entry["container_url"])
    # GIVEN a 200 MB .npy payload uploaded to the deployment's request prefix (boto3's upload_file: multipart)
    payload = tmp_path / "features.npy"
    write_payload(payload)
    size = payload.stat().st_size
    assert size >= PAYLOAD_BYTES
    key = f"async/servestack-cancer-sm/requests/large-{uuid.uuid4().hex}.npy"
    s3 = up.emulator("s3")
    before_kib = memory_kib(up.process.pid, "VmHWM")
    s3.upload_file(str(payload), bucket, key)
    payload.unlink()
    uploaded_kib = memory_kib(up.process.pid, "VmHWM")
    print(f"\nlocal up VmHWM (MiB): {before_kib / 1024:.0f} before the upload, {uploaded_kib / 1024:.0f} after it")
    # The job's own peak in local up (the stand-in, the emulator's GET and the answer's upload) and in the router:
    # their high-water marks start again from what they hold now (the container's is kept: its peak is checked)
    for pid in (up.process.pid, router):
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    print(f"local up VmRSS when the job starts: {memory_kib(up.process.pid, 'VmRSS') / 1024:.0f} MiB")
    made = [(bucket, key)]
    try:
        run_job(up, s3, bucket, key, size, (router, container, workers), made)
    finally:  # the objects go, every version, so that local up's snapshots of the emulator stop carrying them
        for where, name in made:
            for listed in s3.list_object_versions(Bucket=where, Prefix=name).get("Versions", []):
                s3.delete_object(Bucket=where, Key=listed["Key"], VersionId=listed["VersionId"])


def run_job(up: LocalUp, s3: Any, bucket: str, key: str, size: int, pids: tuple[int, int, list[int]],
            made: list[tuple[str, str]]) -> None:  # fmt: skip
    router, container, workers = pids
    ready_kib = {pid: memory_kib(pid, "VmHWM") for pid in workers}
    # WHEN InvokeEndpointAsync names it
    runtime = up.client("sagemaker-runtime")
    started = time.monotonic()
    accepted = runtime.invoke_endpoint_async(
        EndpointName=up.deployment("cancer-sm")["endpoint_name"],
        InputLocation=f"s3://{bucket}/{key}",
        ContentType="application/x-npy",
        Accept="application/x-npy",
    )
    out_bucket, _, out_key = accepted["OutputLocation"].removeprefix("s3://").partition("/")
    made.append((out_bucket, out_key))

    failure = accepted.get("FailureLocation", "").removeprefix("s3://").partition("/")

    def written() -> bool:
        try:
            s3.head_object(Bucket=out_bucket, Key=out_key)
        except ClientError:
            try:  # a container's error answer: fail now, with it
                answer = s3.get_object(Bucket=failure[0], Key=failure[2])["Body"].read()
            except ClientError:
                return False
            raise AssertionError(f"the job failed: {answer[:2000]!r}") from None
        return True

    # THEN the answer lands at OutputLocation (written whole, then announced: a multipart upload's object exists
    # only once it is complete), a label per row
    wait_for(written, "the 200 MB job's output object", timeout_sec=240, poll_sec=0.5)
    elapsed = time.monotonic() - started
    labels = np.load(io.BytesIO(s3.get_object(Bucket=out_bucket, Key=out_key)["Body"].read()))
    assert labels.shape == (ROWS,)
    # AND the container never held three times the payload: the sum of its processes' peaks (its master's and
    # each serving worker's, whenever each was reached) is under it
    peak_kib = {pid: memory_kib(pid, "VmHWM") for pid in workers}
    container_kib = memory_kib(container, "VmHWM") + sum(peak_kib.values())
    print(
        f"payload {size:,} bytes, answered in {elapsed:.1f} s; container workers VmHWM (MiB) ready -> peak: "
        + ", ".join(f"{pid}: {ready_kib[pid] / 1024:.0f} -> {peak_kib[pid] / 1024:.0f}" for pid in workers)
        + f"; container master {memory_kib(container, 'VmHWM') / 1024:.0f}, in all {container_kib / 1024:.0f}"
        + f"; during the job: router {memory_kib(router, 'VmHWM') / 1024:.0f}"
        + f", local up {memory_kib(up.process.pid, 'VmHWM') / 1024:.0f}"
    )
    assert container_kib * 1024 < 3 * size, (container_kib, peak_kib)
