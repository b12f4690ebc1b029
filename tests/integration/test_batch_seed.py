"""local up's sample input for a batch deployment (servestack/local/batch/seed.py) on a real S3 endpoint: rows
from a sample request of any form, seeded only into an empty prefix, marked, and removed once the prefix holds
the user's own input, so that no sample row ends up in the user's results."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from servestack.local.batch.planning import BatchPlanner
from servestack.local.batch.seed import SEED_KEY, retire_seeded_input, sample_rows, seed_batch_input
from servestack.local.planning import PlanContext
from servestack.local.scheduler import ScheduleDef, TaskDef
from tests.conftest import ARTIFACTS
from tests.integration.conftest import Aws
from tests.integration.resources import ensure_bucket

pytestmark = pytest.mark.localstack

RECORDS = [{"x": 1.5, "site": "north"}, {"x": 2.0, "site": "east"}]
SAMPLES: dict[str, Any] = {
    "instances of rows": {"instances": [[1.0, 2.0], [3.0, 4.0]]},
    "instances of records": {"instances": RECORDS},
    "dataframe_records": {"dataframe_records": RECORDS},
    "dataframe_split": {"dataframe_split": {"columns": ["x", "site"], "data": [[1.5, "north"], [2.0, "east"]]}},
    "inputs by column": {"inputs": {"x": [1.5, 2.0], "site": ["north", "east"]}},
    "inputs by tensor": {"inputs": {"input_ids": [[1, 2, 3], [4, 5]], "attention_mask": [[1, 1, 1], [1, 1]]}},
}


@pytest.mark.parametrize("form", sorted(SAMPLES))
def test_a_sample_of_any_row_form_seeds_one_line_per_row(aws: Aws, unique: str, tmp_path: Path, form: str) -> None:
    # GIVEN an empty input prefix and a sample request in this form
    ensure_bucket(aws.s3, unique)
    sample = tmp_path / "sample-request.json"
    sample.write_text(json.dumps(SAMPLES[form]))
    # WHEN local up seeds it
    key = seed_batch_input(aws.s3, unique, "in/", sample)
    # THEN it holds one JSON line per row of the sample, marked as seeded
    assert key == f"in/{SEED_KEY}"
    stored = aws.s3.get_object(Bucket=unique, Key=key)
    lines = [json.loads(line) for line in stored["Body"].read().splitlines()]
    assert lines == sample_rows(SAMPLES[form])
    assert len(lines) == 2
    assert stored["Metadata"] == {"servestack-seeded": "sample-request"}


@pytest.mark.parametrize(
    "document",
    [{"inputs": {"a": [[1.0], [2.0]], "b": [[2.0]]}}, {"instances": []}, {"anything": 1}, [1, 2], "text"],
    ids=["tensor inputs of other row counts", "no rows", "unknown form", "a list", "a string"],
)
def test_a_sample_that_gives_no_rows_seeds_nothing_and_never_raises(
    aws: Aws, unique: str, tmp_path: Path, document: Any
) -> None:
    ensure_bucket(aws.s3, unique)
    sample = tmp_path / "sample-request.json"
    sample.write_text(json.dumps(document))
    assert seed_batch_input(aws.s3, unique, "in/", sample) is None
    assert aws.s3.list_objects_v2(Bucket=unique, Prefix="in/")["KeyCount"] == 0


def test_the_bundled_samples_still_seed(aws: Aws, unique: str) -> None:
    ensure_bucket(aws.s3, unique)
    for name in ("digits", "breast-cancer"):
        assert seed_batch_input(aws.s3, unique, f"{name}/", ARTIFACTS / name / "1" / "sample-request.json")


def test_the_seeded_sample_leaves_once_the_user_brings_input_and_only_then(
    aws: Aws, unique: str, tmp_path: Path
) -> None:
    # GIVEN a seeded prefix
    ensure_bucket(aws.s3, unique)
    sample = tmp_path / "sample-request.json"
    sample.write_text(json.dumps(SAMPLES["instances of rows"]))
    key = seed_batch_input(aws.s3, unique, "in/", sample)
    # WHEN a run starts with nothing else there / THEN the sample stays: it is the input
    assert retire_seeded_input(aws.s3, unique, "in/") == []
    # WHEN the user's own file arrives / THEN a prefix with input is not seeded again, and the sample is removed
    aws.s3.put_object(Bucket=unique, Key="in/mine.jsonl", Body=b"[1.0, 2.0]\n")
    assert seed_batch_input(aws.s3, unique, "in/", sample) is None
    assert retire_seeded_input(aws.s3, unique, "in/") == [key]
    listed = [item["Key"] for item in aws.s3.list_objects_v2(Bucket=unique, Prefix="in/")["Contents"]]
    assert listed == ["in/mine.jsonl"]
    # AND a user's own object of the seed's name (no mark) is never removed
    aws.s3.put_object(Bucket=unique, Key=key, Body=b"[5.0, 6.0]\n")
    assert retire_seeded_input(aws.s3, unique, "in/") == []


def test_a_pipelines_dataframe_split_sample_seeds_rows_the_batch_job_scores(
    aws: Aws, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN the sample request `models push` writes for a ColumnTransformer pipeline (a dataframe_split, which
    # stopped local up with KeyError 'instances')
    from servestack.adapters.batch import BatchSettings, run_batch
    from tests.pipeline_model import pipeline_model

    model = pipeline_model()
    monkeypatch.setenv("SERVESTACK_MODEL_DIR", str(model.root))
    monkeypatch.setenv("SERVESTACK_DEFAULT_MODEL", "flowers")
    ensure_bucket(aws.s3, unique)
    sample = model.package / "sample-request.json"
    # WHEN local up seeds the batch input from it, and the job runs
    assert seed_batch_input(aws.s3, unique, "in/", sample) == f"in/{SEED_KEY}"
    settings = BatchSettings(bucket=unique, input_prefix="in/", output_prefix="out/", model="flowers")
    manifest = run_batch(settings)
    # THEN every sample row is scored
    rows = len(json.loads(sample.read_text())["dataframe_split"]["data"])
    assert manifest["rows"] == {"total": rows, "succeeded": rows, "failed": 0}


def test_a_restart_finds_its_earlier_seed_still_its_own_and_a_later_run_retires_it(
    aws: Aws, unique: str, tmp_path: Path
) -> None:
    # GIVEN a prefix seeded by an earlier start of local up (its emulator data kept across the restart)
    ensure_bucket(aws.s3, unique)
    sample = tmp_path / "sample-request.json"
    sample.write_text(json.dumps(SAMPLES["instances of rows"]))
    key = seed_batch_input(aws.s3, unique, "in/", sample)
    assert key is not None
    # WHEN local up starts again / THEN it still counts the marked sample as its own seed (not as user input)
    assert seed_batch_input(aws.s3, unique, "in/", sample) == key
    # AND once the user's file arrives, the run retires it, so no sample row reaches the user's results
    aws.s3.put_object(Bucket=unique, Key="in/mine.jsonl", Body=b"[1.0, 2.0]\n")
    assert retire_seeded_input(aws.s3, unique, "in/") == [key]
    # AND an unmarked object of the seed's name alone in the prefix is the user's: not taken for a seed
    aws.s3.delete_object(Bucket=unique, Key="in/mine.jsonl")
    aws.s3.put_object(Bucket=unique, Key=key, Body=b"[5.0, 6.0]\n")
    assert seed_batch_input(aws.s3, unique, "in/", sample) is None


@dataclass
class BatchStackOf:
    """The part of a stack's topology the batch planner reads (servestack/local/batch/planning.py's BatchStack)."""

    deployment: str
    schedules: list[ScheduleDef]
    tasks: dict[str, TaskDef] = field(default_factory=dict)
    mode: str = "batch"
    transforms: list[Any] = field(default_factory=list)
    functions: dict[str, Any] = field(default_factory=dict)
    roles: dict[str, Any] = field(default_factory=dict)


def plan_context(tmp_path: Path, sample: Path) -> PlanContext:
    def never(*_: Any) -> Any:
        raise AssertionError("the batch planner starts nothing")

    return PlanContext(
        region="us-east-1", emulator_url="http://unused", work=tmp_path, run_dir=tmp_path, env_base={},
        service_endpoints={}, credentials={}, api_ports={}, free_port=never, log_shipper=never, sample=sample,
        stage_image=never,
    )  # fmt: skip


def scheduled(name: str, *, payload: dict[str, str] | None = None, task: str | None = None) -> ScheduleDef:
    return ScheduleDef(
        "Schedule",
        name,
        "rate(7 days)",
        "UTC",
        True,
        "arn:aws:ecs:us-east-1:123456789012:cluster/c",
        "arn:aws:iam::123456789012:role/scheduler",
        json.dumps(payload) if payload else None,
        2,
        3600,
        None,
        task,
    )


def test_local_up_seeds_a_fargate_deployments_input_as_it_seeds_a_lambda_ones(
    aws: Aws, unique: str, tmp_path: Path
) -> None:
    # GIVEN a Fargate batch deployment, whose schedule runs a task (RunTask sends no payload: its task definition's
    # environment names the bucket and prefixes), beside a Lambda one whose schedule's input names them
    ensure_bucket(aws.s3, unique)
    settings = {"bucket": unique, "input_prefix": "batch/weekly/input/", "output_prefix": "batch/weekly/output/"}
    task = TaskDef("Task", "arn:aws:ecs:us-east-1:123456789012:task-definition/weekly:1", ("python",),
                   {f"SERVESTACK_BATCH_{k.upper()}": v for k, v in settings.items()} | {"SERVESTACK_PROVIDERS": "auto"},
                   "TaskRole")  # fmt: skip
    fargate = BatchStackOf("weekly", [scheduled("weekly", task="Task")], {"Task": task})
    lambda_settings = settings | {"input_prefix": "batch/nightly/input/", "output_prefix": "batch/nightly/output/"}
    on_lambda = BatchStackOf("nightly", [scheduled("nightly", payload=lambda_settings)])
    sample = ARTIFACTS / "digits" / "1" / "sample-request.json"
    planner = BatchPlanner(aws.s3)
    # WHEN local up plans both
    entries = {stack.deployment: planner.plan(stack, plan_context(tmp_path, sample)).entry
               for stack in (fargate, on_lambda)}  # fmt: skip
    # THEN each input prefix holds the sample, and each entry says where its run reads, as run-batch and status read it
    for name, entry in entries.items():
        assert entry["seeded"] == f"batch/{name}/input/{SEED_KEY}"
        assert entry["input"]["bucket"] == unique
        assert entry["input_prefix"] == f"batch/{name}/input/"
        assert entry["output_prefix"] == f"batch/{name}/output/"
        listed = aws.s3.list_objects_v2(Bucket=unique, Prefix=f"batch/{name}/input/")["Contents"]
        assert [o["Key"] for o in listed] == [entry["seeded"]]
