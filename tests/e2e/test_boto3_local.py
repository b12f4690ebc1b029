"""boto3's `sagemaker-runtime` and `lambda` clients, unchanged but for `endpoint_url`, against `local up`.

One `servestack local up` (a subprocess, the repo's serving.yaml) serves the whole module; the clients are
real boto3 clients with dummy credentials, so every answer goes through botocore's own response and error
parsing (rest-json), exactly as it would against AWS.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

from servestack.client import SageMakerClient
from servestack.local.processes import free_port
from tests.conftest import ARTIFACTS, EVENTS, REPO_ROOT

pytestmark = pytest.mark.slow
SERVESTACK = str(Path(sys.executable).parent / "servestack")
DUMMY = {"region_name": "us-east-1", "aws_access_key_id": "local", "aws_secret_access_key": "local"}
DIGITS = (ARTIFACTS / "digits/1/sample-request.json").read_bytes()
CANCER = (ARTIFACTS / "breast-cancer/1/sample-request.json").read_bytes()


@dataclass
class LocalUp:
    state: dict[str, Any]
    log: Path

    @property
    def api(self) -> str:
        return str(self.state["aws_api_url"])

    def client(self, service: str) -> Any:
        config = Config(retries={"mode": "standard", "max_attempts": 1}, read_timeout=60)
        return boto3.session.Session(**DUMMY).client(service, endpoint_url=self.api, config=config)

    def emulator(self, service: str) -> Any:
        return boto3.session.Session(**DUMMY).client(service, endpoint_url=self.state["endpoint_url"])

    def url(self, deployment: str) -> str:
        return str(self.state["deployments"][deployment]["url"])


@pytest.fixture(scope="module")
def local_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalUp]:
    where = tmp_path_factory.mktemp("boto3-local")
    state_path, log_path = where / "local.json", where / "local-up.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "SERVESTACK_LOCAL_STATE": str(state_path)}
    env.pop("AWS_ENDPOINT_URL", None)
    argv = [SERVESTACK, "local", "up", "--port", str(free_port()), "--aws-port", str(free_port())]
    with log_path.open("wb") as log:
        process = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 90
        while not state_path.exists():  # written once every child answers and the AWS front listens
            assert process.poll() is None, f"local up exited:\n{log_path.read_text()[-4000:]}"
            assert time.monotonic() < deadline, f"local up not ready:\n{log_path.read_text()[-4000:]}"
            time.sleep(0.2)
        yield LocalUp(json.loads(state_path.read_text()), log_path)
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0


def direct(url: str, body: bytes, **headers: str) -> bytes:
    """The realtime container's own answer, without the SageMaker front."""
    request = urllib.request.Request(
        f"{url}/invocations", data=body, headers={"Content-Type": "application/json", **headers}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return bytes(response.read())


def http_api_event(body: bytes) -> dict[str, Any]:
    event: dict[str, Any] = json.loads((EVENTS / "apiGatewayHttpApiV2Event.json").read_text())
    event["body"], event["headers"]["content-length"] = body.decode(), str(len(body))
    return event


# ------------------------------------------------------------------------------------------ SageMaker Runtime


def test_invoke_endpoint_answers_what_the_realtime_server_answers(local_up: LocalUp) -> None:
    # GIVEN a sagemaker-runtime client pointed at local up
    runtime = local_up.client("sagemaker-runtime")
    # WHEN the realtime deployment is invoked by its name, with custom attributes
    response = runtime.invoke_endpoint(
        EndpointName="digits-realtime", ContentType="application/json", Body=DIGITS, CustomAttributes="trace=42"
    )
    # THEN the body is byte for byte the container's own answer, with the headers boto3 parses
    assert response["Body"].read() == direct(local_up.url("digits-realtime"), DIGITS)
    assert response["ContentType"] == "application/json"
    assert response["InvokedProductionVariant"] == "primary"
    assert response["CustomAttributes"] == "trace=42"


def test_target_model_selects_another_bundled_model(local_up: LocalUp) -> None:
    # GIVEN the realtime container serves every bundled model (digits by default)
    runtime = local_up.client("sagemaker-runtime")
    # WHEN TargetModel names breast-cancer (as a multi-model endpoint's caller does)
    response = runtime.invoke_endpoint(
        EndpointName="digits-realtime", ContentType="application/json", Body=CANCER, TargetModel="breast-cancer.tar.gz"
    )
    answer = json.loads(response["Body"].read())
    # THEN breast-cancer answered, as the container answers the same header directly
    expected = direct(local_up.url("digits-realtime"), CANCER, **{"X-Amzn-SageMaker-Target-Model": "breast-cancer"})
    assert answer["model"] == "breast-cancer"
    assert answer == json.loads(expected)


def test_servestack_sagemaker_client_works_against_local_up(local_up: LocalUp) -> None:
    # GIVEN servestack's own SageMakerClient with endpoint_url
    client = SageMakerClient(
        "digits-realtime", endpoint_url=local_up.api, session=boto3.session.Session(**DUMMY), max_attempts=1
    )
    rows = json.loads(DIGITS)["instances"]
    # WHEN it predicts THEN the predictions are the container's
    assert (
        client.predict(rows)["predictions"]
        == json.loads(direct(local_up.url("digits-realtime"), DIGITS))["predictions"]
    )


def test_malformed_body_raises_model_error_with_the_container_status(local_up: LocalUp) -> None:
    runtime = local_up.client("sagemaker-runtime")
    # WHEN the body is not JSON
    with pytest.raises(runtime.exceptions.ModelError) as raised:
        runtime.invoke_endpoint(EndpointName="digits-realtime", ContentType="application/json", Body=b"{not json")
    # THEN botocore parsed SageMaker's ModelError members, the container's error inside
    error = raised.value.response
    assert error["Error"]["Code"] == "ModelError"
    assert error["OriginalStatusCode"] == 400
    assert json.loads(error["OriginalMessage"])["error"]["type"] == "InvalidInput"
    assert error["LogStreamArn"].endswith(":log-group:/aws/sagemaker/Endpoints/digits-realtime")
    assert "Received client error (400) from primary" in error["Error"]["Message"]
    # AND an unreadable content type is the container's 415, also as ModelError
    with pytest.raises(runtime.exceptions.ModelError) as raised:
        runtime.invoke_endpoint(EndpointName="digits-realtime", ContentType="image/png", Body=b"\x89PNG")
    assert raised.value.response["OriginalStatusCode"] == 415


def test_unknown_endpoint_and_bad_requests_raise_validation_error(local_up: LocalUp) -> None:
    runtime = local_up.client("sagemaker-runtime")
    with pytest.raises(runtime.exceptions.ValidationError, match="Endpoint nope of account 123456789012 not found"):
        runtime.invoke_endpoint(EndpointName="nope", ContentType="application/json", Body=DIGITS)
    with pytest.raises(runtime.exceptions.ValidationError, match="call InvokeEndpointAsync"):
        runtime.invoke_endpoint(EndpointName="cancer-async", ContentType="application/json", Body=CANCER)
    with pytest.raises(runtime.exceptions.ValidationError, match="at 'endpointName' failed to satisfy constraint"):
        runtime.invoke_endpoint(EndpointName="not_a_name", Body=DIGITS)
    with pytest.raises(runtime.exceptions.ValidationError, match="TargetVariant blue"):
        runtime.invoke_endpoint(EndpointName="digits-realtime", Body=DIGITS, TargetVariant="blue")
    with pytest.raises(runtime.exceptions.ValidationError, match="could not read the payload"):
        runtime.invoke_endpoint_async(EndpointName="cancer-async", InputLocation="s3://servestack-cancer-async/none")


def test_invoke_endpoint_async_writes_the_prediction_at_the_output_location(local_up: LocalUp) -> None:
    # GIVEN a payload in the emulator's S3 and a caller-chosen inference id
    s3 = local_up.emulator("s3")
    s3.put_object(Bucket="servestack-cancer-async", Key="inputs/request.json", Body=CANCER)
    runtime = local_up.client("sagemaker-runtime")
    # WHEN the async deployment is invoked on it
    response = runtime.invoke_endpoint_async(
        EndpointName="cancer-async",
        ContentType="application/json",
        InputLocation="s3://servestack-cancer-async/inputs/request.json",
        InferenceId="my-request-1",
    )
    # THEN SageMaker's answer comes back: 202, the inference id, and where the result will be
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 202
    assert response["InferenceId"] == "my-request-1"
    bucket, _, key = response["OutputLocation"].removeprefix("s3://").partition("/")
    # AND the object appears there with the model's prediction
    deadline = time.monotonic() + 30
    while True:
        try:
            result = json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
            break
        except s3.exceptions.NoSuchKey:
            assert time.monotonic() < deadline, f"no result at {response['OutputLocation']}"
            time.sleep(0.2)
    reference = json.loads((ARTIFACTS / "breast-cancer/1/sample-response.json").read_text())
    assert result["predictions"] == reference["predictions"]


# ------------------------------------------------------------------------------------------ Lambda


def test_lambda_request_response_with_an_http_api_event(local_up: LocalUp) -> None:
    # GIVEN a lambda client and an API Gateway HTTP API v2 event carrying the digits sample
    functions = local_up.client("lambda")
    # WHEN the serverless deployment's function is invoked, by ARN with the `live` alias, with its log tail
    response = functions.invoke(
        FunctionName="arn:aws:lambda:us-east-1:123456789012:function:digits-api:live",
        Payload=json.dumps(http_api_event(DIGITS)),
        LogType="Tail",
    )
    # THEN the handler's HTTP API response comes back, the same predictions as the realtime container
    assert response["StatusCode"] == 200
    assert "FunctionError" not in response
    assert response["ExecutedVersion"] == "$LATEST"
    answer = json.loads(response["Payload"].read())
    assert answer["statusCode"] == 200
    expected = json.loads(direct(local_up.url("digits-realtime"), DIGITS))
    assert json.loads(answer["body"])["predictions"] == expected["predictions"]
    # AND the log tail is the invocation's log, as Lambda frames it
    log = base64.b64decode(response["LogResult"]).decode()
    request_id = response["ResponseMetadata"]["RequestId"]
    assert log.startswith(f"START RequestId: {request_id} Version: $LATEST")
    assert f"REPORT RequestId: {request_id}\tDuration: " in log


def test_lambda_handler_that_raises_is_an_unhandled_function_error(local_up: LocalUp) -> None:
    functions = local_up.client("lambda")
    # WHEN the serverless handler gets an event Mangum cannot infer a handler for (it raises RuntimeError)
    response = functions.invoke(FunctionName="digits-api", Payload=b'{"not": "an http event"}', LogType="Tail")
    # THEN Lambda's Unhandled error payload comes back, and the log tail has the runtime's [ERROR] line
    assert response["StatusCode"] == 200
    assert response["FunctionError"] == "Unhandled"
    error = json.loads(response["Payload"].read())
    assert error["errorType"] == "RuntimeError"
    assert "unable to infer a handler" in error["errorMessage"]
    assert error["stackTrace"]
    assert all(isinstance(frame, str) for frame in error["stackTrace"])
    assert "[ERROR] RuntimeError: The adapter was unable to infer" in base64.b64decode(response["LogResult"]).decode()


def test_lambda_event_invocation_runs_in_the_background(local_up: LocalUp) -> None:
    # GIVEN the batch deployment's function and an output prefix of this test's own
    functions = local_up.client("lambda")
    prefix = "batch/boto3-event/output/"
    # WHEN it is invoked with InvocationType=Event
    response = functions.invoke(
        FunctionName="cancer-nightly", InvocationType="Event", Payload=json.dumps({"output_prefix": prefix})
    )
    # THEN Lambda's 202 comes back at once, and the run writes its manifest in the emulator's S3
    assert response["StatusCode"] == 202
    assert response["Payload"].read() == b""
    s3 = local_up.emulator("s3")
    deadline = time.monotonic() + 30
    while True:
        try:
            manifest = json.loads(
                s3.get_object(Bucket="servestack-cancer-nightly", Key=f"{prefix}manifest.json")["Body"].read()
            )
            break
        except s3.exceptions.NoSuchKey:
            assert time.monotonic() < deadline, "the Event invocation wrote no manifest"
            time.sleep(0.2)
    assert manifest["rows"]["succeeded"] == len(json.loads(CANCER)["instances"])


def test_lambda_dry_run_and_request_errors(local_up: LocalUp) -> None:
    functions = local_up.client("lambda")
    # DryRun validates and runs nothing
    assert functions.invoke(FunctionName="cancer-async-worker", InvocationType="DryRun")["StatusCode"] == 204
    # an unknown function, or a numbered version (local mode runs $LATEST and aliases), is not found
    with pytest.raises(functions.exceptions.ResourceNotFoundException, match="function:nope"):
        functions.invoke(FunctionName="nope")
    with pytest.raises(functions.exceptions.ResourceNotFoundException, match="function:digits-api:3"):
        functions.invoke(FunctionName="digits-api", Qualifier="3")
    # a payload that is not JSON is refused before the handler runs
    with pytest.raises(functions.exceptions.InvalidRequestContentException, match="Could not parse request body"):
        functions.invoke(FunctionName="digits-api", Payload=b"{not json")
