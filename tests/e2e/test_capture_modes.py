"""Data capture under `local up` (docs/monitoring.md): the zoo's ColumnTransformer pipeline (`wine-pipeline`,
tests/zoo.py) deployed in all four modes with `capture:` at 100%, its text column `shade` left out.

Realtime (its columns left out, so its container's log lines), serverless and async: each answered request
becomes one record in the documented format under the deployment's capture prefix in the emulator's S3, through
the log group's subscription and the Firehose stream, written with the stream's role (IAM enforced), never with
`shade` in it. Batch: the run's input and output objects are its record, joined by the id column.

`wine-watch` (serverless, every column captured) has a `monitor:` block: its scheduled drift check, fired through
the local scheduler, runs under its own role (IAM enforced), puts its metrics to the emulator's CloudWatch, and
its drift alarm is what `local status` shows, OK for traffic like the training rows, ALARM once a column shifts
and a category the model never saw comes in. `wine-native`'s check, given a capture object it cannot read, fails,
and its failure alarm is what `local status` shows then. `wine-nightly` (batch) has a `monitor:` block too: its
check reads the rows its last run scored, from the run's own input and output objects, and sets its drift alarm
the same way.

`wine-sampled` (serverless) captures 10%: 2,000 signed requests through its HTTP API front, and the records
Firehose wrote are the sampled share within binomial bounds, each sampled line shipped (as many records as capture
lines in its log group). The same bound is checked in process too (tests/functional/test_capture_app.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from servestack.inference.capture import records_of
from servestack.local.batch.data import batch_location
from servestack.local.emulator import control, developer
from tests.e2e.conftest import LocalUp, start_local_up
from tests.waiting import wait_for
from tests.zoo import ZooModel

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
SERVESTACK = str(Path(sys.executable).parent / "servestack")
PIPELINE = "wine-pipeline"
EXCLUDED = "shade"
ONLINE = {"wine-rt": "realtime", "wine-api": "serverless", "wine-jobs": "async"}
REQUESTS = 3
WATCHED = "wine-watch"  # the deployment with a scheduled drift check
SAMPLED = "wine-sampled"  # capture at 10%
SAMPLED_REQUESTS = 2_000
NIGHTLY = "wine-nightly"  # batch, with a scheduled drift check of its runs


@dataclass
class Captured:
    up: LocalUp
    root: Path
    env: dict[str, str]
    answers: dict[str, list[dict[str, Any]]]

    def cli(self, *args: str) -> str:
        done = subprocess.run([SERVESTACK, *args], cwd=self.root, env=self.env, capture_output=True, text=True,
                              timeout=300, check=False)  # fmt: skip
        assert done.returncode == 0, f"servestack {' '.join(args)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done.stdout


def serving_yaml() -> dict[str, Any]:
    private = {"sample_percent": 100, "exclude_columns": [EXCLUDED]}
    return {
        "models": [{"name": PIPELINE, "version": 1}],
        "deployments": {
            "wine-rt": {"mode": "realtime", "model": PIPELINE, "instance_type": "ml.c6i.xlarge", "capture": private},
            # Its check reads SageMaker's own records (no servestack block) of the few requests the tests send.
            "wine-native": {
                "mode": "realtime",
                "model": PIPELINE,
                "instance_type": "ml.c6i.xlarge",
                "capture": {},
                "monitor": {"min_rows": 5},
            },
            "wine-api": {"mode": "serverless", "model": PIPELINE, "capture": private},
            "wine-jobs": {"mode": "async", "model": PIPELINE, "capture": private},
            # Its schedule never comes round during the tests: they fire it (local up's own route).
            WATCHED: {"mode": "serverless", "model": PIPELINE, "capture": {}, "monitor": {"window_hours": 1}},
            SAMPLED: {"mode": "serverless", "model": PIPELINE, "capture": {"sample_percent": 10}},
            # Its runs are its capture; its check reads them (the tests fire it, and run the batch themselves)
            NIGHTLY: {
                "mode": "batch",
                "model": PIPELINE,
                "input_format": "jsonl",
                "id_column": "id",
                "capture": {},
                "monitor": {"window_hours": 1},
            },
        },
    }


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory, zoo: dict[str, ZooModel]) -> Iterator[Captured]:
    root = tmp_path_factory.mktemp("capture-project")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SERVESTACK_", "AWS_"))}
    env["PYTHONUNBUFFERED"] = "1"
    (root / "serving.yaml").touch()
    assert subprocess.run([SERVESTACK, "init", str(root)], env=env, capture_output=True, check=False).returncode == 0
    model = zoo[PIPELINE]
    shutil.copy(model.onnx_path, root / f"{PIPELINE}.onnx")
    # The training rows kept in the package (`--sample`): the scheduled check's baseline.
    model.sample.to_pandas().to_csv(root / "train.csv", index=False)
    push = subprocess.run([SERVESTACK, "models", "push", f"{PIPELINE}.onnx", "--name", PIPELINE, "--sample",
                           "train.csv"], cwd=root, env=env, capture_output=True, text=True, timeout=300,
                          check=False)  # fmt: skip
    assert push.returncode == 0, push.stdout[-3000:] + push.stderr[-3000:]
    (root / "serving.yaml").write_text(yaml.safe_dump(serving_yaml(), sort_keys=False))
    up = start_local_up(root, cwd=root, env=env, found_state=root / ".servestack" / "local.json", timeout_sec=300)
    try:
        assert up.state["iam_enforced"] is True
        made = Captured(up, root, env, {})
        for i in range(REQUESTS):
            request = model.request(np.arange(i, i + 2 + i))  # 2, 3 and 4 rows
            (root / f"request-{i}.json").write_text(json.dumps(request))
            for name in (*ONLINE, "wine-native"):
                made.answers.setdefault(name, []).append(
                    json.loads(made.cli("invoke", name, "--data", f"request-{i}.json"))
                )
        yield made
    finally:
        assert up.stop() == 0, up.log_text()[-4000:]


def capture_records(captured: Captured, deployment: str) -> list[dict[str, Any]]:
    s3 = captured.up.emulator("s3")
    found: list[dict[str, Any]] = []
    for bucket in s3.list_buckets()["Buckets"]:
        listing = s3.list_objects_v2(Bucket=bucket["Name"], Prefix=f"capture/{deployment}/")
        for item in listing.get("Contents", []):
            body = s3.get_object(Bucket=bucket["Name"], Key=item["Key"])["Body"].read()
            found += records_of(body.splitlines())
    return found


@pytest.mark.parametrize("deployment", list(ONLINE))
def test_every_request_and_answer_is_captured_in_the_documented_format(captured: Captured, deployment: str) -> None:
    model = ONLINE[deployment]
    records = wait_for(
        lambda: found if len(found := capture_records(captured, deployment)) >= REQUESTS else None,
        f"{REQUESTS} capture records of {deployment}",
        timeout_sec=60,
        poll_sec=0.5,
    )
    assert len(records) == REQUESTS  # one per request, no more
    for record in records:
        assert record["eventVersion"] == "0"
        meta = record["servestack"]
        assert (meta["deployment"], meta["mode"], meta["model"], meta["version"]) == (deployment, model, PIPELINE, "1")
        assert (meta["job_id"] is not None) == (model == "async")
        assert (meta["variant"] is not None) == (model == "realtime")
        assert record["captureData"]["endpointInput"]["encoding"] == "JSON"
        # THEN the left-out column is nowhere in the record, and every other column is there
        inputs = json.loads(record["captureData"]["endpointInput"]["data"])["inputs"]
        assert EXCLUDED not in inputs
        assert not any(shade in json.dumps(record) for shade in ("amber", "ruby", "pale"))
        assert "alcohol" in inputs
    # AND each record's answer is an answer the client got, its rows its request's
    answers = sorted(json.dumps(_predictions(answer), sort_keys=True) for answer in captured.answers[deployment])
    recorded = sorted(
        json.dumps(_predictions(json.loads(r["captureData"]["endpointOutput"]["data"])), sort_keys=True)
        for r in records
    )
    assert recorded == answers
    assert sorted(len(json.loads(r["captureData"]["endpointInput"]["data"])["inputs"]["alcohol"]) for r in records) == [
        2,
        3,
        4,
    ]


def log_lines(captured: Captured, deployment: str) -> list[str]:
    """Every line the deployment's log groups hold (as the developer reads them), every page."""
    logs = captured.up.emulator("logs")
    found: list[str] = []
    for group in captured.up.deployment(deployment)["log_groups"].values():
        for page in logs.get_paginator("filter_log_events").paginate(logGroupName=group):
            found += [event["message"] for event in page.get("events", [])]
    return found


def test_at_ten_percent_the_share_captured_of_2000_requests_is_within_binomial_bounds(captured: Captured) -> None:
    import boto3
    import httpx

    from servestack.client import SigV4

    keys = developer(captured.up.state)
    session = boto3.session.Session(
        aws_access_key_id=keys.access_key_id,
        aws_secret_access_key=keys.secret_access_key,
        aws_session_token=keys.session_token,
    )
    url = captured.up.deployment(SAMPLED)["url"]
    body = (captured.root / "request-0.json").read_bytes()
    auth = SigV4(captured.up.state["region"], "execute-api", session=session)

    # GIVEN 2,000 answered requests to the deployment that captures 10%, four at a time
    def send(count: int) -> list[int]:
        headers = {"Content-Type": "application/json"}
        with httpx.Client(auth=auth, timeout=60) as client:
            return [client.post(f"{url}/invocations", content=body, headers=headers).status_code for _ in range(count)]

    with ThreadPoolExecutor(4) as pool:
        statuses = [s for done in pool.map(send, [SAMPLED_REQUESTS // 4] * 4) for s in done]
    assert statuses == [200] * SAMPLED_REQUESTS

    # WHEN every invocation's REPORT line is in its log group (its capture line, if sampled, came before it)
    def all_reported() -> list[str] | None:
        found = log_lines(captured, SAMPLED)
        return found if sum(line.startswith("REPORT RequestId:") for line in found) >= SAMPLED_REQUESTS else None

    lines = wait_for(
        all_reported,
        f"{SAMPLED_REQUESTS} REPORT lines of {SAMPLED}",
        timeout_sec=120,
        poll_sec=1,
    )
    sampled = sum('"captureData"' in line for line in lines)
    # THEN the sampled share is within 4.5 sd of 10% (mean 200, sd 13.4: a correct sampler fails it about once in
    # 150,000 runs), and Firehose wrote a record for every sampled line, no more
    assert abs(sampled - SAMPLED_REQUESTS * 0.1) <= 4.5 * (SAMPLED_REQUESTS * 0.1 * 0.9) ** 0.5, sampled
    records = wait_for(
        lambda: found if len(found := capture_records(captured, SAMPLED)) >= sampled else None,
        f"{sampled} capture records of {SAMPLED}",
        timeout_sec=60,
        poll_sec=0.5,
    )
    assert len(records) == sampled
    assert {r["servestack"]["deployment"] for r in records} == {SAMPLED}


def _predictions(answer: dict[str, Any]) -> Any:
    return answer.get("predictions", answer)


def test_servestack_monitor_reads_the_records_as_captured(captured: Captured, zoo: dict[str, ZooModel]) -> None:
    # GIVEN the serverless deployment's records in the emulator's S3 (the left-out column absent from each)
    wait_for(lambda: len(capture_records(captured, "wine-api")) >= REQUESTS, "wine-api's records", timeout_sec=60)
    bucket = next(
        b["Name"]
        for b in captured.up.emulator("s3").list_buckets()["Buckets"]
        if captured.up.emulator("s3").list_objects_v2(Bucket=b["Name"], Prefix="capture/wine-api/").get("KeyCount")
    )
    zoo[PIPELINE].sample.to_pandas().to_csv(captured.root / "train.csv", index=False)
    env = captured.env | {
        "AWS_ACCESS_KEY_ID": captured.up.state["developer"]["AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": captured.up.state["developer"]["AWS_SECRET_ACCESS_KEY"],
    }
    # WHEN `servestack monitor` reads them where Firehose wrote them
    done = subprocess.run(
        [SERVESTACK, "monitor", "--capture", f"s3://{bucket}/capture/wine-api/", "--model",
         f"models/artifacts/{PIPELINE}/1", "--baseline", "train.csv", "--min-rows", "1", "--json", "monitor.json",
         "--endpoint-url", captured.up.state["endpoint_url"], "--region", captured.up.state["region"],
         "--report", "m.html"],
        cwd=captured.root, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    # THEN it reads every record, every row, and skips none
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((captured.root / "monitor.json").read_text())
    assert summary["current"]["rows"] == 2 + 3 + 4
    assert summary["notes"] == []
    shade = next(column for column in summary["columns"] if column["name"] == EXCLUDED)
    assert shade["current_rows"] == 0  # left out of every record, and not counted as missing
    assert shade["current_missing"] == 0


def test_a_realtime_endpoint_without_excluded_columns_is_captured_by_sagemaker_itself(captured: Captured) -> None:
    # SageMaker's own records (the local router plays DataCaptureConfig): the body as received, no servestack
    # block, at SageMaker's keys <prefix><endpoint>/<variant>/yyyy/mm/dd/hh/<name>.jsonl
    s3 = captured.up.emulator("s3")

    def native() -> list[tuple[str, dict[str, Any]]] | None:
        found: list[tuple[str, dict[str, Any]]] = []
        for bucket in s3.list_buckets()["Buckets"]:
            listing = s3.list_objects_v2(Bucket=bucket["Name"], Prefix="capture/wine-native/")
            for item in listing.get("Contents", []):
                body = s3.get_object(Bucket=bucket["Name"], Key=item["Key"])["Body"].read()
                found += [(item["Key"], record) for record in records_of(body.splitlines())]
        return found if len(found) >= REQUESTS else None

    records = wait_for(native, "SageMaker's capture records of wine-native", timeout_sec=60, poll_sec=0.5)
    assert len(records) == REQUESTS
    for key, record in records:
        assert re.fullmatch(r"capture/wine-native/[^/]+/primary/\d{4}/\d\d/\d\d/\d\d/[^/]+\.jsonl", key), key
        assert "servestack" not in record
        request = json.loads(record["captureData"]["endpointInput"]["data"])
        assert "inputs" in request  # the body as the client sent it
    answers = sorted(json.dumps(a, sort_keys=True) for a in captured.answers["wine-native"])
    recorded = sorted(
        json.dumps(json.loads(r["captureData"]["endpointOutput"]["data"]), sort_keys=True) for _, r in records
    )
    assert recorded == answers


def test_a_batch_runs_objects_are_its_capture_joined_by_id(captured: Captured, zoo: dict[str, ZooModel]) -> None:
    table = zoo[PIPELINE].sample.slice(0, 5).to_pylist()
    rows = [{"id": f"r{i}", **row} for i, row in enumerate(table)]
    bucket, prefix, output = batch_location(captured.up.state, NIGHTLY)
    s3 = captured.up.emulator("s3")
    s3.put_object(Bucket=bucket, Key=f"{prefix}rows.jsonl", Body="\n".join(map(json.dumps, rows)).encode())
    captured.cli("local", "run-batch", NIGHTLY, "--state", str(captured.up.state_path))
    manifest = json.loads(s3.get_object(Bucket=bucket, Key=f"{output}manifest.json")["Body"].read())
    scored = [
        json.loads(line)
        for part in manifest["parts"]
        for line in s3.get_object(Bucket=bucket, Key=f"{output}{part['key']}")["Body"].read().splitlines()
        if line.strip()
    ]
    # THEN every input row has its output row, joined by the id column: no copy under capture/
    assert sorted(row["id"] for row in scored) == sorted(row["id"] for row in rows)
    assert capture_records(captured, NIGHTLY) == []


def status_alarms(captured: Captured, deployment: str) -> list[dict[str, Any]]:
    """A deployment's alarms as `local status --json` shows them (evaluated as it reads them)."""
    shown = json.loads(captured.cli("local", "status", "--json", "--state", str(captured.up.state_path)))
    (row,) = [r for r in shown["deployments"] if r["deployment"] == deployment]
    return list(row["alarms"])


def drift_alarm(captured: Captured, state: str) -> dict[str, Any] | None:
    """The watched deployment's drift alarm, once a check's datapoint has put it in `state`."""
    (alarm,) = [a for a in status_alarms(captured, WATCHED) if a["name"] == f"servestack-{WATCHED}-drift"]
    evaluated = alarm["state"] == state and str(alarm["reason"]).startswith("Threshold Crossed")
    return dict(alarm) if evaluated else None


def send(captured: Captured, request: dict[str, Any], name: str) -> None:
    (captured.root / name).write_text(json.dumps(request))
    captured.cli("invoke", WATCHED, "--data", name)


def fire_check(captured: Captured, records: int, deployment: str = WATCHED) -> None:
    """Once `records` requests are captured, the check's schedule fires (now, as at its next time)."""
    wait_for(lambda: len(capture_records(captured, deployment)) >= records, f"{records} records of {deployment}",
             timeout_sec=60, poll_sec=0.5)  # fmt: skip
    fire = f"{captured.up.api}/_servestack/schedules/servestack-{deployment}-monitor/fire"
    assert control("POST", fire, developer(captured.up.state), "us-east-1", timeout_sec=120) == (200, {"invoked": True})


def test_the_scheduled_drift_check_sets_the_alarm_local_status_shows(
    captured: Captured, zoo: dict[str, ZooModel]
) -> None:
    model = zoo[PIPELINE]
    every_row = model.request(np.arange(model.rows))
    # GIVEN traffic drawn from the training rows (the package's baseline)
    send(captured, every_row, "watch-0.json")
    # WHEN the check's schedule fires
    fire_check(captured, 1)
    # THEN the check, run as its role, finds no drift: its alarm is OK
    alarm = wait_for(lambda: drift_alarm(captured, "OK"), "the drift alarm OK", timeout_sec=180, poll_sec=1.0)
    assert alarm["reason"].startswith("Threshold Crossed: 1 datapoint [0.0")
    # WHEN alcohol reads 3 points high and a fifth of the wines are a shade the model never saw, in most of the
    # window's rows
    inputs = every_row["inputs"]
    drifted = {
        "inputs": inputs
        | {
            "alcohol": [[value + 3] for (value,) in inputs["alcohol"]],
            "shade": [["violet"] if i % 5 == 0 else shade for i, shade in enumerate(inputs["shade"])],
        }
    }
    for i in range(3):
        send(captured, drifted, f"watch-{i + 1}.json")
    fire_check(captured, 4)
    # THEN the drift alarm goes to ALARM, and `local status` shows it with CloudWatch's reason
    alarm = wait_for(lambda: drift_alarm(captured, "ALARM"), "the drift alarm in ALARM", timeout_sec=180, poll_sec=1.0)
    assert alarm["reason"].startswith("Threshold Crossed: 1 datapoint [1.0")
    table = captured.cli("local", "status", "--state", str(captured.up.state_path))
    assert re.search(rf"^{WATCHED} +serverless +running +\S+ +1 +\d+ +ALARM$", table, re.MULTILINE), table
    assert f"servestack-{WATCHED}-drift: ALARM since " in table
    # AND each column's score was published for the deployment: alcohol's PSI and shade's distance past their
    # thresholds, malic acid's not
    cloudwatch = captured.up.emulator("cloudwatch")

    def score(column: str) -> float:
        points = cloudwatch.get_metric_statistics(
            Namespace="servestack/Drift", MetricName="DriftScore", Period=3600, Statistics=["Maximum"],
            Dimensions=[{"Name": "Deployment", "Value": WATCHED}, {"Name": "Column", "Value": column}],
            StartTime=datetime.now(UTC) - timedelta(hours=1), EndTime=datetime.now(UTC) + timedelta(minutes=1),
        )["Datapoints"]  # fmt: skip
        return float(max(point["Maximum"] for point in points))

    assert score("alcohol") > 0.2
    assert score("shade") > 0.1
    assert score("malic_acid") < 0.2


def test_a_realtime_endpoints_check_reads_sagemakers_own_records(captured: Captured) -> None:
    # GIVEN the realtime endpoint captured by SageMaker itself (the local router), whose check is the stack's one
    # function / WHEN its schedule fires
    fire_check(captured, REQUESTS, "wine-native")
    cloudwatch = captured.up.emulator("cloudwatch")

    def rows() -> float | None:
        points = cloudwatch.get_metric_statistics(
            Namespace="servestack/Drift", MetricName="CapturedRows", Period=3600, Statistics=["Maximum"],
            Dimensions=[{"Name": "Deployment", "Value": "wine-native"}],
            StartTime=datetime.now(UTC) - timedelta(hours=1), EndTime=datetime.now(UTC) + timedelta(minutes=1),
        )["Datapoints"]  # fmt: skip
        return float(max(point["Maximum"] for point in points)) if points else None

    # THEN it read every row of the requests as SageMaker recorded them, as its role, and published its verdict
    assert wait_for(rows, "the realtime check's metrics", timeout_sec=120, poll_sec=1.0) == 2 + 3 + 4
    drift = "servestack-wine-native-drift"
    alarm = wait_for(
        lambda: next((a for a in status_alarms(captured, "wine-native")
                      if a["name"] == drift and a["state"] in ("OK", "ALARM")), None),
        "the realtime drift alarm's verdict", timeout_sec=60, poll_sec=1.0,
    )  # fmt: skip
    assert str(alarm["reason"]).startswith("Threshold Crossed")


def test_a_check_that_fails_sets_its_failure_alarm_local_status_shows(captured: Captured) -> None:
    import gzip

    failures = "servestack-wine-native-monitor-failures"

    def failure_alarm() -> dict[str, Any]:
        (alarm,) = [a for a in status_alarms(captured, "wine-native") if a["name"] == failures]
        return dict(alarm)

    # GIVEN the check's failure alarm, quiet: no check has failed
    assert failure_alarm()["state"] == "OK"
    # WHEN someone copies capture records in gzip under the capture prefix, keeping the .jsonl name, and the check's
    # schedule fires: the check cannot read that object as text, and raises
    s3 = captured.up.emulator("s3")
    bucket = captured.up.deployment("wine-native")["bucket"]
    key = "capture/wine-native/copied/records.jsonl"
    s3.put_object(Bucket=bucket, Key=key, Body=gzip.compress(b'{"captureData": {}}\n'))
    try:
        fire = f"{captured.up.api}/_servestack/schedules/servestack-wine-native-monitor/fire"
        assert control("POST", fire, developer(captured.up.state), "us-east-1", timeout_sec=120) == (
            200, {"invoked": True},
        )  # fmt: skip
        # THEN the schedule's part succeeded (Lambda accepted the event), but the function's Errors count the failed
        # check: `local status` shows the failure alarm in ALARM, with CloudWatch's reason
        alarm = wait_for(lambda: (a := failure_alarm())["state"] == "ALARM" and a, "the failure alarm in ALARM",
                         timeout_sec=180, poll_sec=1.0)  # fmt: skip
        assert str(alarm["reason"]).startswith("Threshold Crossed: 1 datapoint [1.0")
        table = captured.cli("local", "status", "--state", str(captured.up.state_path))
        assert f"{failures}: ALARM since " in table
        # AND the check's log says why, as its log group in AWS would
        assert any("UnicodeDecodeError" in line for line in log_lines(captured, "wine-native"))
    finally:
        s3.delete_object(Bucket=bucket, Key=key)


def test_a_batch_deployments_check_reads_the_rows_its_run_scored(captured: Captured, zoo: dict[str, ZooModel]) -> None:
    model = zoo[PIPELINE]
    training = [{"id": f"r{i}", **row} for i, row in enumerate(model.sample.to_pylist())]
    bucket, prefix, _ = batch_location(captured.up.state, NIGHTLY)
    s3 = captured.up.emulator("s3")

    def run_then_check(rows: list[dict[str, Any]]) -> None:
        """A run over `rows` (as `local run-batch` starts it), then the check's schedule fires."""
        s3.put_object(Bucket=bucket, Key=f"{prefix}rows.jsonl", Body="\n".join(map(json.dumps, rows)).encode())
        captured.cli("local", "run-batch", NIGHTLY, "--state", str(captured.up.state_path))
        fire = f"{captured.up.api}/_servestack/schedules/servestack-{NIGHTLY}-monitor/fire"
        assert control("POST", fire, developer(captured.up.state), "us-east-1", timeout_sec=120) == (
            200, {"invoked": True},
        )  # fmt: skip

    def drift(state: str) -> dict[str, Any] | None:
        (alarm,) = [a for a in status_alarms(captured, NIGHTLY) if a["name"] == f"servestack-{NIGHTLY}-drift"]
        return dict(alarm) if alarm["state"] == state and str(alarm["reason"]).startswith("Threshold") else None

    # GIVEN a run over the training rows (the package's baseline) / WHEN its check runs, as its role
    run_then_check(training)
    # THEN it reads every row the run scored, joined to its prediction, and finds no drift: the alarm is OK
    alarm = wait_for(lambda: drift("OK"), "the batch drift alarm OK", timeout_sec=180, poll_sec=1.0)
    assert alarm["reason"].startswith("Threshold Crossed: 1 datapoint [0.0")
    cloudwatch = captured.up.emulator("cloudwatch")
    points = cloudwatch.get_metric_statistics(
        Namespace="servestack/Drift", MetricName="CapturedRows", Period=3600, Statistics=["Maximum"],
        Dimensions=[{"Name": "Deployment", "Value": NIGHTLY}],
        StartTime=datetime.now(UTC) - timedelta(hours=1), EndTime=datetime.now(UTC) + timedelta(minutes=1),
    )["Datapoints"]  # fmt: skip
    assert max(point["Maximum"] for point in points) == model.rows
    # WHEN the next run scores rows whose alcohol reads 3 points high and a fifth of them a shade the model never saw
    shifted = [
        row | {"alcohol": row["alcohol"] + 3} | ({"shade": "violet"} if i % 5 == 0 else {})
        for i, row in enumerate(training)
    ]
    run_then_check(shifted)
    # THEN the check reads that run (the earlier one's parts were replaced by it) and the drift alarm is in ALARM
    alarm = wait_for(lambda: drift("ALARM"), "the batch drift alarm in ALARM", timeout_sec=180, poll_sec=1.0)
    assert alarm["reason"].startswith("Threshold Crossed: 1 datapoint [1.0")
    # AND its check did not fail: its failure alarm is quiet
    (failures,) = [a for a in status_alarms(captured, NIGHTLY) if a["name"].endswith("-monitor-failures")]
    assert failures["state"] == "OK"
