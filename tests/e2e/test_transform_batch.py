"""`engine: transform` in local mode, as a user runs it: `servestack local run-batch` emulates the Batch Transform
job the schedule would create (2 `serve` workers, mini-batches of lines to `/invocations`, S3 as the job's
execution role), then the manifest step; its predictions equal the Lambda engine's, row for row."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import numpy as np
import pytest

from tests.conftest import REPO_ROOT
from tests.e2e.conftest import SERVESTACK, LocalUp

pytestmark = pytest.mark.slow
# on-lambda and on-transform of the shared local up (tests/e2e/conftest.py's SHARED_SPEC).


def objects() -> dict[str, bytes]:
    """3 JSON Lines objects of different sizes; the second holds a bad row (29 values) and a blank line."""
    from sklearn.datasets import load_breast_cancer  # here, not at collection: every worker collects this module

    rows = load_breast_cancer().data.astype(np.float32)
    lines = [json.dumps(row.tolist()) for row in rows[:60]]
    second = lines[20:45]
    second[4:4] = [json.dumps([1.0] * 29), ""]
    return {
        "a.jsonl": ("\n".join(lines[:20]) + "\n").encode(),
        "b.jsonl": ("\n".join(second) + "\n").encode(),
        "c.jsonl": "\n".join(lines[45:]).encode(),  # no newline at the end
    }


def seed(up: LocalUp, name: str) -> tuple[str, str, str]:
    d = up.deployment(name)
    bucket, prefix, output = d["input"]["bucket"], d["input"]["input_prefix"], d["input"]["output_prefix"]
    s3 = up.emulator("s3")
    if d.get("seeded"):
        s3.delete_object(Bucket=bucket, Key=d["seeded"])  # local up's sample: this test brings its own 3 objects
    for key, body in objects().items():
        s3.put_object(Bucket=bucket, Key=f"{prefix}{key}", Body=body)
    return bucket, prefix, output


def run_batch(up: LocalUp, name: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SERVESTACK, "local", "run-batch", name, "--state", str(up.state_path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def read(up: LocalUp, bucket: str, key: str) -> bytes:
    return bytes(up.emulator("s3").get_object(Bucket=bucket, Key=key)["Body"].read())


def test_a_transform_run_over_3_objects_on_2_workers_predicts_what_the_lambda_engine_does(shared_up: LocalUp) -> None:
    # GIVEN one model behind a Lambda batch deployment and an engine: transform one with 2 instances
    up = shared_up
    # AND the same 3 input objects under each one's input prefix
    lambda_bucket, lambda_in, lambda_out = seed(up, "on-lambda")
    bucket, prefix, output = seed(up, "on-transform")
    # WHEN both run as the user runs them
    by_lambda = run_batch(up, "on-lambda")
    by_transform = run_batch(up, "on-transform")
    assert by_lambda.returncode == 0, by_lambda.stderr[-3000:]
    assert by_transform.returncode == 0, by_transform.stderr[-3000:]
    # THEN the transform ran on 2 workers, and its manifest step counted every row
    assert "3 objects over 2 local workers" in by_transform.stderr
    summary = json.loads(by_transform.stdout.splitlines()[-1])
    assert summary["rows"] == {"total": 61, "succeeded": 60, "failed": 1}
    manifest = json.loads(read(up, bucket, f"{output}manifest.json"))
    assert [p["input"] for p in manifest["parts"]] == [f"{prefix}{k}" for k in ("a.jsonl", "b.jsonl", "c.jsonl")]
    # AND each row's answer equals the Lambda engine's, row for row (file, line)
    lambda_manifest = json.loads(read(up, lambda_bucket, f"{lambda_out}manifest.json"))
    expected: dict[tuple[str, int], dict[str, Any]] = {}
    for part in lambda_manifest["parts"]:
        for line in read(up, lambda_bucket, f"{lambda_out}{part['key']}").splitlines():
            row = json.loads(line)
            expected[(row.pop("file").removeprefix(lambda_in), row.pop("line"))] = row
    got: dict[tuple[str, int], dict[str, Any]] = {}
    for part in manifest["parts"]:
        body = objects()[part["input"].removeprefix(prefix)]
        numbers = [n for n, text in enumerate(body.decode().split("\n"), start=1) if text.strip()]
        answers = read(up, bucket, f"{output}{part['key']}").decode().splitlines()
        assert len(answers) == len(numbers)
        for number, answer in zip(numbers, answers, strict=True):
            if "error" not in json.loads(answer):
                got[(part["input"].removeprefix(prefix), number)] = json.loads(answer)
    assert len(got) == 60
    assert got == expected
    # AND the bad row is in both error files at the same file and line
    errors = [json.loads(line) for line in read(up, bucket, f"{output}errors.jsonl").splitlines()]
    lambda_errors = [json.loads(line) for line in read(up, lambda_bucket, f"{lambda_out}errors.jsonl").splitlines()]
    assert [(e["file"].removeprefix(prefix), e["line"]) for e in errors] == [("b.jsonl", 5)]
    assert [(e["file"].removeprefix(lambda_in), e["line"]) for e in lambda_errors] == [("b.jsonl", 5)]
