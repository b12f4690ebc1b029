"""SageMaker's multi-model and asynchronous paths through `local up`, as the templates declare them and with
IAM enforced: boto3's `invoke_endpoint(TargetModel=...)` on a `Mode: MultiModel` endpoint, and async jobs on
`backend: sagemaker` (InvokeEndpointAsync -> the container -> S3 output -> SNS -> queue -> the notifier ->
the job table) reaching `succeeded`, or `failed` with the container's reason."""

from __future__ import annotations

import json
from typing import Any

import pytest

from servestack.local.emulator.callers import signed
from servestack.local.iam.identities import Credentials
from tests.conftest import ARTIFACTS
from tests.e2e.conftest import LocalUp, wait_for

pytestmark = pytest.mark.slow
DEVELOPER = Credentials("arn:aws:iam::123456789012:user/developer", "local", "local")
DIGITS = (ARTIFACTS / "digits/1/sample-request.json").read_bytes()
CANCER = (ARTIFACTS / "breast-cancer/1/sample-request.json").read_bytes()
# digits-mme and cancer-sm of the shared local up (tests/e2e/conftest.py's SHARED_SPEC).


@pytest.fixture(scope="module")
def up(shared_up: LocalUp) -> LocalUp:
    return shared_up


def reference(model: str) -> Any:
    return json.loads((ARTIFACTS / model / "1/sample-response.json").read_text())["predictions"]


def test_target_model_picks_the_archive_on_a_multi_model_endpoint(up: LocalUp) -> None:
    runtime = up.client("sagemaker-runtime")
    endpoint = up.deployment("digits-mme")["endpoint_name"]
    # WHEN TargetModel names each model's archive under the endpoint's prefix
    cancer = runtime.invoke_endpoint(
        EndpointName=endpoint, TargetModel="breast-cancer/1.tar.gz", ContentType="application/json", Body=CANCER
    )
    digits = runtime.invoke_endpoint(
        EndpointName=endpoint, TargetModel="digits/1.tar.gz", ContentType="application/json", Body=DIGITS
    )
    # THEN each answers with its own model's predictions
    assert json.loads(cancer["Body"].read())["predictions"] == reference("breast-cancer")
    assert json.loads(digits["Body"].read())["predictions"] == reference("digits")
    # AND an archive that is not there is SageMaker's ValidationError; a missing TargetModel too
    with pytest.raises(runtime.exceptions.ValidationError, match="Failed to download model data"):
        runtime.invoke_endpoint(EndpointName=endpoint, TargetModel="nope/9.tar.gz", Body=DIGITS)
    with pytest.raises(runtime.exceptions.ValidationError, match="missing a target model header"):
        runtime.invoke_endpoint(EndpointName=endpoint, Body=DIGITS)


def job_outcome(up: LocalUp, url: str, job_id: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        _, body = signed("GET", f"{url}/jobs/{job_id}", DEVELOPER, "us-east-1")
        current: dict[str, Any] = json.loads(body)
        return current if current.get("status") in ("succeeded", "failed") else None

    outcome: dict[str, Any] = wait_for(done, 120, f"job {job_id}")
    return outcome


def test_an_async_job_on_the_sagemaker_backend_succeeds(up: LocalUp) -> None:
    url = up.deployment("cancer-sm")["url"]
    # WHEN a job is submitted through the deployment's API (submit calls InvokeEndpointAsync)
    status, body = signed("POST", f"{url}/jobs", DEVELOPER, "us-east-1", body=CANCER,
                          headers={"Content-Type": "application/json"})  # fmt: skip
    assert status == 202, body
    outcome = job_outcome(up, url, json.loads(body)["job_id"])
    # THEN SageMaker's success notification, recorded by the notifier, says succeeded, with the result
    assert outcome["status"] == "succeeded", outcome
    import httpx

    result = httpx.get(outcome["result"]["url"], timeout=30)
    assert json.loads(result.content)["predictions"] == reference("breast-cancer")


def test_a_poison_job_on_the_sagemaker_backend_fails_with_the_reason(up: LocalUp) -> None:
    url = up.deployment("cancer-sm")["url"]
    rows = json.loads(CANCER)["instances"]
    poison = json.dumps({"instances": [row[:29] for row in rows]}).encode()  # 29 features, not 30
    status, body = signed("POST", f"{url}/jobs", DEVELOPER, "us-east-1", body=poison,
                          headers={"Content-Type": "application/json"})  # fmt: skip
    assert status == 202, body
    outcome = job_outcome(up, url, json.loads(body)["job_id"])
    assert outcome["status"] == "failed"
    assert outcome["error"]["type"] == "InvalidInput"


def test_invoke_endpoint_async_writes_the_output_where_it_says(up: LocalUp) -> None:
    # GIVEN a payload in the deployment's bucket (the endpoint's role may read its request prefix)
    entry = up.deployment("cancer-sm")
    bucket = entry["bucket"]
    key = "async/servestack-cancer-sm/requests/boto3-input.json"
    s3 = up.emulator("s3")
    s3.put_object(Bucket=bucket, Key=key, Body=CANCER)
    runtime = up.client("sagemaker-runtime")
    # WHEN boto3 calls InvokeEndpointAsync on the template's endpoint
    response = runtime.invoke_endpoint_async(
        EndpointName=entry["endpoint_name"], InputLocation=f"s3://{bucket}/{key}", ContentType="application/json"
    )
    out_bucket, _, out_key = response["OutputLocation"].removeprefix("s3://").partition("/")

    def written() -> bytes | None:
        try:
            return bytes(s3.get_object(Bucket=out_bucket, Key=out_key)["Body"].read())
        except s3.exceptions.NoSuchKey:
            return None

    # THEN the prediction lands at OutputLocation
    assert json.loads(wait_for(written, 60, "the async output"))["predictions"] == reference("breast-cancer")
    # AND an endpoint that is not asynchronous refuses the async call
    with pytest.raises(runtime.exceptions.ValidationError, match="call InvokeEndpoint"):
        runtime.invoke_endpoint_async(EndpointName=up.deployment("digits-mme")["endpoint_name"],
                                      InputLocation=f"s3://{bucket}/{key}")  # fmt: skip
