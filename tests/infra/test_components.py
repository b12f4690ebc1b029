"""Realtime endpoints hosting inference components (`components:` in serving.yaml): the endpoint config shaped as
SageMaker requires it, one `AWS::SageMaker::InferenceComponent` per model with its share and copies, the image of
the instance family, per-component autoscaling (to zero too), rollback alarms, and what local mode reads."""

from __future__ import annotations

from typing import Any

from aws_cdk.assertions import Match

from servestack.local.cloudformation.templates import LocalValues, Resolver, StackTemplate
from servestack.local.stack.topology import read_stack
from tests.infra.conftest import Synth
from tests.infra.test_realtime import image_dockerfile


def components(synth: Synth, deployment: str) -> dict[str, dict[str, Any]]:
    found = synth.resources(deployment, "AWS::SageMaker::InferenceComponent").values()
    return {c["Properties"]["InferenceComponentName"]: c["Properties"] for c in found}


def test_the_endpoint_config_is_instance_based_with_no_model_and_an_execution_role(synth: Synth) -> None:
    (config,) = synth.resources("two-models", "AWS::SageMaker::EndpointConfig").values()
    (variant,) = config["Properties"]["ProductionVariants"]

    # THEN SageMaker's shape for components: the role on the config, no ModelName on the instance-based variant
    role_id, attribute = config["Properties"]["ExecutionRoleArn"]["Fn::GetAtt"]
    role = synth.templates["servestack-two-models"]["Resources"][role_id]
    assert (role["Type"], attribute) == ("AWS::IAM::Role", "Arn")
    assert role["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] == {
        "Service": "sagemaker.amazonaws.com"
    }
    assert "ModelName" not in variant
    assert "ServerlessConfig" not in variant
    assert variant["InstanceType"] == "ml.c6i.xlarge"
    assert variant["InitialInstanceCount"] == 1
    assert variant["ManagedInstanceScaling"] == {"Status": "ENABLED", "MinInstanceCount": 1, "MaxInstanceCount": 3}
    (endpoint,) = synth.resources("two-models", "AWS::SageMaker::Endpoint").values()
    assert endpoint["Properties"]["EndpointName"] == "servestack-two-models"
    assert "DeploymentConfig" not in endpoint["Properties"]  # components roll out on their own


def test_each_component_has_its_model_share_and_copies(synth: Synth) -> None:
    found = components(synth, "two-models")

    assert set(found) == {"servestack-two-models-digits", "servestack-two-models-cancer"}
    digits, cancer = found["servestack-two-models-digits"], found["servestack-two-models-cancer"]
    assert digits["Specification"]["ComputeResourceRequirements"] == {
        "NumberOfCpuCoresRequired": 1,
        "MinMemoryRequiredInMb": 1024,
    }
    assert cancer["Specification"]["ComputeResourceRequirements"] == {
        "NumberOfCpuCoresRequired": 0.5,
        "MinMemoryRequiredInMb": 512,
    }
    assert digits["RuntimeConfig"] == {"CopyCount": 2}
    assert cancer["RuntimeConfig"] == {"CopyCount": 1}  # SageMaker creates a component with >= 1 copy
    for props in found.values():
        assert props["VariantName"] == "primary"
        assert props["EndpointName"]["Fn::GetAtt"][1] == "EndpointName"
    # AND each names its own SageMaker model, whose container serves that model from its own data
    models = synth.resources("two-models", "AWS::SageMaker::Model")
    served = {
        name: models[props["Specification"]["ModelName"]["Fn::GetAtt"][0]]["Properties"]["PrimaryContainer"]
        for name, props in found.items()
    }
    assert served["servestack-two-models-digits"]["Environment"]["SERVESTACK_DEFAULT_MODEL"] == "digits"
    assert served["servestack-two-models-cancer"]["Environment"]["SERVESTACK_DEFAULT_MODEL"] == "breast-cancer"
    urls = {container["ModelDataUrl"]["Fn::Sub"] for container in served.values()}
    assert len(urls) == 2


def test_the_image_follows_the_instance_family_and_accelerators_are_reserved_on_gpus(synth: Synth) -> None:
    def images(deployment: str) -> set[str]:
        models = synth.resources(deployment, "AWS::SageMaker::Model").values()
        return {image_dockerfile(synth, deployment, m["Properties"]["PrimaryContainer"]["Image"]) for m in models}

    assert images("two-models") == {"cpu.Dockerfile"}
    assert images("gpu-components") == {"gpu.Dockerfile"}
    (gpu,) = components(synth, "gpu-components").values()
    assert gpu["Specification"]["ComputeResourceRequirements"] == {
        "NumberOfAcceleratorDevicesRequired": 1,
        "NumberOfCpuCoresRequired": 2,
        "MinMemoryRequiredInMb": 2048,
    }


def test_each_component_scales_its_copies_and_one_scales_out_from_zero(synth: Synth) -> None:
    t = synth.template("two-models")
    targets = {
        r["Properties"]["ResourceId"]: r["Properties"]
        for r in synth.resources("two-models", "AWS::ApplicationAutoScaling::ScalableTarget").values()
    }

    assert set(targets) == {
        "inference-component/servestack-two-models-digits",
        "inference-component/servestack-two-models-cancer",
    }
    for target in targets.values():
        assert target["ScalableDimension"] == "sagemaker:inference-component:DesiredCopyCount"
        assert target["ServiceNamespace"] == "sagemaker"
    digits = targets["inference-component/servestack-two-models-digits"]
    assert (digits["MinCapacity"], digits["MaxCapacity"]) == (1, 4)
    assert targets["inference-component/servestack-two-models-cancer"]["MinCapacity"] == 0  # scales to zero
    t.has_resource_properties(
        "AWS::ApplicationAutoScaling::ScalingPolicy",
        {
            "PolicyType": "TargetTrackingScaling",
            "TargetTrackingScalingPolicyConfiguration": Match.object_like(
                {
                    "PredefinedMetricSpecification": {
                        "PredefinedMetricType": "SageMakerInferenceComponentInvocationsPerCopy"
                    },
                    "TargetValue": 200,
                }
            ),
        },
    )
    # AND the component that may reach zero copies gets one back when a request finds none
    step = t.find_resources("AWS::ApplicationAutoScaling::ScalingPolicy", {"Properties": {"PolicyType": "StepScaling"}})
    (step_id,) = step
    assert step[step_id]["Properties"]["StepScalingPolicyConfiguration"]["StepAdjustments"] == [
        {"MetricIntervalLowerBound": 0, "ScalingAdjustment": 1}
    ]
    t.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "AlarmName": "servestack-two-models-cancer-no-capacity",
            "MetricName": "NoCapacityInvocationFailures",
            "Namespace": "AWS/SageMaker",
            "Dimensions": [{"Name": "InferenceComponentName", "Value": "servestack-two-models-cancer"}],
            "ComparisonOperator": "GreaterThanOrEqualToThreshold",
            "Threshold": 1,
            "AlarmActions": [{"Ref": step_id}],
        },
    )
    assert "servestack-two-models-digits-no-capacity" not in {
        a["Properties"]["AlarmName"] for a in synth.resources("two-models", "AWS::CloudWatch::Alarm").values()
    }


def test_a_component_update_rolls_in_batches_and_back_on_its_own_alarms(synth: Synth) -> None:
    digits = components(synth, "two-models")["servestack-two-models-digits"]
    policy = digits["DeploymentConfig"]["RollingUpdatePolicy"]

    # THEN the linear strategy's 25% step is the batch, its 2 minutes the bake between batches
    assert policy["MaximumBatchSize"] == {"Type": "CAPACITY_PERCENT", "Value": 25}
    assert policy["WaitIntervalInSeconds"] == 120
    assert 600 <= policy["MaximumExecutionTimeoutInSeconds"] <= 28_800
    alarms = synth.resources("two-models", "AWS::CloudWatch::Alarm")
    rollback = digits["DeploymentConfig"]["AutoRollbackConfiguration"]["Alarms"]
    names = {alarms[a["AlarmName"]["Ref"]]["Properties"]["AlarmName"] for a in rollback}
    assert names == {"servestack-two-models-digits-5xx-rate", "servestack-two-models-digits-p99-latency"}
    by_name = {a["Properties"]["AlarmName"]: a for a in alarms.values()}
    latency = by_name["servestack-two-models-digits-p99-latency"]
    assert latency["Properties"]["Dimensions"] == [
        {"Name": "InferenceComponentName", "Value": "servestack-two-models-digits"}
    ]


def test_the_execution_role_reads_only_the_components_model_data(synth: Synth) -> None:
    policies = synth.resources("two-models", "AWS::IAM::Policy").values()
    statements = [s for p in policies for s in p["Properties"]["PolicyDocument"]["Statement"]]
    (read,) = [s for s in statements if s["Action"] == "s3:GetObject"]

    objects = read["Resource"]
    assert len(objects) == 2  # one model.tar.gz per component, each by its key
    assert all(str(o["Fn::Join"][1][-1]).endswith(".gz") for o in objects)


def test_local_mode_reads_the_components_of_the_endpoint(synth: Synth) -> None:
    stack = "servestack-two-models"
    template = StackTemplate.load(synth.outdir / f"{stack}.template.json", stack)
    read = read_stack(template, Resolver(template, LocalValues(emulator_url="http://emu:5000")))

    (endpoint,) = read.endpoints.values()
    assert [(v.name, v.model_name) for v in endpoint.variants] == [("primary", None)]
    assert endpoint.execution_role is not None
    got = {
        c.name: (c.variant, c.copies, c.container.environment["SERVESTACK_DEFAULT_MODEL"]) for c in endpoint.components
    }
    assert got == {
        "servestack-two-models-digits": ("primary", 2, "digits"),
        "servestack-two-models-cancer": ("primary", 1, "breast-cancer"),
    }
    assert all(c.arn.endswith(f":inference-component/{c.name}") for c in endpoint.components)
    assert {r.type for r in read.report if r.emulated} >= {"AWS::SageMaker::InferenceComponent"}


def test_the_smoke_test_calls_the_component_serving_the_deployments_model(synth: Synth) -> None:
    outputs = synth.templates["servestack-two-models"]["Outputs"]

    assert outputs["SmokeKind"]["Value"] == "sagemaker-component"
    assert outputs["SmokeTarget"]["Value"] == "servestack-two-models/servestack-two-models-digits"
