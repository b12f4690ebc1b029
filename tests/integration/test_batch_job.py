"""Batch mode on a real S3 endpoint: chunked scoring, parts + manifest, bad rows, strict mode, resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer

from servestack.adapters.batch import BatchSettings, S3Store, handler, run_batch
from servestack.inference.errors import InvalidInput
from servestack.inference.service import ModelRepository
from servestack.inference.settings import ServingSettings
from servestack.inference.tabular import Progress
from servestack.local.lambda_.runtime import LambdaContext
from tests.conftest import EVENTS
from tests.integration.conftest import Aws
from tests.integration.resources import ensure_bucket

pytestmark = pytest.mark.localstack

ROWS = load_breast_cancer().data.astype(np.float32)[:40]


class Interrupted(Exception):
    """Stands for the process dying mid-run (the bench kills a real process with SIGKILL)."""


def seed(aws: Aws, bucket: str, prefix: str) -> None:
    """JSONL with a malformed line and a short row, plus a CSV with a header: 40 good rows, 2 bad."""
    lines = [json.dumps(row.tolist()) for row in ROWS[:25]]
    lines.insert(3, "[1.0, 2.0")  # line 4: malformed JSON
    lines.insert(10, json.dumps([1.0] * 29))  # line 11: 29 features
    csv = "\n".join([",".join(f"f{i}" for i in range(30))] + [",".join(str(v) for v in row) for row in ROWS[25:]])
    ensure_bucket(aws.s3, bucket)
    aws.s3.put_object(Bucket=bucket, Key=f"{prefix}a.jsonl", Body="\n".join(lines) + "\n")
    aws.s3.put_object(Bucket=bucket, Key=f"{prefix}b.csv", Body=csv + "\n")
    aws.s3.put_object(Bucket=bucket, Key=f"{prefix}README.txt", Body="not input")


def outputs(aws: Aws, bucket: str, prefix: str) -> dict[str, bytes]:
    listed = aws.s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return {
        o["Key"].removeprefix(prefix): aws.s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read() for o in listed
    }


def settings(bucket: str, output: str, **extra: Any) -> BatchSettings:
    return BatchSettings(
        deployment="t", bucket=bucket, input_prefix="in/", output_prefix=output, model="breast-cancer", **extra
    )


def test_batch_scores_every_good_row_and_reports_bad_rows_by_line(aws: Aws, unique: str) -> None:
    # GIVEN JSONL + CSV input with two bad rows
    seed(aws, unique, "in/")
    # WHEN the job runs in chunks of 8 rows
    manifest = run_batch(settings(unique, "out/", chunk_rows=8))
    files = outputs(aws, unique, "out/")
    # THEN the manifest counts rows, names the model, and each part's checksum matches its bytes
    assert manifest["rows"] == {"total": 42, "succeeded": 40, "failed": 2}
    assert manifest["model"]["name"] == "breast-cancer"
    assert len(manifest["parts"]) == 6
    assert json.loads(files["manifest.json"]) == manifest
    assert json.loads(files[f"manifests/{manifest['run']}.json"]) == manifest  # the run's own, kept after later runs
    import hashlib

    for part in manifest["parts"]:
        assert hashlib.sha256(files[part["key"]]).hexdigest() == part["sha256"]
    # AND the predictions are the core's, row for row, with file and line
    scored = [json.loads(line) for part in manifest["parts"] for line in files[part["key"]].splitlines()]
    repository = ModelRepository(ServingSettings(warmup=False))
    repository.load_all()
    model = repository.get("breast-cancer")
    expected = model.respond(model.predict({"input": ROWS}))
    assert [r["prediction"] for r in scored] == expected["predictions"].tolist()
    assert [r["label"] for r in scored] == expected["labels"]
    assert (scored[0]["file"], scored[0]["line"]) == ("in/a.jsonl", 1)
    assert (scored[-1]["file"], scored[-1]["line"]) == ("in/b.csv", 16)
    # AND the bad rows are in the error file with their line numbers and reasons
    errors = [json.loads(line) for line in files["errors.jsonl"].splitlines()]
    assert [(e["file"], e["line"]) for e in errors] == [("in/a.jsonl", 4), ("in/a.jsonl", 11)]
    assert "malformed JSON" in errors[0]["error"]["message"]
    assert errors[1]["error"]["type"] == "InvalidInput"


class DiesStoringPart(S3Store):
    """An S3 store whose process dies as it stores part `index` (parts after it may be on their way already)."""

    def __init__(self, bucket: str, index: int) -> None:
        super().__init__(bucket)
        self.index = index

    def put(self, key: str, body: bytes, metadata: dict[str, str], *, sha256: str | None = None) -> None:
        if f"/parts/part-{self.index:05d}." in key:
            raise Interrupted
        super().put(key, body, metadata, sha256=sha256)


def test_an_interrupted_run_resumes_to_byte_identical_output(aws: Aws, unique: str) -> None:
    # GIVEN an uninterrupted run, and a second run into another prefix that dies storing its fourth part
    seed(aws, unique, "in/")
    whole = run_batch(settings(unique, "whole/", chunk_rows=8))
    recorded: list[Progress] = []
    with pytest.raises(Interrupted):
        run_batch(
            settings(unique, "resumed/", chunk_rows=8), on_progress=recorded.append, store=DiesStoringPart(unique, 3)
        )
    assert "manifest.json" not in outputs(aws, unique, "resumed/")
    assert len(recorded) == 3  # parts are recorded in order: none after the one that failed
    # WHEN it is run again
    seen: list[Progress] = []
    run_batch(settings(unique, "resumed/", chunk_rows=8), on_progress=seen.append)
    # THEN it reused the stored parts, scored the missing one again, and its output is byte-identical to the
    # uninterrupted run
    assert 3 <= seen[-1].parts_skipped < len(whole["parts"])
    assert outputs(aws, unique, "resumed/") == outputs(aws, unique, "whole/")


def test_strict_mode_stops_at_the_first_bad_row(aws: Aws, unique: str) -> None:
    # GIVEN input whose fourth line is malformed
    seed(aws, unique, "in/")
    # WHEN the job runs strict / THEN it stops there, naming the file and line
    with pytest.raises(InvalidInput, match=r"in/a\.jsonl:4"):
        run_batch(settings(unique, "strict/", chunk_rows=8, strict=True))
    assert "manifest.json" not in outputs(aws, unique, "strict/")


def test_the_lambda_handler_takes_the_scheduler_payload(
    aws: Aws, unique: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # GIVEN the payload EventBridge Scheduler sends (tests/events/schedulerPayload.json), for this bucket
    event = json.loads((EVENTS / "schedulerPayload.json").read_text()) | {"bucket": unique, "input_prefix": "in/"}
    seed(aws, unique, "in/")
    # WHEN the handler is invoked with it
    result = handler(event, LambdaContext("batch", 900, 2048))
    # THEN it reports the manifest's location and row counts
    assert result == {
        "manifest": f"s3://{unique}/{event['output_prefix']}manifest.json",
        "rows": {"total": 42, "succeeded": 40, "failed": 2},
    }
    # AND a plain EventBridge "Scheduled Event" falls back to the SERVESTACK_BATCH_* environment
    for key, value in {
        "BUCKET": unique,
        "INPUT_PREFIX": "in/",
        "OUTPUT_PREFIX": "env/",
        "MODEL": "breast-cancer",
    }.items():
        monkeypatch.setenv(f"SERVESTACK_BATCH_{key}", value)
    scheduled = json.loads((EVENTS / "eventBridgeScheduledEvent.json").read_text())
    assert handler(scheduled, LambdaContext("batch", 900, 2048))["rows"]["succeeded"] == 40


def test_the_fargate_entry_runs_one_job_from_its_environment(aws: Aws, unique: str) -> None:
    # GIVEN the environment the Fargate task definition sets (servestack/cdk/batch.py) and input on S3
    import os
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    seed(aws, unique, "in/")
    env = {
        **os.environ,
        "SERVESTACK_DEFAULT_MODEL": "breast-cancer",
        "SERVESTACK_BATCH_DEPLOYMENT": "t",
        "SERVESTACK_BATCH_BUCKET": unique,
        "SERVESTACK_BATCH_INPUT_PREFIX": "in/",
        "SERVESTACK_BATCH_OUTPUT_PREFIX": "fargate/",
        "SERVESTACK_BATCH_MODEL": "breast-cancer",
    }
    # WHEN the framework's own entry runs (`python -m servestack.adapters.batch`: the task's `python -m handlers.batch`
    # calls the same `main`)
    done = subprocess.run(
        [sys.executable, "-m", "servestack.adapters.batch"], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
        timeout=300,
        check=False,
    )  # fmt: skip
    # THEN it scores the input once and writes the manifest, and says where and how long the run took after
    # start-up and the CPU its start-up took (what bench/batch_job.py reads)
    assert done.returncode == 0, done.stderr[-2000:]
    said = json.loads(done.stdout.splitlines()[-1])
    assert said["manifest"] == f"s3://{unique}/fargate/manifest.json"
    assert isinstance(said["run_seconds"], float)
    assert said["startup_cpu_seconds"] > 0
    manifest = json.loads(aws.s3.get_object(Bucket=unique, Key="fargate/manifest.json")["Body"].read())
    assert manifest["rows"]["succeeded"] == 40


def test_a_fargate_run_over_an_empty_prefix_exits_66_with_the_reason_on_one_line_and_no_traceback(
    aws: Aws, unique: str
) -> None:
    # GIVEN the Fargate task's environment, its input prefix empty
    import os
    import subprocess
    import sys

    from servestack.adapters.batch import EXIT_NO_INPUT
    from tests.conftest import REPO_ROOT

    ensure_bucket(aws.s3, unique)
    env = {
        **os.environ,
        "SERVESTACK_DEFAULT_MODEL": "breast-cancer",
        "SERVESTACK_BATCH_BUCKET": unique,
        "SERVESTACK_BATCH_INPUT_PREFIX": "empty/",
        "SERVESTACK_BATCH_OUTPUT_PREFIX": "out/",
    }
    # WHEN the container command runs
    done = subprocess.run([sys.executable, "-m", "servestack.adapters.batch"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    # THEN it exits with the documented code for no input (docs/batch.md), which ECS reports and the alarm counts
    assert done.returncode == EXIT_NO_INPUT == 66, done.stdout[-2000:] + done.stderr[-2000:]
    # AND its last line says why, where, and the code; nothing it printed is a traceback
    said = json.loads(done.stdout.splitlines()[-1])
    assert said["exit_code"] == 66
    assert said["error"]["type"] == "NoInput"
    assert said["error"]["message"].startswith(f"no input under s3://{unique}/empty/: no object ending in .jsonl")
    assert "Traceback" not in done.stdout + done.stderr
    assert aws.s3.list_objects_v2(Bucket=unique, Prefix="out/")["KeyCount"] == 0


def test_a_lambda_run_over_an_empty_prefix_fails_with_no_input(aws: Aws, unique: str) -> None:
    # GIVEN the scheduled payload of a deployment whose input prefix is empty
    from servestack.inference.errors import NoInput

    ensure_bucket(aws.s3, unique)
    event = json.loads((EVENTS / "schedulerPayload.json").read_text()) | {"bucket": unique, "input_prefix": "none/"}
    # WHEN the handler runs / THEN the invocation fails (Lambda's Errors, which the failure alarm counts), saying why
    with pytest.raises(NoInput, match=r"^no input under none/: no object ending in \.jsonl"):
        handler(event, LambdaContext("batch", 900, 2048))


def hostile_input(aws: Aws, bucket: str) -> set[tuple[str, int]]:
    """Rows that decode to more, fewer or shifted rows if lines are not kept apart; returns every row's
    (file, line): what the union of predictions and errors must cover exactly once."""
    good = [json.dumps(row.tolist()) for row in ROWS[:6]]
    row = ",".join(str(v) for v in ROWS[0])
    half = len(ROWS[0]) // 2
    first_half, second_half = ROWS[0][:half].tolist(), ROWS[0][half:].tolist()
    jsonl = [
        good[0],
        f"{good[1]}, {good[2]}",  # two rows on one line
        json.dumps(first_half)[:-1] + "], [1.0",  # `[a...], [1.0` ...
        json.dumps(second_half)[1:],  # ... `b...]`: with the line above, two rows of plausible length
        good[3],
        json.dumps([True, *ROWS[1][1:].tolist()]),  # a boolean among numbers
        "",  # blank: not a row
        "3.0",
        json.dumps({"instances": [ROWS[2].tolist()]}),
        "[]",
        good[4],
        json.dumps([[*ROWS[3].tolist()]]),  # one row, nested once too deep
        good[5],
    ]
    csv_lines = [
        "\ufeff" + ",".join(f"f{i}" for i in range(30)),  # header behind a byte order mark
        row,
        row.replace(",", "\x1c", 1),  # a file separator inside the line
        row.replace(",", "\u2028", 1),  # a unicode line separator inside the line
        ",".join(f'"{v}"' for v in ROWS[1]) + "\r",  # quoted numbers, CRLF
        row.replace(",", ',"', 1),  # an unbalanced quote
        row.replace("0.", "0_0.", 1) if "0." in row else "1_0," + row.split(",", 1)[1],
        row,
    ]
    aws.s3.put_object(Bucket=bucket, Key="hostile/a.jsonl", Body="\n".join(jsonl).encode() + b"\n")
    aws.s3.put_object(Bucket=bucket, Key="hostile/b.csv", Body="\n".join(csv_lines).encode() + b"\n")
    rows = {("hostile/a.jsonl", n) for n, line in enumerate(jsonl, start=1) if line.strip()}
    return rows | {("hostile/b.csv", n) for n in range(2, len(csv_lines) + 1)}


def test_hostile_rows_each_end_in_exactly_one_place_and_the_manifest_agrees(aws: Aws, unique: str) -> None:
    # GIVEN JSONL and CSV lines built to decode to extra, missing or shifted rows
    ensure_bucket(aws.s3, unique)
    expected = hostile_input(aws, unique)
    # WHEN the job runs in chunks that split them across parts
    manifest = run_batch(
        BatchSettings(bucket=unique, input_prefix="hostile/", output_prefix="out/", model="breast-cancer", chunk_rows=4)
    )
    files = outputs(aws, unique, "out/")
    predicted = [json.loads(line) for part in manifest["parts"] for line in files[part["key"]].splitlines()]
    failed = [json.loads(line) for line in files["errors.jsonl"].splitlines()]
    # THEN every input row is either predicted or an error, exactly once, and every prediction has its value
    places = [(r["file"], r["line"]) for r in predicted + failed]
    assert sorted(places) == sorted(expected)
    assert all("prediction" in r and "label" in r for r in predicted)
    assert all(r["error"]["type"] in ("InvalidInput", "PayloadTooLarge") for r in failed)
    # AND the manifest counts what was written
    assert manifest["rows"] == {"total": len(expected), "succeeded": len(predicted), "failed": len(failed)}
    # AND the predictions are the core's for exactly the rows that are whole and valid
    good_lines = {("hostile/a.jsonl", n) for n in (1, 5, 11, 13)} | {("hostile/b.csv", n) for n in (2, 5, 8)}
    assert {(r["file"], r["line"]) for r in predicted} == good_lines


def test_a_rerun_with_other_input_leaves_no_stale_error_parts(aws: Aws, unique: str) -> None:
    # GIVEN a run whose input had bad rows in several parts
    ensure_bucket(aws.s3, unique)
    hostile_input(aws, unique)
    settings = BatchSettings(bucket=unique, input_prefix="hostile/", output_prefix="out/", model="breast-cancer")
    run_batch(settings.__class__(**{**msgspec_fields(settings), "chunk_rows": 4}))
    assert any(key.startswith("errors/") for key in outputs(aws, unique, "out/"))
    # WHEN the same output prefix is used for a run over clean input
    for key in ("hostile/a.jsonl", "hostile/b.csv"):
        aws.s3.delete_object(Bucket=unique, Key=key)
    aws.s3.put_object(
        Bucket=unique, Key="hostile/c.jsonl", Body="\n".join(json.dumps(r.tolist()) for r in ROWS[:10]).encode()
    )
    manifest = run_batch(settings.__class__(**{**msgspec_fields(settings), "chunk_rows": 4}))
    # THEN no error part or error file of the earlier run is left, and the manifest lists only this run's parts
    left = outputs(aws, unique, "out/")
    assert manifest["rows"] == {"total": 10, "succeeded": 10, "failed": 0}
    assert not [key for key in left if key.startswith("errors")]
    assert sorted(key for key in left if key.startswith("parts/")) == sorted(p["key"] for p in manifest["parts"])


def msgspec_fields(settings: BatchSettings) -> dict[str, Any]:
    return {name: getattr(settings, name) for name in settings.__struct_fields__}
