"""The template-driven `local up` with IAM enforced, every mode exercised as in the cloud: boto3 with the
templates' names, the IAM-authenticated HTTP APIs, an async payload over the inline limit through the upload
path (S3 notification, presigned PUT), and a batch run with a bad row. Each function runs with its own role's
keys, so any call a template does not allow fails here, as it would after `cdk deploy`."""

from __future__ import annotations

import base64
import json
import shlex
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from botocore.exceptions import ClientError

from servestack.local.emulator.callers import signed
from servestack.local.iam.identities import Credentials
from tests.conftest import ARTIFACTS, EVENTS, REPO_ROOT
from tests.e2e.conftest import SERVESTACK, LocalUp, start_local_up, wait_for

pytestmark = pytest.mark.slow
DIGITS = json.loads((ARTIFACTS / "digits/1/sample-request.json").read_text())
CANCER = json.loads((ARTIFACTS / "breast-cancer/1/sample-request.json").read_text())
DEVELOPER = Credentials("arn:aws:iam::123456789012:user/developer", "local", "local")


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalUp]:
    where = tmp_path_factory.mktemp("enforced")
    local = start_local_up(where, "--fresh", "--data-dir", str(where / "data"))
    yield local
    assert local.stop() == 0, local.log_text()[-4000:]


def template(stack: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((REPO_ROOT / ".servestack/cdk.out" / f"{stack}.template.json").read_text())
    return loaded


def test_iam_is_enforced_and_said_so(up: LocalUp) -> None:
    assert up.state["iam_enforced"] is True
    assert "IAM: enforced from the templates" in up.log_text()


def test_realtime_through_boto3_with_the_templates_endpoint_name(up: LocalUp, sklearn_digits: Any) -> None:
    # GIVEN the endpoint name the realtime stack's template declares
    (endpoint,) = (
        r["Properties"]["EndpointName"]
        for r in template("servestack-digits-realtime")["Resources"].values()
        if r["Type"] == "AWS::SageMaker::Endpoint"
    )
    assert endpoint == "servestack-digits-realtime"
    runtime = up.client("sagemaker-runtime")
    # WHEN boto3 invokes it, unchanged but for endpoint_url
    response = runtime.invoke_endpoint(EndpointName=endpoint, ContentType="application/json", Body=json.dumps(DIGITS))
    # THEN the predictions are scikit-learn's
    answer = json.loads(response["Body"].read())
    assert answer["predictions"] == sklearn_digits.predict(np.array(DIGITS["instances"])).tolist()
    assert response["InvokedProductionVariant"] == "primary"
    # AND the cloud's refusals hold: a single-model endpoint takes no TargetModel
    with pytest.raises(runtime.exceptions.ValidationError, match="is not a multi-model endpoint"):
        runtime.invoke_endpoint(EndpointName=endpoint, Body=json.dumps(DIGITS), TargetModel="breast-cancer.tar.gz")


def test_serverless_through_boto3_with_the_templates_function_name_and_alias(up: LocalUp) -> None:
    # GIVEN the serverless stack's function, by the name its template gives it (fixed: the pipeline's smoke
    # test is granted InvokeFunction on it by name)
    names = up.deployment("digits-api")["lambda_functions"]
    (name,) = (n for logical, n in names.items() if logical.startswith("ServerlessFunction"))
    assert name == "servestack-digits-api"
    event = json.loads((EVENTS / "apiGatewayHttpApiV2Event.json").read_text())
    event["body"] = json.dumps(DIGITS)
    # WHEN boto3's lambda.invoke calls it through its `live` alias (the template's alias)
    functions = up.client("lambda")
    response = functions.invoke(FunctionName=name, Qualifier="live", Payload=json.dumps(event))
    # THEN the handler answers with the predictions
    answer = json.loads(response["Payload"].read())
    assert response["StatusCode"] == 200
    assert "FunctionError" not in response
    assert json.loads(answer["body"])["predictions"] == [0, 1, 2, 3]
    # AND a qualifier the template does not publish is not found, as in the cloud
    with pytest.raises(functions.exceptions.ResourceNotFoundException):
        functions.invoke(FunctionName=name, Qualifier="blue", Payload=json.dumps(event))


def test_the_http_api_needs_sigv4_as_its_route_says(up: LocalUp) -> None:
    url = up.deployment("digits-api")["url"]
    body = json.dumps(DIGITS).encode()
    # WHEN unsigned THEN API Gateway's 403
    unsigned = httpx.post(f"{url}/invocations", content=body, headers={"Content-Type": "application/json"})
    assert unsigned.status_code == 403
    # WHEN signed with keys that exist nowhere THEN 403 too
    stranger = Credentials("arn:aws:iam::123456789012:user/nobody", "AKIANOBODY0000000000", "wrong")
    status, _ = signed("POST", f"{url}/invocations", stranger, "us-east-1", body=body,
                       headers={"Content-Type": "application/json"})  # fmt: skip
    assert status == 403
    # WHEN signed by the developer (allowed execute-api:Invoke) THEN the function answers
    status, answer = signed("POST", f"{url}/invocations", DEVELOPER, "us-east-1", body=body,
                            headers={"Content-Type": "application/json"})  # fmt: skip
    assert status == 200
    assert json.loads(answer)["predictions"] == [0, 1, 2, 3]


def test_an_async_payload_over_the_inline_limit_goes_through_the_upload_path(up: LocalUp) -> None:
    # GIVEN a payload of more than 256 KiB (the deployment's presign threshold): 1,500 rows of breast-cancer
    rows = (CANCER["instances"] * 400)[:1500]
    payload = json.dumps({"instances": rows}).encode()
    assert len(payload) > 256 * 1024
    url = up.deployment("cancer-async")["url"]
    # WHEN the caller asks for an upload URL (signed), PUTs the payload there, and does nothing else
    status, answer = signed("POST", f"{url}/jobs/uploads", DEVELOPER, "us-east-1",
                            body=b'{"content_type": "application/json"}')  # fmt: skip
    assert status == 201, answer
    job = json.loads(answer)
    put = httpx.request("PUT", job["upload"]["url"], content=payload, headers=job["upload"]["headers"], timeout=60)
    assert put.status_code == 200, put.text

    # THEN S3's notification starts the job (the template's notification, queue policy and grants at work)
    def finished() -> dict[str, Any] | None:
        _, body = signed("GET", job["status_url"], DEVELOPER, "us-east-1")
        current: dict[str, Any] = json.loads(body)
        return current if current["status"] in ("succeeded", "failed") else None

    outcome = wait_for(finished, 90, "the uploaded job")
    assert outcome["status"] == "succeeded", outcome
    result = httpx.get(outcome["result"]["url"], timeout=60)
    assert result.status_code == 200
    assert len(json.loads(result.content)["predictions"]) == 1500
    # AND confirming the upload (HeadObject as the submit function) is allowed and changes nothing
    status, confirmed = signed("POST", job["confirm_url"], DEVELOPER, "us-east-1")
    assert status == 202, confirmed


def test_a_batch_run_with_a_bad_row_accounts_for_every_row(up: LocalUp) -> None:
    # GIVEN the batch deployment's input prefix (from its schedule's input) holding a file with one bad row
    batch = up.deployment("cancer-nightly")
    bucket, prefix = batch["input"]["bucket"], batch["input"]["input_prefix"]
    lines = [json.dumps(row) for row in CANCER["instances"]] + ['{"not": "a row"}']
    up.emulator("s3").put_object(Bucket=bucket, Key=f"{prefix}bad.jsonl", Body="\n".join(lines).encode())
    # WHEN `servestack local run-batch` runs it (the function, as its role, with its schedule's input), twice
    for _ in range(2):  # the second run reads back and reuses its parts: that needs its grants too
        result = subprocess.run(
            [SERVESTACK, "local", "run-batch", "cancer-nightly", "--state", str(up.state_path)],
            cwd=REPO_ROOT, capture_output=True, timeout=300, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr.decode()[-3000:]
    # THEN every row is accounted for: the good rows succeeded, the bad one is an error, and local up's seeded
    # sample left the prefix once the user's file was there, so none of its rows is in the results
    summary = json.loads(result.stdout.decode().splitlines()[-1])
    assert summary["rows"]["succeeded"] == len(CANCER["instances"])
    assert summary["rows"]["failed"] == 1
    listed = up.emulator("s3").list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]
    assert [item["Key"] for item in listed] == [f"{prefix}bad.jsonl"]
    errors = up.emulator("s3").get_object(Bucket=bucket, Key=f"{batch['input']['output_prefix']}errors.jsonl")
    assert b"bad.jsonl" in errors["Body"].read()


def test_a_role_may_do_only_what_its_template_allows(up: LocalUp) -> None:
    # GIVEN the keys local up gave the batch function's role (the state file records them, for replays)
    batch = up.deployment("cancer-nightly")
    s3 = up.emulator("s3", **up.role_keys("BatchFunctionRole"))
    bucket = batch["input"]["bucket"]
    key = batch["seeded"]
    if not up.emulator("s3").list_objects_v2(Bucket=bucket, Prefix=key)["KeyCount"]:  # run-batch retired it
        up.emulator("s3").put_object(Bucket=bucket, Key=key, Body=b"[]\n")
    # WHEN it reads its input THEN allowed
    s3.get_object(Bucket=bucket, Key=key)
    # WHEN it deletes its input THEN AccessDenied, naming the action and the resource, as AWS words it
    with pytest.raises(ClientError) as raised:
        s3.delete_object(Bucket=bucket, Key=key)
    error = raised.value.response["Error"]
    assert error["Code"] == "AccessDenied"
    assert "s3:DeleteObject" in error["Message"]
    assert f"arn:aws:s3:::{bucket}/{key}" in error["Message"]
    # AND keys nobody issued are refused outright
    stranger = up.emulator("s3", region_name="us-east-1", aws_access_key_id="AKIAUNKNOWN", aws_secret_access_key="x")
    with pytest.raises(ClientError) as raised:
        stranger.list_buckets()
    assert raised.value.response["Error"]["Code"] in ("InvalidAccessKeyId", "InvalidClientTokenId")


def test_invoke_command_calls_every_kind_of_deployment(up: LocalUp) -> None:
    for name, data in (("digits-realtime", "digits"), ("digits-api", "digits"), ("cancer-async", "breast-cancer")):
        result = subprocess.run(
            [SERVESTACK, "invoke", name, "--data", str(ARTIFACTS / data / "1/sample-request.json"),
             "--state", str(up.state_path)],
            cwd=REPO_ROOT, capture_output=True, timeout=120, check=False,
        )  # fmt: skip
        assert result.returncode == 0, (name, result.stderr.decode()[-2000:])
        reference = json.loads((ARTIFACTS / data / "1/sample-response.json").read_text())
        assert json.loads(result.stdout)["predictions"] == reference["predictions"]


def test_invoke_takes_the_upload_route_by_itself_for_a_2_mb_async_payload(up: LocalUp, tmp_path: Path) -> None:
    # GIVEN a 2 MB request for the async deployment: eight times the API's inline limit
    rows = CANCER["instances"] * (2 * 1024 * 1024 // len(json.dumps(CANCER["instances"])) + 1)
    payload = tmp_path / "big-request.json"
    payload.write_text(json.dumps({"instances": rows}))
    mib = payload.stat().st_size / 2**20
    assert mib >= 2
    # WHEN the user invokes it as for any other payload (not on a terminal: plain progress lines)
    result = subprocess.run(
        [SERVESTACK, "invoke", "cancer-async", "--data", str(payload), "--state", str(up.state_path)],
        cwd=REPO_ROOT, capture_output=True, timeout=180, check=False,
    )  # fmt: skip
    # THEN the CLI uploaded it through the presigned URL, the job ran, and every row has its prediction
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    said = result.stderr.decode()
    assert f"uploading {mib:.1f} MiB through a presigned S3 URL" in said, said
    assert f"uploaded {mib:.1f}/{mib:.1f} MiB" in said, said
    assert "\r" not in said  # no redrawn terminal line in a log
    predictions = json.loads(result.stdout)["predictions"]
    assert len(predictions) == len(rows)
    assert (
        predictions[: len(CANCER["instances"])]
        == json.loads((ARTIFACTS / "breast-cancer/1/sample-response.json").read_text())["predictions"]
    )


def test_explain_lists_every_resource_type_as_emulated_or_reported(tmp_path: Path) -> None:
    result = subprocess.run(
        [SERVESTACK, "local", "up", "--explain"], cwd=REPO_ROOT, capture_output=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    text = result.stdout.decode()
    for stack in ("servestack-digits-realtime", "servestack-digits-api", "servestack-cancer-async"):
        for r in template(stack)["Resources"].values():
            assert r["Type"] in text
    assert "reported  AWS::CloudWatch::Alarm" in text
    assert "emulated  AWS::Lambda::EventSourceMapping" in text


# ------------------------------------------------------------------------------------------ as a user runs it


def printed_lines(up: LocalUp) -> list[str]:
    return [
        line.strip() for line in up.log_text().splitlines() if line.startswith("curl ") or " local run-batch " in line
    ]


def run_printed(line: str) -> bytes:
    return subprocess.run(shlex.split(line), cwd=REPO_ROOT, capture_output=True, check=True, timeout=120).stdout


def test_the_printed_commands_work_as_printed(up: LocalUp, sklearn_digits: Any) -> None:
    lines = printed_lines(up)
    realtime_url = up.deployment("digits-realtime")["url"]
    realtime = [line for line in lines if realtime_url in line]
    serverless = next(line for line in lines if up.deployment("digits-api")["url"] in line)
    submit = next(line for line in lines if line.endswith("sample-request.json") and "/jobs " in line)
    # WHEN the realtime container lines run as printed THEN it is ready and predicts what scikit-learn predicts
    assert json.loads(run_printed(realtime[0])) == {"status": "ready"}
    expected = sklearn_digits.predict(np.array(DIGITS["instances"])).tolist()
    assert json.loads(run_printed(realtime[1]))["predictions"] == expected
    # AND the serverless line (curl --aws-sigv4 through the IAM-authenticated HTTP API) gives the same
    assert "--aws-sigv4" in serverless
    assert json.loads(run_printed(serverless))["predictions"] == expected
    # AND the async line queues a job that succeeds
    job = json.loads(run_printed(submit))
    assert job["status"] == "queued"

    def done() -> dict[str, Any] | None:
        _, body = signed("GET", job["status_url"], DEVELOPER, "us-east-1")
        current: dict[str, Any] = json.loads(body)
        return current if current["status"] in ("succeeded", "failed") else None

    assert wait_for(done, 60, "the printed job")["status"] == "succeeded"


# ------------------------------------------------------------------------------------------ boto3, unchanged


def direct(up: LocalUp, body: bytes, **headers: str) -> bytes:
    """The realtime container's own answer, without the SageMaker front."""
    response = httpx.post(
        f"{up.deployment('digits-realtime')['url']}/invocations",
        content=body,
        headers={"Content-Type": "application/json", **headers},
        timeout=30,
    )
    return response.content


def test_invoke_endpoint_answers_what_the_container_answers(up: LocalUp) -> None:
    body = json.dumps(DIGITS).encode()
    response = up.client("sagemaker-runtime").invoke_endpoint(
        EndpointName="servestack-digits-realtime", ContentType="application/json", Body=body,
        CustomAttributes="trace=42",
    )  # fmt: skip
    assert response["Body"].read() == direct(up, body)
    assert response["ContentType"] == "application/json"
    assert response["CustomAttributes"] == "trace=42"


def test_servestack_sagemaker_client_works_against_local_up(up: LocalUp) -> None:
    import boto3

    from servestack.client import SageMakerClient

    session = boto3.session.Session(region_name="us-east-1", aws_access_key_id="local", aws_secret_access_key="local")
    client = SageMakerClient("servestack-digits-realtime", endpoint_url=up.api, session=session, max_attempts=1)
    assert client.predict(DIGITS["instances"])["predictions"] == [0, 1, 2, 3]


def test_a_malformed_body_is_a_model_error_with_the_container_status(up: LocalUp) -> None:
    runtime = up.client("sagemaker-runtime")
    with pytest.raises(runtime.exceptions.ModelError) as raised:
        runtime.invoke_endpoint(EndpointName="servestack-digits-realtime", ContentType="application/json", Body=b"{")
    error = raised.value.response
    assert error["OriginalStatusCode"] == 400
    assert json.loads(error["OriginalMessage"])["error"]["type"] == "InvalidInput"
    assert error["LogStreamArn"].endswith(":log-group:/aws/sagemaker/Endpoints/servestack-digits-realtime")
    assert "Received client error (400) from primary" in error["Error"]["Message"]


def test_only_the_templates_endpoints_exist(up: LocalUp) -> None:
    runtime = up.client("sagemaker-runtime")
    # a deployment name is not an endpoint name; the template's is
    with pytest.raises(runtime.exceptions.ValidationError, match="Endpoint digits-realtime of account"):
        runtime.invoke_endpoint(EndpointName="digits-realtime", Body=json.dumps(DIGITS))
    # the async deployment runs on Lambda: it has no SageMaker endpoint to call asynchronously
    with pytest.raises(runtime.exceptions.ValidationError, match="not found"):
        runtime.invoke_endpoint_async(EndpointName="servestack-cancer-async", InputLocation="s3://b/k")


def test_lambda_invoke_log_tail_errors_events_and_dry_runs(up: LocalUp) -> None:
    functions = up.client("lambda")
    serverless = next(iter(up.deployment("digits-api")["lambda_functions"].values()))
    # a handler that raises: Lambda's Unhandled payload, and the runtime's [ERROR] line in the log tail
    response = functions.invoke(FunctionName=serverless, Payload=b'{"not": "an http event"}', LogType="Tail")
    assert response["FunctionError"] == "Unhandled"
    assert json.loads(response["Payload"].read())["errorType"] == "RuntimeError"
    log = base64.b64decode(response["LogResult"]).decode()
    assert log.startswith(f"START RequestId: {response['ResponseMetadata']['RequestId']} Version: $LATEST")
    # DryRun validates and runs nothing; a version the template does not publish is not found
    assert functions.invoke(FunctionName=serverless, InvocationType="DryRun")["StatusCode"] == 204
    with pytest.raises(functions.exceptions.ResourceNotFoundException, match=f"function:{serverless}:3"):
        functions.invoke(FunctionName=serverless, Qualifier="3")
    with pytest.raises(functions.exceptions.ResourceNotFoundException, match="function:digits-api"):
        functions.invoke(FunctionName="digits-api")
    with pytest.raises(functions.exceptions.InvalidRequestContentException):
        functions.invoke(FunctionName=serverless, Payload=b"{not json")


def test_an_event_invocation_of_the_batch_function_runs_in_the_background(up: LocalUp) -> None:
    batch = up.deployment("cancer-nightly")
    payload = dict(batch["input"])
    response = up.client("lambda").invoke(FunctionName=batch["target"], InvocationType="Event",
                                          Payload=json.dumps(payload))  # fmt: skip
    assert response["StatusCode"] == 202
    s3 = up.emulator("s3")
    key = f"{payload['output_prefix']}manifest.json"
    wait_for(lambda: s3.list_objects_v2(Bucket=payload["bucket"], Prefix=key).get("KeyCount"), 120, "the manifest")


def test_same_key_submits_sent_at_once_make_one_job_and_the_refused_one_nothing(up: LocalUp) -> None:
    # GIVEN two signed submits under one Idempotency-Key with different bodies, released at the same moment (local
    # up runs one execution environment per function, so they reach the submit function one after the other; the
    # race of concurrent sandboxes is tests/integration/test_async_idempotency.py's): the submit role's grants
    # (GetItem, PutItem) carry the key's claim, its refusal and its replay
    url = up.deployment("cancer-async")["url"]
    bodies = [json.dumps(CANCER).encode(), json.dumps({"instances": CANCER["instances"][:1]}).encode()]
    headers = {"Content-Type": "application/json", "Idempotency-Key": "e2e-race-1"}
    barrier = threading.Barrier(len(bodies))
    answers: dict[bytes, tuple[int, bytes]] = {}

    def submit(body: bytes) -> None:
        barrier.wait()
        answers[body] = signed("POST", f"{url}/jobs", DEVELOPER, "us-east-1", body=body, headers=headers)

    threads = [threading.Thread(target=submit, args=(body,)) for body in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    # THEN one is the job (202) and the other is refused (422), each submit function acting as its role
    assert sorted(status for status, _ in answers.values()) == [202, 422], answers
    accepted = next(body for body, (status, _) in answers.items() if status == 202)
    job = json.loads(answers[accepted][1])

    def finished() -> dict[str, Any] | None:
        _, body = signed("GET", job["status_url"], DEVELOPER, "us-east-1")
        current: dict[str, Any] = json.loads(body)
        return current if current["status"] in ("succeeded", "failed") else None

    # AND the job ran on the accepted body
    outcome = wait_for(finished, 90, "the keyed job")
    assert outcome["status"] == "succeeded", outcome
    result = httpx.get(outcome["result"]["url"], timeout=60)
    assert len(json.loads(result.content)["predictions"]) == len(json.loads(accepted)["instances"])
    # AND the accepted caller's retry replays its own job
    status, replay = signed("POST", f"{url}/jobs", DEVELOPER, "us-east-1", body=accepted, headers=headers)
    assert (status, json.loads(replay)["job_id"], json.loads(replay)["replayed"]) == (202, job["job_id"], True)
