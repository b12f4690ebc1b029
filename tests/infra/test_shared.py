"""What every deployment stack shares: one template each, the artifact bucket, log retention, dashboards."""

from __future__ import annotations

import json

from aws_cdk.assertions import Match

from tests.infra.conftest import Synth


def test_one_template_per_deployment(synth: Synth) -> None:
    assert set(synth.templates) == {f"servestack-{name}" for name in synth.deployments}


def test_artifact_bucket_is_encrypted_versioned_private_and_tls_only(synth: Synth) -> None:
    for deployment in synth.deployments:
        t = synth.template(deployment)
        t.has_resource_properties(
            "AWS::S3::Bucket",
            {
                "BucketEncryption": {
                    "ServerSideEncryptionConfiguration": [{"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]
                },
                "VersioningConfiguration": {"Status": "Enabled"},
                "PublicAccessBlockConfiguration": {
                    "BlockPublicAcls": True,
                    "BlockPublicPolicy": True,
                    "IgnorePublicAcls": True,
                    "RestrictPublicBuckets": True,
                },
                "LoggingConfiguration": Match.object_like({"DestinationBucketName": {"Ref": Match.any_value()}}),
            },
        )
        buckets = synth.resources(deployment, "AWS::S3::Bucket")
        policies = synth.resources(deployment, "AWS::S3::BucketPolicy")
        tls_only = {
            p["Properties"]["Bucket"]["Ref"]
            for p in policies.values()
            for s in p["Properties"]["PolicyDocument"]["Statement"]
            if s["Effect"] == "Deny" and s.get("Condition") == {"Bool": {"aws:SecureTransport": "false"}}
        }
        assert tls_only == set(buckets), deployment


def test_every_log_group_has_the_spec_retention(synth: Synth) -> None:
    for deployment in synth.deployments:
        groups = synth.resources(deployment, "AWS::Logs::LogGroup")
        assert groups, deployment
        assert {g["Properties"]["RetentionInDays"] for g in groups.values()} == {30}, deployment


def test_lambda_functions_log_to_their_own_retained_log_group(synth: Synth) -> None:
    for deployment, mode in synth.deployments.items():
        for logical_id, fn in synth.resources(deployment, "AWS::Lambda::Function").items():
            if logical_id.startswith("BucketNotificationsHandler"):
                continue  # CDK's own custom-resource function (bucket notifications): not configurable
            group = fn["Properties"]["LoggingConfig"]["LogGroup"]["Ref"]
            assert group in synth.resources(deployment, "AWS::Logs::LogGroup"), (deployment, mode)


def test_each_deployment_has_a_dashboard_with_latency_percentiles_and_errors(synth: Synth) -> None:
    for deployment, mode in synth.deployments.items():
        (dashboard,) = synth.resources(deployment, "AWS::CloudWatch::Dashboard").values()
        assert dashboard["Properties"]["DashboardName"] == f"servestack-{deployment}"
        body = json.dumps(dashboard["Properties"]["DashboardBody"])
        if mode in {"realtime", "serverless", "async"}:
            for needle in ("p50", "p90", "p99"):
                assert needle in body, (deployment, needle)
        assert "Guardrails" in body, deployment  # alarm status widget
    realtime = json.dumps(synth.resources("digits-realtime", "AWS::CloudWatch::Dashboard"))
    assert "GPUUtilization" in realtime
    assert "Invocation5XXErrors" in realtime
    queue = json.dumps(synth.resources("cancer-async", "AWS::CloudWatch::Dashboard"))
    assert "ApproximateAgeOfOldestMessage" in queue
    api = json.dumps(synth.resources("digits-api", "AWS::CloudWatch::Dashboard"))
    assert "ProvisionedConcurrencyUtilization" in api
    assert "Throttles" in api


def test_stacks_export_what_the_pipeline_smoke_test_reads(synth: Synth) -> None:
    for deployment in ("digits-realtime", "digits-api", "cancer-async", "cancer-nightly"):
        outputs = synth.templates[f"servestack-{deployment}"]["Outputs"]
        assert {"SmokeKind", "SmokeTarget", "Bucket"} <= set(outputs), deployment
