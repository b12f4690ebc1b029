"""Data capture in the templates (servestack/cdk/capture.py): SageMaker's DataCaptureConfig and its grant, and the
log-line path (subscription filter -> Firehose -> S3) with its two least-privilege roles."""

from __future__ import annotations

import json
from typing import Any

import pytest

from servestack.spec import SpecError, parse_spec
from tests.infra.conftest import Synth


def _policies(synth: Synth, deployment: str) -> list[dict[str, Any]]:
    return [
        statement
        for policy in synth.resources(deployment, "AWS::IAM::Policy").values()
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]


def _joined(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def test_realtime_capture_is_sagemakers_own_under_the_capture_prefix(synth: Synth) -> None:
    (config,) = synth.resources("digits-captured", "AWS::SageMaker::EndpointConfig").values()
    capture = config["Properties"]["DataCaptureConfig"]

    assert capture["EnableCapture"] is True
    assert capture["InitialSamplingPercentage"] == 13  # 12.5 rounded up: SageMaker takes whole percents
    assert sorted(o["CaptureMode"] for o in capture["CaptureOptions"]) == ["Input", "Output"]
    assert capture["CaptureContentTypeHeader"] == {
        "CsvContentTypes": ["text/csv"],
        "JsonContentTypes": ["application/json"],
    }
    assert "capture/digits-captured" in _joined(capture["DestinationS3Uri"])
    puts = [s for s in _policies(synth, "digits-captured") if s["Action"] == "s3:PutObject"]
    assert any("/capture/digits-captured/*" in _joined(s["Resource"]) for s in puts)
    assert not synth.resources("digits-captured", "AWS::KinesisFirehose::DeliveryStream")


def test_realtime_capture_leaving_columns_out_goes_through_the_containers_log_lines(synth: Synth) -> None:
    (config,) = synth.resources("digits-captured-private", "AWS::SageMaker::EndpointConfig").values()
    assert "DataCaptureConfig" not in config["Properties"]
    for model in synth.resources("digits-captured-private", "AWS::SageMaker::Model").values():
        setting = json.loads(model["Properties"]["PrimaryContainer"]["Environment"]["SERVESTACK_CAPTURE"])
        assert setting["exclude_columns"] == ["pixel"]
        assert setting["mode"] == "realtime"
    (stream,) = synth.resources("digits-captured-private", "AWS::KinesisFirehose::DeliveryStream").values()
    assert stream["Properties"]["ExtendedS3DestinationConfiguration"]["Prefix"].startswith("private-capture/")
    (subscription,) = synth.resources("digits-captured-private", "AWS::Logs::SubscriptionFilter").values()
    assert subscription["Properties"]["FilterPattern"] == '{ $.servestack.deployment = "digits-captured-private" }'


@pytest.mark.parametrize(
    ("deployment", "mode"), [("digits-api-captured", "serverless"), ("cancer-async-captured", "async")]
)
def test_lambda_capture_ships_log_lines_through_firehose(synth: Synth, deployment: str, mode: str) -> None:
    functions = synth.resources(deployment, "AWS::Lambda::Function")
    captured = [
        f
        for f in functions.values()
        if "SERVESTACK_CAPTURE" in f["Properties"].get("Environment", {}).get("Variables", {})
    ]
    assert len(captured) == 1  # the function that predicts (the async worker, not its submit function)
    setting = json.loads(captured[0]["Properties"]["Environment"]["Variables"]["SERVESTACK_CAPTURE"])
    assert setting["mode"] == mode
    assert setting["deployment"] == deployment

    (stream,) = synth.resources(deployment, "AWS::KinesisFirehose::DeliveryStream").values()
    props = stream["Properties"]
    assert props["DeliveryStreamEncryptionConfigurationInput"] == {"KeyType": "AWS_OWNED_CMK"}
    destination = props["ExtendedS3DestinationConfiguration"]
    assert destination["Prefix"].startswith(f"capture/{deployment}/")
    assert destination["ErrorOutputPrefix"].startswith(f"capture/{deployment}-errors/")  # beside, not under it
    assert destination["FileExtension"] == ".jsonl"
    processors = [p["Type"] for p in destination["ProcessingConfiguration"]["Processors"]]
    assert processors == ["Decompression", "CloudWatchLogProcessing", "AppendDelimiterToRecord"]
    (subscription,) = synth.resources(deployment, "AWS::Logs::SubscriptionFilter").values()
    assert subscription["Properties"]["FilterPattern"] == f'{{ $.servestack.deployment = "{deployment}" }}'
    # The subscription's group is the capturing function's own.
    assert _joined(subscription["Properties"]["LogGroupName"]) in _joined(captured[0]["Properties"]["LoggingConfig"])

    statements = _policies(synth, deployment)
    firehose_puts = [s for s in statements if "firehose:PutRecord" in _joined(s["Action"])]
    assert len(firehose_puts) == 1
    assert "*" not in _joined(firehose_puts[0]["Resource"]).replace("/*", "")
    # Firehose's role alone writes there, and only there (the functions write nowhere under capture/).
    s3_writes = [s for s in statements if "s3:PutObject" in _joined(s["Action"]) and "/capture/" in _joined(s)]
    assert len(s3_writes) == 1
    written = _joined(s3_writes[0]["Resource"])
    assert f'/capture/{deployment}/*"' in written
    assert f'/capture/{deployment}-errors/*"' in written


def _spec(deployment: dict[str, Any]) -> Any:
    return parse_spec({"models": [{"name": "digits", "version": 1}], "deployments": {"d": deployment}})


def test_serverless_inference_refuses_capture_naming_the_aws_page() -> None:
    with pytest.raises(SpecError) as caught:
        _spec({"mode": "realtime", "model": "digits", "serverless": {}, "capture": {}})

    (problem,) = caught.value.problems
    assert problem.startswith("deployments.d.capture: a capture block is not combinable with serverless")
    assert "data capture" in problem
    assert "serverless-endpoints.html" in problem


@pytest.mark.parametrize(
    ("capture", "where"),
    [
        ({"sample_percent": 101}, "capture.sample_percent: 101 is not in 0..100"),
        ({"what": "everything"}, "capture.what: 'everything' is not one of"),
        ({"prefix": "/abs"}, "capture.prefix"),
        ({"exclude_columns": ["a", "a"]}, "capture.exclude_columns: 'a' is not listed once"),
    ],
)
def test_bad_capture_keys_are_named(capture: dict[str, Any], where: str) -> None:
    with pytest.raises(SpecError) as caught:
        _spec({"mode": "serverless", "model": "digits", "capture": capture})

    assert any(where in p for p in caught.value.problems), caught.value.problems
