"""Each engine's container gets its engine's limits in its environment (issue 38, finding 5)."""

from __future__ import annotations

from typing import Any

from servestack.aws_rules import LAMBDA_SYNC, SAGEMAKER_ASYNC, SAGEMAKER_REALTIME, SAGEMAKER_SERVERLESS
from tests.infra.conftest import Synth


def container_environments(synth: Synth, deployment: str) -> list[dict[str, Any]]:
    resources = synth.templates[f"servestack-{deployment}"]["Resources"].values()
    return [
        r["Properties"]["PrimaryContainer"]["Environment"] for r in resources if r["Type"] == "AWS::SageMaker::Model"
    ]


def function_environments(synth: Synth, deployment: str) -> list[dict[str, Any]]:
    resources = synth.templates[f"servestack-{deployment}"]["Resources"].values()
    return [
        r["Properties"]["Environment"]["Variables"]
        for r in resources
        if r["Type"] == "AWS::Lambda::Function" and "SERVESTACK_MAX_PAYLOAD_BYTES" in str(r["Properties"])
    ]


def test_a_sagemaker_async_container_takes_1_gb_for_an_hour(synth: Synth) -> None:
    # GIVEN a SageMaker async deployment with no max_payload_bytes of its own
    # WHEN it is synthesized
    (environment,) = container_environments(synth, "cancer-cpu-async")
    # THEN its container accepts what SageMaker async accepts, for as long as it allows
    assert environment["SERVESTACK_MAX_PAYLOAD_BYTES"] == str(SAGEMAKER_ASYNC.max_payload_bytes)
    assert environment["SERVESTACK_REQUEST_TIMEOUT_SEC"] == str(SAGEMAKER_ASYNC.timeout_sec)
    assert int(environment["SERVESTACK_MAX_BATCH_ROWS"]) >= SAGEMAKER_ASYNC.max_payload_bytes // 120
    # AND its submit function, invoked synchronously, keeps Lambda's limit (larger payloads are uploaded)
    assert {e["SERVESTACK_MAX_PAYLOAD_BYTES"] for e in function_environments(synth, "cancer-cpu-async")} == {
        str(LAMBDA_SYNC.max_payload_bytes)
    }


def test_a_serverless_inference_container_takes_4_mb(synth: Synth) -> None:
    # GIVEN a realtime deployment on SageMaker Serverless Inference
    # WHEN it is synthesized
    environments = container_environments(synth, "digits-sls")
    # THEN its container refuses past 4 MB, as Serverless Inference does, within its 60 s
    assert {e["SERVESTACK_MAX_PAYLOAD_BYTES"] for e in environments} == {str(SAGEMAKER_SERVERLESS.max_payload_bytes)}
    assert {e["SERVESTACK_REQUEST_TIMEOUT_SEC"] for e in environments} == {str(SAGEMAKER_SERVERLESS.timeout_sec)}


def test_an_instance_backed_realtime_container_keeps_6_mb_and_its_row_bounds(synth: Synth) -> None:
    # GIVEN the repository's realtime deployment
    # WHEN it is synthesized
    environments = container_environments(synth, "digits-realtime")
    # THEN its container takes InvokeEndpoint's 6 MB and 60 s, and the realtime row bounds stay the defaults
    assert {e["SERVESTACK_MAX_PAYLOAD_BYTES"] for e in environments} == {str(SAGEMAKER_REALTIME.max_payload_bytes)}
    assert {e["SERVESTACK_REQUEST_TIMEOUT_SEC"] for e in environments} == {str(SAGEMAKER_REALTIME.timeout_sec)}
    assert all("SERVESTACK_MAX_BATCH_ROWS" not in e for e in environments)
