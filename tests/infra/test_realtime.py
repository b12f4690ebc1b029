"""Realtime (SageMaker) endpoints: GPU instances, blue/green, rollback alarms, autoscaling, options."""

from __future__ import annotations

import json
import re

import pytest
from aws_cdk.assertions import Capture, Match

from tests.infra.conftest import Synth


def endpoint_config(synth: Synth, deployment: str) -> dict:
    (config,) = synth.resources(deployment, "AWS::SageMaker::EndpointConfig").values()
    return config["Properties"]


def test_endpoint_runs_on_the_gpu_instance_type_from_the_spec(synth: Synth) -> None:
    t = synth.template("digits-realtime")

    t.has_resource_properties(
        "AWS::SageMaker::EndpointConfig",
        {
            "ProductionVariants": [
                Match.object_like({"VariantName": "primary", "InstanceType": "ml.g5.xlarge", "InitialInstanceCount": 1})
            ]
        },
    )
    t.has_resource_properties(
        "AWS::SageMaker::Model",
        {
            "EnableNetworkIsolation": True,
            "PrimaryContainer": Match.object_like(
                {
                    "Mode": "SingleModel",
                    "ModelDataUrl": Match.any_value(),
                    "Environment": Match.object_like(
                        {
                            "SERVESTACK_MODEL_DIR": "/opt/ml/model",
                            "SERVESTACK_DEFAULT_MODEL": "digits",
                            "SERVESTACK_MAX_BATCH_SIZE": "64",
                            "SERVESTACK_MAX_DELAY_MS": "0",
                        }
                    ),
                }
            ),
        },
    )


def test_canary_strategy_shifts_the_spec_percent_and_rolls_back_on_its_alarms(synth: Synth) -> None:
    t = synth.template("digits-realtime")
    alarm_refs = Capture()

    t.has_resource_properties(
        "AWS::SageMaker::Endpoint",
        {
            "EndpointName": "servestack-digits-realtime",
            "DeploymentConfig": {
                "BlueGreenUpdatePolicy": {
                    "TrafficRoutingConfiguration": {
                        "Type": "CANARY",
                        "CanarySize": {"Type": "CAPACITY_PERCENT", "Value": 10},
                        "WaitIntervalInSeconds": 600,
                    },
                    "TerminationWaitInSeconds": 900,
                    "MaximumExecutionTimeoutInSeconds": 1800 + 600 + 900,
                },
                "AutoRollbackConfiguration": {"Alarms": alarm_refs},
            },
        },
    )

    alarms = synth.resources("digits-realtime", "AWS::CloudWatch::Alarm")
    names = {alarms[a["AlarmName"]["Ref"]]["Properties"]["AlarmName"] for a in alarm_refs.as_array()}
    assert names == {
        "servestack-digits-realtime-primary-5xx-rate",
        "servestack-digits-realtime-primary-p99-latency",
    }


def test_rollback_alarms_watch_the_endpoints_5xx_rate_and_p99_latency(synth: Synth) -> None:
    t = synth.template("digits-realtime")
    dims = [
        {"Name": "EndpointName", "Value": "servestack-digits-realtime"},
        {"Name": "VariantName", "Value": "primary"},
    ]

    t.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "AlarmName": "servestack-digits-realtime-primary-p99-latency",
            "MetricName": "ModelLatency",
            "Namespace": "AWS/SageMaker",
            "ExtendedStatistic": "p99",
            "Dimensions": Match.array_with(dims),
            "Threshold": 50_000,  # 50 ms in microseconds
        },
    )
    t.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "AlarmName": "servestack-digits-realtime-primary-5xx-rate",
            "Threshold": 1,
            "Metrics": Match.array_with(
                [
                    Match.object_like({"Expression": "IF(total > 0, 100 * errors / total, 0)"}),
                    Match.object_like(
                        {
                            "MetricStat": Match.object_like(
                                {"Metric": Match.object_like({"MetricName": "Invocation5XXErrors"})}
                            )
                        }
                    ),
                ]
            ),
        },
    )


def test_linear_strategy_and_ab_variants_by_weight(synth: Synth) -> None:
    t = synth.template("digits-ab")

    t.has_resource_properties(
        "AWS::SageMaker::Endpoint",
        {
            "DeploymentConfig": Match.object_like(
                {
                    "BlueGreenUpdatePolicy": Match.object_like(
                        {
                            "TrafficRoutingConfiguration": {
                                "Type": "LINEAR",
                                "LinearStepSize": {"Type": "CAPACITY_PERCENT", "Value": 25},
                                "WaitIntervalInSeconds": 180,
                            },
                            "TerminationWaitInSeconds": 300,
                        }
                    )
                }
            )
        },
    )
    variants = endpoint_config(synth, "digits-ab")["ProductionVariants"]
    assert [(v["VariantName"], v["InitialVariantWeight"], v["InstanceType"]) for v in variants] == [
        ("current", 9, "ml.g5.xlarge"),
        ("candidate", 1, "ml.g4dn.xlarge"),
    ]
    rollback = synth.resources("digits-ab", "AWS::SageMaker::Endpoint")
    (endpoint,) = rollback.values()
    assert len(endpoint["Properties"]["DeploymentConfig"]["AutoRollbackConfiguration"]["Alarms"]) == 4


def test_all_at_once_strategy_and_shadow_variant(synth: Synth) -> None:
    t = synth.template("digits-shadow")

    t.has_resource_properties(
        "AWS::SageMaker::Endpoint",
        {
            "DeploymentConfig": Match.object_like(
                {
                    "BlueGreenUpdatePolicy": Match.object_like(
                        {"TrafficRoutingConfiguration": {"Type": "ALL_AT_ONCE", "WaitIntervalInSeconds": 0}}
                    )
                }
            )
        },
    )
    config = endpoint_config(synth, "digits-shadow")
    (shadow,) = config["ShadowProductionVariants"]
    assert shadow["VariantName"] == "shadow"
    assert shadow["InitialVariantWeight"] == 0.2  # 20 % of the production variant's weight


def test_autoscaling_tracks_invocations_per_instance_within_min_max(synth: Synth) -> None:
    t = synth.template("digits-realtime")
    target = Capture()

    t.has_resource_properties(
        "AWS::ApplicationAutoScaling::ScalableTarget",
        {
            "ServiceNamespace": "sagemaker",
            "ResourceId": "endpoint/servestack-digits-realtime/variant/primary",
            "ScalableDimension": "sagemaker:variant:DesiredInstanceCount",
            "MinCapacity": 1,
            "MaxCapacity": 4,
            "RoleARN": Match.any_value(),
        },
    )
    t.has_resource_properties(
        "AWS::ApplicationAutoScaling::ScalingPolicy",
        {
            "PolicyType": "TargetTrackingScaling",
            "TargetTrackingScalingPolicyConfiguration": Match.object_like(
                {
                    "PredefinedMetricSpecification": {"PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"},
                    "TargetValue": target,
                }
            ),
        },
    )
    assert target.as_number() == 3000


def test_execution_role_reads_only_its_own_model_data(synth: Synth) -> None:
    policies = synth.resources("digits-realtime", "AWS::IAM::Policy")
    statements = [s for p in policies.values() for s in p["Properties"]["PolicyDocument"]["Statement"]]

    s3_statements = [s for s in statements if any(a.startswith("s3:") for a in _list(s["Action"]))]
    assert s3_statements
    for s in s3_statements:
        assert _list(s["Action"]) == ["s3:GetObject"]
        for resource in _list(s["Resource"]):
            key = resource["Fn::Join"][1][-1]
            assert re.fullmatch(r"/[0-9a-f]{64}\.gz", key)  # the model.tar.gz asset object, no wildcard
    wildcard = [s for s in statements if s["Resource"] == "*"]
    assert {a for s in wildcard for a in _list(s["Action"])} <= {
        "ecr:GetAuthorizationToken",
        "cloudwatch:PutMetricData",
    }


def test_multi_model_mode_is_sagemakers_on_the_registry_prefix(synth: Synth) -> None:
    t = synth.template("digits-mme")

    (model,) = synth.resources("digits-mme", "AWS::SageMaker::Model").values()
    container = model["Properties"]["PrimaryContainer"]
    # SageMaker's own multi-model mode: TargetModel is a key below ModelDataUrl, the registry's prefix
    assert container["Mode"] == "MultiModel"
    prefix = container["ModelDataUrl"]["Fn::Join"][1]
    assert prefix[0] == "s3://"
    assert prefix[-1] == "/models/"
    assert container["Environment"]["SERVESTACK_MULTI_MODEL"] == "true"
    assert "SERVESTACK_REGISTRY_URI" not in container["Environment"]
    # SageMaker fetches the archives with the execution role; the container itself needs no network
    assert model["Properties"]["EnableNetworkIsolation"] is True
    assert image_dockerfile(synth, "digits-mme", container["Image"]) == "cpu.Dockerfile"
    t.has_resource_properties(
        "AWS::IAM::Policy",
        {
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [
                        Match.object_like(
                            {
                                "Action": "s3:GetObject",
                                "Resource": {
                                    "Fn::Join": [
                                        "",
                                        [Match.any_value(), "/models/*"],
                                    ]
                                },
                            }
                        )
                    ]
                )
            }
        },
    )
    statements = [
        s
        for p in synth.resources("digits-mme", "AWS::IAM::Policy").values()
        for s in p["Properties"]["PolicyDocument"]["Statement"]
    ]
    assert not [s for s in statements if "s3:ListBucket" in _list(s["Action"])]


def image_dockerfile(synth: Synth, deployment: str, image: dict) -> str:
    """The Dockerfile an image URI in a template is built from (the stack's asset manifest says)."""
    tag = image["Fn::Sub"].rsplit(":", 1)[-1]
    assets = json.loads((synth.outdir / f"servestack-{deployment}.assets.json").read_text(encoding="utf-8"))
    return str(assets["dockerImages"][tag]["source"]["dockerFile"])


def model_images(synth: Synth, deployment: str) -> dict[str, str]:
    """Variant name -> the Dockerfile its SageMaker model runs."""
    models = synth.resources(deployment, "AWS::SageMaker::Model")
    (config,) = synth.resources(deployment, "AWS::SageMaker::EndpointConfig").values()
    variants = config["Properties"]["ProductionVariants"] + config["Properties"].get("ShadowProductionVariants", [])
    return {
        v["VariantName"]: image_dockerfile(
            synth, deployment, models[v["ModelName"]["Fn::GetAtt"][0]]["Properties"]["PrimaryContainer"]["Image"]
        )
        for v in variants
    }


@pytest.mark.parametrize(
    ("deployment", "expected"),
    [
        ("digits-realtime", {"primary": "gpu.Dockerfile"}),  # ml.g5.xlarge
        ("digits-mme", {"primary": "cpu.Dockerfile"}),  # ml.c6i.xlarge
        ("digits-sls", {"primary": "cpu.Dockerfile"}),  # Serverless Inference: CPU only
        (
            "digits-mixed",
            {"cpu": "cpu.Dockerfile", "gpu": "gpu.Dockerfile"},
        ),  # m5 / g6
        ("cancer-gpu-async", {"AllTraffic": "gpu.Dockerfile"}),  # ml.g5.xlarge
        ("cancer-cpu-async", {"AllTraffic": "cpu.Dockerfile"}),  # ml.m5.xlarge
    ],
)
def test_each_variant_runs_the_image_of_its_instance_family(
    synth: Synth, deployment: str, expected: dict[str, str]
) -> None:
    assert model_images(synth, deployment) == expected


def test_serverless_variant_option_uses_serverless_config_and_no_instances(synth: Synth) -> None:
    (variant,) = endpoint_config(synth, "digits-sls")["ProductionVariants"]

    assert variant["ServerlessConfig"] == {"MemorySizeInMB": 3072, "MaxConcurrency": 5}
    assert "InstanceType" not in variant
    assert "InferenceAmiVersion" not in variant
    assert synth.resources("digits-sls", "AWS::ApplicationAutoScaling::ScalableTarget") == {}
    # Serverless Inference excludes network isolation: its model must not ask for it (instance variants do)
    (model,) = synth.resources("digits-sls", "AWS::SageMaker::Model").values()
    assert model["Properties"]["EnableNetworkIsolation"] is False


@pytest.mark.parametrize(
    ("deployment", "construct"),
    [("digits-realtime", "Realtime"), ("gpu-components", "Components"), ("cancer-gpu-async", "Async")],
)
def test_gpu_variants_run_on_an_ami_whose_driver_runs_the_cuda_13_image(
    synth: Synth, deployment: str, construct: str
) -> None:
    # GIVEN a deployment on a GPU instance type (the CUDA 13 image) / THEN its variant names the AMI with
    # NVIDIA driver 580, CUDA 13's floor: the default host's driver and the other AMIs' are older
    synth.template(deployment).has_resource_properties(
        "AWS::SageMaker::EndpointConfig",
        {
            "ProductionVariants": [
                Match.object_like(
                    {
                        "InstanceType": Match.string_like_regexp(r"^ml\.[gp]"),
                        "InferenceAmiVersion": "al2023-ami-sagemaker-inference-gpu-4-1",
                    }
                )
            ]
        },
    )


def test_every_gpu_variant_of_every_deployment_names_a_host_ami_whose_driver_runs_cuda_13(synth: Synth) -> None:
    from servestack.gpu_families import IMAGE_MIN_DRIVER, INFERENCE_AMI_DRIVERS

    # GIVEN every endpoint config the session synthesized, production and shadow variants alike
    gpu_variants = [
        variant
        for template in synth.templates.values()
        for resource in template["Resources"].values()
        if resource["Type"] == "AWS::SageMaker::EndpointConfig"
        for key in ("ProductionVariants", "ShadowProductionVariants")
        for variant in resource["Properties"].get(key, [])
        if str(variant.get("InstanceType", "")).startswith(("ml.g", "ml.p"))
    ]
    # THEN each GPU variant names a host AMI with an NVIDIA driver >= 580: none is left on the default host
    assert len(gpu_variants) >= 5
    for variant in gpu_variants:
        assert INFERENCE_AMI_DRIVERS[variant["InferenceAmiVersion"]] >= IMAGE_MIN_DRIVER, variant["VariantName"]


def test_only_gpu_variants_name_an_inference_ami(synth: Synth) -> None:
    # GIVEN an endpoint with a CPU variant and a GPU variant / THEN only the GPU one names the GPU AMI
    variants = {v["VariantName"]: v for v in endpoint_config(synth, "digits-mixed")["ProductionVariants"]}
    assert "InferenceAmiVersion" not in variants["cpu"]
    assert variants["gpu"]["InferenceAmiVersion"] == "al2023-ami-sagemaker-inference-gpu-4-1"


def _list(x: object) -> list:
    return x if isinstance(x, list) else [x]


def test_overload_metrics_are_on_the_dashboard_and_sustained_429s_alarm(synth: Synth) -> None:
    t = synth.template("digits-realtime")
    # THEN the container is told to write its EMF metrics with its endpoint and variant
    t.has_resource_properties(
        "AWS::SageMaker::Model",
        {
            "PrimaryContainer": Match.object_like(
                {
                    "Environment": Match.object_like(
                        {
                            "SERVESTACK_METRICS_INTERVAL_SEC": "10",
                            "SERVESTACK_ENDPOINT_NAME": "servestack-digits-realtime",
                            "SERVESTACK_VARIANT_NAME": "primary",
                        }
                    )
                }
            )
        },
    )
    # AND the dashboard graphs queue depth, admitted requests and 429s from the `servestack` namespace
    (dashboard,) = synth.resources("digits-realtime", "AWS::CloudWatch::Dashboard").values()
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    for metric in ("QueueDepth", "InFlight", "Rejected"):
        assert f'\\"servestack\\",\\"{metric}\\",\\"EndpointName\\",\\"servestack-digits-realtime\\"' in body, metric
    # AND an alarm fires when every period of its window had 429s, on the same metric and dimensions
    t.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "AlarmName": "servestack-digits-realtime-primary-429s",
            "Namespace": "servestack",
            "MetricName": "Rejected",
            "Statistic": "Sum",
            "Dimensions": Match.array_with(
                [
                    {"Name": "EndpointName", "Value": "servestack-digits-realtime"},
                    {"Name": "VariantName", "Value": "primary"},
                ]
            ),
            "Threshold": 0,
            "ComparisonOperator": "GreaterThanThreshold",
            "EvaluationPeriods": 3,
            "DatapointsToAlarm": 3,
            "TreatMissingData": "notBreaching",
        },
    )
    # AND it is on the dashboard's alarm widget (the canary test shows it is not a rollback alarm)
    (alarm_id,) = [
        logical
        for logical, alarm in synth.resources("digits-realtime", "AWS::CloudWatch::Alarm").items()
        if alarm["Properties"].get("AlarmName") == "servestack-digits-realtime-primary-429s"
    ]
    assert alarm_id in body


@pytest.mark.parametrize("deployment", ["digits-realtime", "cancer-gpu-async", "two-models"])
def test_execution_roles_get_awss_four_log_actions_on_their_own_log_groups_only(synth: Synth, deployment: str) -> None:
    # GIVEN the SageMaker execution role of an endpoint, an async endpoint and an endpoint of inference components
    roles = {
        name
        for name, role in synth.resources(deployment, "AWS::IAM::Role").items()
        if "sagemaker.amazonaws.com" in json.dumps(role["Properties"]["AssumeRolePolicyDocument"])
    }
    statements = [
        s
        for p in synth.resources(deployment, "AWS::IAM::Policy").values()
        if {r["Ref"] for r in p["Properties"]["Roles"]} & roles
        for s in p["Properties"]["PolicyDocument"]["Statement"]
        if any(a.startswith("logs:") for a in _list(s["Action"]))
    ]
    groups = synth.resources(deployment, "AWS::Logs::LogGroup")

    def group_of(resource: dict) -> str:
        """The log group a policy resource names: its ARN (`log-group:<name>:*`) or `log-group:<name>`."""
        if "Fn::GetAtt" in resource:
            return str(resource["Fn::GetAtt"][0])
        (*prefix, name) = resource["Fn::Join"][1]
        assert prefix[-1] == ":log-group:"
        return str(name["Ref"])

    # THEN the role may do exactly the four CloudWatch Logs actions AWS lists for an execution role
    # (https://docs.aws.amazon.com/sagemaker/latest/dg/sagemaker-roles.html; servestack/cdk/shared.py
    # `grant_sagemaker_logging` says why CreateLogGroup and DescribeLogStreams too, though the stack creates the
    # group), each on both forms of each SageMaker log group's ARN, and on nothing else
    granted: dict[str, set[str]] = {}
    for s in statements:
        for resource in _list(s["Resource"]):
            granted.setdefault(group_of(resource), set()).update(_list(s["Action"]))
    sagemaker_groups = {
        name for name, g in groups.items() if str(g["Properties"].get("LogGroupName", "")).startswith("/aws/sagemaker/")
    }
    assert set(granted) == sagemaker_groups
    four = {"logs:CreateLogStream", "logs:PutLogEvents", "logs:CreateLogGroup", "logs:DescribeLogStreams"}
    assert all(actions == four for actions in granted.values())
    describe = [s for s in statements if "logs:DescribeLogStreams" in _list(s["Action"])]
    assert {("GetAtt" if "Fn::GetAtt" in r else "bare") for s in describe for r in _list(s["Resource"])} == {
        "GetAtt",
        "bare",
    }


def test_the_gpu_block_reaches_every_container_and_only_its_deployments(synth: Synth) -> None:
    # GIVEN digits-shadow with `gpu: {provider: tensorrt, fp16: true}` and digits-realtime without a gpu block
    for model in synth.resources("digits-shadow", "AWS::SageMaker::Model").values():
        environment = model["Properties"]["PrimaryContainer"]["Environment"]
        # THEN its production and shadow containers are told TensorRT with fp16
        assert environment["SERVESTACK_GPU_PROVIDER"] == "tensorrt"
        assert environment["SERVESTACK_GPU_FP16"] == "true"
    for model in synth.resources("digits-realtime", "AWS::SageMaker::Model").values():
        assert "SERVESTACK_GPU_PROVIDER" not in model["Properties"]["PrimaryContainer"]["Environment"]


def test_the_gpu_block_reaches_async_containers_and_no_transform_one(synth: Synth) -> None:
    # GIVEN cancer-gpu-async (backend: sagemaker) with `provider: tensorrt`
    (model,) = synth.resources("cancer-gpu-async", "AWS::SageMaker::Model").values()
    environment = model["Properties"]["PrimaryContainer"]["Environment"]
    # THEN its SageMaker model's container is told so
    assert (environment["SERVESTACK_GPU_PROVIDER"], environment["SERVESTACK_GPU_FP16"]) == ("tensorrt", "false")
    # AND a transform job, on a CPU type (Batch Transform takes no GPU type), is told nothing of GPUs
    (model,) = synth.resources("cancer-transform", "AWS::SageMaker::Model").values()
    assert "SERVESTACK_GPU_PROVIDER" not in model["Properties"]["PrimaryContainer"]["Environment"]
