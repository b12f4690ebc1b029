"""How local mode reads a template: physical names as CloudFormation forms them, intrinsic functions resolved
to local values, and the topology of each resource kind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from servestack.local.cloudformation.templates import (
    NAME_LIMITS,
    LocalValues,
    Resolver,
    StackTemplate,
    TemplateError,
    generated_name,
)
from servestack.local.stack.report import EMULATED, REPORTED
from servestack.local.stack.topology import read_stack
from tests.conftest import REPO_ROOT

LOCAL = LocalValues(region="eu-west-1", account="123456789012", emulator_url="http://emu:5000",
                    api_urls={"Api": "http://127.0.0.1:9000"})  # fmt: skip


def stack(tmp_path: Path, resources: dict[str, Any], **extra: Any) -> tuple[StackTemplate, Resolver]:
    path = tmp_path / "t.template.json"
    path.write_text(json.dumps({"Resources": resources, **extra}))
    template = StackTemplate.load(path, "servestack-demo")
    return template, Resolver(template, LOCAL)


# ------------------------------------------------------------------------------------------ names


@pytest.mark.parametrize("resource_type", sorted(NAME_LIMITS))
def test_generated_names_fit_the_service_limit_and_are_stable(resource_type: str) -> None:
    # GIVEN a long stack name and logical id WHEN a name is generated twice
    stack_name, logical = "servestack-" + "x" * 80, "VeryLongLogicalId" * 8
    first = generated_name(stack_name, logical, resource_type)
    # THEN it fits the limit, keeps CloudFormation's shape, and does not change between runs
    limit, lower = NAME_LIMITS[resource_type]
    assert len(first) <= limit
    assert first == generated_name(stack_name, logical, resource_type)
    assert first.count("-") >= 2
    assert first == first.lower() if lower else any(c.isupper() for c in first)
    # AND another logical id gives another name
    assert first != generated_name(stack_name, logical + "2", resource_type)


def test_explicit_names_win_over_generated_ones(tmp_path: Path) -> None:
    _, resolver = stack(tmp_path, {
        "Q": {"Type": "AWS::SQS::Queue", "Properties": {"QueueName": "jobs"}},
        "F": {"Type": "AWS::Lambda::Function", "Properties": {}},
    })  # fmt: skip
    assert resolver.physical_name("Q") == "jobs"
    assert resolver.physical_name("F").startswith("servestack-demo-F-")


# ------------------------------------------------------------------------------------------ intrinsics


def test_ref_and_getatt_return_what_cloudformation_documents(tmp_path: Path) -> None:
    _, r = stack(tmp_path, {
        "Q": {"Type": "AWS::SQS::Queue", "Properties": {"QueueName": "jobs"}},
        "B": {"Type": "AWS::S3::Bucket", "Properties": {"BucketName": "data"}},
        "T": {"Type": "AWS::DynamoDB::Table", "Properties": {"TableName": "t"}},
        "F": {"Type": "AWS::Lambda::Function", "Properties": {"FunctionName": "fn"}},
        "R": {"Type": "AWS::IAM::Role", "Properties": {"RoleName": "role"}},
        "Api": {"Type": "AWS::ApiGatewayV2::Api", "Properties": {"Name": "label"}},
        "E": {"Type": "AWS::SageMaker::Endpoint", "Properties": {"EndpointName": "Ep"}},
    })  # fmt: skip
    assert r.resolve({"Ref": "Q"}) == "http://emu:5000/123456789012/jobs"
    assert r.resolve({"Fn::GetAtt": ["Q", "Arn"]}) == "arn:aws:sqs:eu-west-1:123456789012:jobs"
    assert r.resolve({"Ref": "B"}) == "data"
    assert r.resolve({"Fn::GetAtt": "B.Arn"}) == "arn:aws:s3:::data"
    assert r.resolve({"Fn::GetAtt": ["T", "Arn"]}) == "arn:aws:dynamodb:eu-west-1:123456789012:table/t"
    assert r.resolve({"Fn::GetAtt": ["F", "Arn"]}) == "arn:aws:lambda:eu-west-1:123456789012:function:fn"
    assert r.resolve({"Fn::GetAtt": ["R", "Arn"]}) == "arn:aws:iam::123456789012:role/role"
    assert r.resolve({"Fn::GetAtt": ["Api", "ApiEndpoint"]}) == "http://127.0.0.1:9000"
    assert r.resolve({"Ref": "E"}) == "arn:aws:sagemaker:eu-west-1:123456789012:endpoint/ep"
    with pytest.raises(TemplateError, match=r"Fn::GetAtt Q.Nope .* not known"):
        r.resolve({"Fn::GetAtt": ["Q", "Nope"]})
    with pytest.raises(TemplateError, match="not a resource"):
        r.resolve({"Ref": "Missing"})


def test_functions_conditions_and_pseudo_parameters(tmp_path: Path) -> None:
    _, r = stack(
        tmp_path,
        {"B": {"Type": "AWS::S3::Bucket", "Properties": {"BucketName": "data"}}},
        Conditions={"Prod": {"Fn::Equals": [{"Ref": "AWS::Region"}, "eu-west-1"]}},
        Parameters={"Size": {"Type": "Number", "Default": 3}},
    )
    assert r.resolve({"Fn::Join": ["/", [{"Fn::GetAtt": ["B", "Arn"]}, "in", "*"]]}) == "arn:aws:s3:::data/in/*"
    assert (
        r.resolve({"Fn::Sub": "arn:${AWS::Partition}:s3:::${B}/x-${B.Arn}"}) == "arn:aws:s3:::data/x-arn:aws:s3:::data"
    )
    assert r.resolve({"Fn::Sub": ["${A}-${AWS::AccountId}", {"A": {"Ref": "B"}}]}) == "data-123456789012"
    assert r.resolve({"Fn::Sub": "${!Literal}"}) == "${Literal}"
    assert r.resolve({"Fn::Select": [1, {"Fn::Split": [",", "a,b,c"]}]}) == "b"
    assert r.resolve({"Fn::If": ["Prod", "big", "small"]}) == "big"
    assert r.resolve({"Fn::Not": [{"Condition": "Prod"}]}) is False
    assert r.resolve([{"Ref": "AWS::NoValue"}, {"Ref": "Size"}]) == [3]
    assert r.resolve({"Fn::Base64": "hi"}) == "aGk="
    with pytest.raises(TemplateError, match="Fn::Transform"):
        r.resolve({"Fn::Transform": {}})


# ------------------------------------------------------------------------------------------ topology


def test_the_docs_name_every_resource_type_local_mode_knows() -> None:
    page = (REPO_ROOT / "docs/local-mode.md").read_text()
    missing = [t for t in [*EMULATED, *REPORTED] if f"`{t}`" not in page]
    assert missing == []


def component_stack(
    tmp_path: Path, *, variant: dict[str, Any] | None = None, config: dict[str, Any] | None = None,
    component: dict[str, Any] | None = None,
) -> tuple[StackTemplate, Resolver]:  # fmt: skip
    """An endpoint hosting one inference component, as servestack/cdk/components.py writes it, with `overrides`."""
    role = {"Fn::GetAtt": ["Role", "Arn"]}
    resources: dict[str, Any] = {
        "Role": {"Type": "AWS::IAM::Role", "Properties": {"AssumeRolePolicyDocument": {"Statement": []}}},
        "Model": {"Type": "AWS::SageMaker::Model", "Properties": {
            "ExecutionRoleArn": role,
            "PrimaryContainer": {"Image": "img", "ModelDataUrl": "s3://b/m.tar.gz",
                                 "Environment": {"SERVESTACK_DEFAULT_MODEL": "digits"}}}},
        "Config": {"Type": "AWS::SageMaker::EndpointConfig", "Properties": {
            "ExecutionRoleArn": role,
            "ProductionVariants": [{"VariantName": "primary", "InstanceType": "ml.c6i.xlarge",
                                    "InitialInstanceCount": 1, **(variant or {})}],
            **(config or {})}},
        "Endpoint": {"Type": "AWS::SageMaker::Endpoint", "Properties": {
            "EndpointName": "two-models", "EndpointConfigName": {"Fn::GetAtt": ["Config", "EndpointConfigName"]}}},
        "Digits": {"Type": "AWS::SageMaker::InferenceComponent", "Properties": {
            "InferenceComponentName": "two-models-digits", "VariantName": "primary",
            "EndpointName": {"Fn::GetAtt": ["Endpoint", "EndpointName"]},
            "Specification": {"ModelName": {"Fn::GetAtt": ["Model", "ModelName"]},
                              "ComputeResourceRequirements": {"NumberOfCpuCoresRequired": 1,
                                                              "MinMemoryRequiredInMb": 1024}},
            "RuntimeConfig": {"CopyCount": 2}, **(component or {})}},
    }  # fmt: skip
    return stack(tmp_path, resources)


def test_an_endpoint_hosting_a_component_reads_its_component(tmp_path: Path) -> None:
    (endpoint,) = read_stack(*component_stack(tmp_path)).endpoints.values()

    (digits,) = endpoint.components
    assert (digits.name, digits.variant, digits.copies) == ("two-models-digits", "primary", 2)
    assert digits.arn == "arn:aws:sagemaker:eu-west-1:123456789012:inference-component/two-models-digits"
    assert digits.container.environment == {"SERVESTACK_DEFAULT_MODEL": "digits"}
    assert digits.compute == {"NumberOfCpuCoresRequired": 1, "MinMemoryRequiredInMb": 1024}
    assert (endpoint.execution_role, endpoint.variants[0].model_name) == ("Role", None)


@pytest.mark.parametrize(
    ("overrides", "refusal"),
    [
        (
            {"variant": {"ModelName": {"Fn::GetAtt": ["Model", "ModelName"]}}},
            "Inference Components are not supported in this Endpoint. Please make sure this endpoint can deploy "
            "inference components.",
        ),
        ({"config": {"ExecutionRoleArn": {"Ref": "AWS::NoValue"}}}, "has a variant without ModelName"),
        ({"component": {"RuntimeConfig": {"CopyCount": 0}}}, "Inference components copy count an integer larger"),
        ({"component": {"VariantName": "blue"}}, "names variant blue, not one of two-models's (primary)"),
        ({"component": {"EndpointName": "elsewhere"}}, "names an endpoint that is not in the stack"),
        ({"variant": {"ServerlessConfig": {"MemorySizeInMB": 2048, "MaxConcurrency": 1}}}, "is serverless"),
    ],
)
def test_a_template_sagemaker_would_refuse_is_refused(tmp_path: Path, overrides: dict[str, Any], refusal: str) -> None:
    # GIVEN a component endpoint with one thing SageMaker refuses to create WHEN local mode reads it
    with pytest.raises(TemplateError) as raised:
        read_stack(*component_stack(tmp_path, **overrides))
    # THEN it stops, saying why
    assert refusal in str(raised.value)
