"""Async jobs through `servestack local up`, IAM enforced, with the worker SIGKILLed mid-run: every good job
succeeds exactly once, every poison job fails with a reason and reaches the DLQ, nothing is lost.

    python -m bench.async_jobs --jobs 1000 --poison 20

It prints figures (jobs/s with the kill and restart included) and a PASS/FAIL line for the accounting;
it never asserts on time. The deployment is a one-off project (the repo's CDK app and artifacts) whose async
worker has a 5 s timeout, so the queue's visibility timeout (6x, from the template) is 30 s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from servestack.local.emulator.callers import signed
from servestack.local.iam.identities import DEVELOPER
from tests.e2e.conftest import async_worker_pids, copy_project, start_local_up

SPEC = """\
models:
  - name: breast-cancer
    version: 1
deployments:
  bench:
    mode: async
    model: breast-cancer
    timeout_sec: 5
    batch_size: 10
    batch_window_sec: 0
    max_receive_count: 3
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--poison", type=int, default=20)
    parser.add_argument("--kill-after", type=int, default=300, help="SIGKILL the worker after this many results")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-async-"))
    spec = copy_project(work / "project", SPEC)
    up = start_local_up(work, "--fresh", "--data-dir", str(work / "data"), spec=spec)
    try:
        entry = up.deployment("bench")
        url, bucket = entry["url"], entry["bucket"]
        queues, tables = entry["queues"], entry["tables"]
        dlq_url = next(u for k, u in queues.items() if "DeadLetters" in k)
        table = next(iter(tables.values()))
        s3, sqs, dynamodb = up.emulator("s3"), up.emulator("sqs"), up.emulator("dynamodb")
        from sklearn.datasets import load_breast_cancer

        rows = load_breast_cancer().data.astype(np.float32)
        poison_at = set(random.sample(range(args.jobs), args.poison))

        def submit(i: int) -> tuple[str, bool]:
            row = rows[i % len(rows)].tolist()
            body = json.dumps({"instances": [row[:29] if i in poison_at else row]}).encode()
            status, answer = signed("POST", f"{url}/jobs", DEVELOPER, "us-east-1", body=body,
                                    headers={"Content-Type": "application/json"})  # fmt: skip
            assert status == 202, answer
            return json.loads(answer)["job_id"], i in poison_at

        started = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            submitted = list(pool.map(submit, range(args.jobs)))
        good = {job for job, bad in submitted if not bad}
        poison = {job for job, bad in submitted if bad}
        print(f"submitted {args.jobs} jobs ({args.poison} poison) in {time.perf_counter() - started:.1f}s")

        prefix = "async/servestack-bench/results/"

        def results() -> int:
            pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            return sum(len(page.get("Contents", [])) for page in pages)

        started = time.perf_counter()
        while results() < min(args.kill_after, len(good)):
            time.sleep(0.1)
        for pid in async_worker_pids(spec.parent):
            os.kill(pid, signal.SIGKILL)
        print(f"SIGKILLed the worker with {results()} results written; local up restarts it")
        statuses: dict[str, str] = {}
        reasons: dict[str, str] = {}
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            statuses.clear()
            for page in dynamodb.get_paginator("scan").paginate(TableName=table):
                for item in page["Items"]:
                    statuses[item["job_id"]["S"]] = item["status"]["S"]
                    if "error" in item:
                        reasons[item["job_id"]["S"]] = item["error"]["M"]["message"]["S"]
            if sum(1 for s in statuses.values() if s in ("succeeded", "failed")) >= args.jobs:
                break
            time.sleep(1)
        elapsed = time.perf_counter() - started
        versions: dict[str, int] = {}
        for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket, Prefix=prefix):
            for v in page.get("Versions", []):
                versions[v["Key"]] = versions.get(v["Key"], 0) + 1
        dead: list[dict[str, Any]] = []
        while got := sqs.receive_message(QueueUrl=dlq_url, MaxNumberOfMessages=10, WaitTimeSeconds=1,
                                         MessageAttributeNames=["All"]).get("Messages"):  # fmt: skip
            dead += got
            for m in got:
                sqs.delete_message(QueueUrl=dlq_url, ReceiptHandle=m["ReceiptHandle"])
        dead_jobs = {json.loads(m["Body"]).get("job_id") for m in dead}
        checks = {
            "succeeded jobs": sum(1 for j in good if statuses.get(j) == "succeeded"),
            "result objects": len(versions),
            "result keys with more than one version": sum(1 for c in versions.values() if c > 1),
            "failed jobs (poison) with a reason": sum(
                1 for j in poison if statuses.get(j) == "failed" and reasons.get(j)
            ),
            "DLQ messages": len(dead),
            "DLQ messages that are poison jobs": len(dead_jobs & poison),
        }
        for label, value in checks.items():
            print(f"{label:>40}: {value}")
        print(f"{'example reason':>40}: {next(iter(reasons.values()), '')[:100]}")
        print(f"{'processing time (with kill + restart)':>40}: {elapsed:.1f}s ({len(good) / elapsed:.0f} jobs/s)")
        ok = (
            checks["succeeded jobs"] == len(good) == checks["result objects"]
            and checks["result keys with more than one version"] == 0
            and checks["failed jobs (poison) with a reason"] == len(poison)
            and checks["DLQ messages that are poison jobs"] == len(poison)
        )
        print("PASS" if ok else "FAIL")
        return 0 if ok else 1
    finally:
        up.stop()


if __name__ == "__main__":
    sys.exit(main())
