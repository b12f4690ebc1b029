"""Realtime mode with inference components: several models on one SageMaker endpoint, each with its own share of
every instance (CPU cores, accelerators, memory), its own copies, its own autoscaling (to zero too), and its own
rolling updates. Callers name the component: `invoke_endpoint(EndpointName=..., InferenceComponentName=...)`.

What SageMaker requires of such an endpoint, and this construct does:
- the endpoint config's production variant is instance-based and names no model (a variant with a `ModelName`
  refuses components: "Inference Components are not supported in this Endpoint", public report:
  pulumi/pulumi-aws issue #4940); the config carries the `ExecutionRoleArn` instead (CreateEndpointConfig
  refuses a component endpoint without one: stdapi-ai/stdapi.ai issue #43). Serverless variants take no
  components (servestack/spec/realtime.py refuses the combination);
- each component names a SageMaker Model (its container: image, model data, environment), its compute
  requirements (`Specification.ComputeResourceRequirements`) and its copy count (`RuntimeConfig.CopyCount`, at
  least 1 at creation: "Inference components copy count an integer larger than 0", same issue #43);
- the variant's instances scale with the copies placed on them (`ManagedInstanceScaling`);
- each component's copies scale on `inference-component/<name>` (`sagemaker:inference-component:DesiredCopyCount`)
  by target tracking on invocations per copy. With `min_copies: 0`, target tracking cannot leave zero (it divides
  by the copies), so a step policy adds a copy when `NoCapacityInvocationFailures` (what SageMaker counts when a
  request finds no copy) is at least 1 in a minute (SageMaker developer guide, "Scale an endpoint to zero
  instances").

The image follows the instance family, as for variants: the GPU image (servestack/cdk/containers/gpu.Dockerfile) on
ml.g*/ml.p* instances, the CPU image elsewhere. Each component's container reads its own `model.tar.gz` from
/opt/ml/model.
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Duration
from aws_cdk import aws_applicationautoscaling as appscaling
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import aws_sagemaker as sagemaker
from constructs import Construct

import servestack.cdk.guardrails as guardrails
from servestack.aws_rules import SAGEMAKER_REALTIME
from servestack.cdk.realtime import (
    CONTAINER_MODEL_DIR,
    METRICS_INTERVAL_SEC,
    engine_environment,
    gpu_inference_ami,
    sagemaker_scaling_role,
    servestack_model,
)
from servestack.cdk.shared import acknowledge, check_range, endpoint_log_group, grant_sagemaker_logging, log_group
from servestack.spec import AlarmSettings, Batching, Component, GpuSettings, Strategy

VARIANT_NAME = "primary"
# SageMaker names: 63 characters, letters, digits and '-' (CreateInferenceComponent's InferenceComponentName).
MAX_NAME_LENGTH = 63
_RESOURCE_STAR_REASON = (
    "ecr:GetAuthorizationToken has no resource-level permissions (AWS requires Resource '*'); image pulls "
    "themselves are scoped to the asset repository. cloudwatch:PutMetricData has no resource-level permissions; "
    "it is limited by a condition to the /aws/sagemaker/Endpoints namespace."
)


def construct_id(name: str) -> str:
    return "".join(part.title() for part in name.split("-"))


class ComponentEndpoint(Construct):
    """A SageMaker endpoint hosting `components`, one inference component each (named `<endpoint_name>-<name>`).

    `model_data` maps each component's model key (`name@version`) to its uploaded `model.tar.gz` asset.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        endpoint_name: str,
        model_data: dict[str, s3_assets.Asset],
        components: Sequence[Component],
        image: ecr_assets.DockerImageAsset,
        instance_type: str = "ml.g5.xlarge",
        min_instances: int = 1,
        max_instances: int = 2,
        max_payload_bytes: int = 6_291_456,
        log_retention_days: int = 30,
        strategy: Strategy | None = None,
        alarms: AlarmSettings | None = None,
        batching: Batching | None = None,
        gpu: GpuSettings | None = None,
    ) -> None:
        super().__init__(scope, id)
        check_range("ComponentEndpoint", "len(components)", len(components), 1, 100)
        check_range("ComponentEndpoint", "min_instances", min_instances, 1, 100)
        check_range("ComponentEndpoint", "max_instances", max_instances, min_instances, 100)
        check_range("ComponentEndpoint", "len(endpoint_name)", len(endpoint_name), 1, MAX_NAME_LENGTH)
        strategy = strategy or Strategy()
        alarms = alarms or AlarmSettings()
        batching = batching or Batching()
        self.endpoint_name = endpoint_name
        self.variant_name = VARIANT_NAME
        self.component_names: dict[str, str] = {}  # the spec's component name -> the SageMaker name
        for c in components:
            full = f"{endpoint_name}-{c.component_name}"
            if len(full) > MAX_NAME_LENGTH:
                raise ValueError(
                    f"ComponentEndpoint {endpoint_name}: component name {full!r} ({len(full)} characters) is not "
                    f"<= {MAX_NAME_LENGTH} characters (SageMaker's limit); shorten the component's `name`"
                )
            if f"{c.model}@{c.version}" not in model_data:
                raise ValueError(
                    f"ComponentEndpoint {endpoint_name}: component {c.component_name} serves {c.model}@{c.version}, "
                    f"which is not one of model_data's keys ({', '.join(model_data)})"
                )
            self.component_names[c.component_name] = full

        self.logs = endpoint_log_group(self, "Logs", endpoint_name=endpoint_name, retention_days=log_retention_days)
        self.role = iam.Role(
            self,
            "ExecutionRole",
            assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"),
            description=f"SageMaker endpoint {endpoint_name} and its inference components: pull the image, read "
            "the models, write logs",
        )
        image.repository.grant_pull(self.role)
        grant_sagemaker_logging(self.role, self.logs)
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["cloudwatch:PutMetricData"],
                resources=["*"],
                conditions={"StringLike": {"cloudwatch:namespace": "/aws/sagemaker/Endpoints*"}},
            )
        )
        for c in components:
            asset = model_data[f"{c.model}@{c.version}"]
            self.role.add_to_policy(
                iam.PolicyStatement(
                    actions=["s3:GetObject"], resources=[asset.bucket.arn_for_objects(asset.s3_object_key)]
                )
            )

        self.endpoint_config = sagemaker.CfnEndpointConfig(
            self,
            "EndpointConfig",
            execution_role_arn=self.role.role_arn,
            production_variants=[
                sagemaker.CfnEndpointConfig.ProductionVariantProperty(
                    variant_name=VARIANT_NAME,
                    instance_type=instance_type,
                    initial_instance_count=min_instances,
                    inference_ami_version=gpu_inference_ami(instance_type),
                    managed_instance_scaling=sagemaker.CfnEndpointConfig.ManagedInstanceScalingProperty(
                        status="ENABLED", min_instance_count=min_instances, max_instance_count=max_instances
                    ),
                    routing_config=sagemaker.CfnEndpointConfig.RoutingConfigProperty(
                        routing_strategy="LEAST_OUTSTANDING_REQUESTS"
                    ),
                )
            ],
        )
        self.endpoint_config.node.add_dependency(self.role)
        self.endpoint = sagemaker.CfnEndpoint(
            self,
            "Endpoint",
            endpoint_name=endpoint_name,
            endpoint_config_name=self.endpoint_config.attr_endpoint_config_name,
        )

        self.models: dict[str, sagemaker.CfnModel] = {}
        self.components: dict[str, sagemaker.CfnInferenceComponent] = {}
        self.alarms: list[cw.Alarm] = []
        self.overload_alarms: list[cw.Alarm] = []
        self.scaling: list[appscaling.ScalableTarget] = []
        self.component_logs: list[logs.LogGroup] = []
        for c in components:
            name = self.component_names[c.component_name]
            cid = construct_id(c.component_name)
            # SageMaker writes a component's container logs to /aws/sagemaker/InferenceComponents/<name>.
            component_logs = log_group(self, f"Logs{cid}", retention_days=log_retention_days)
            cfn_logs = component_logs.node.default_child
            assert cfn_logs is not None
            cfn_logs.add_property_override("LogGroupName", f"/aws/sagemaker/InferenceComponents/{name}")  # type: ignore[attr-defined]
            grant_sagemaker_logging(self.role, component_logs)
            self.component_logs.append(component_logs)
            environment = {
                "SERVESTACK_MODEL_DIR": CONTAINER_MODEL_DIR,
                "SERVESTACK_DEFAULT_MODEL": c.model,
                "SERVESTACK_PROVIDERS": "auto",
                **engine_environment(SAGEMAKER_REALTIME, max_payload_bytes),
                "SERVESTACK_MAX_BATCH_SIZE": str(batching.max_batch_size),
                "SERVESTACK_MAX_DELAY_MS": str(batching.max_delay_ms),
                "SERVESTACK_MAX_QUEUE_REQUESTS": str(batching.max_queue),
                # serving.yaml's `gpu:` (the spec allows it on GPU instance types only)
                **(gpu.environment if gpu is not None else {}),
                "SERVESTACK_ENDPOINT_NAME": endpoint_name,
                # The containers' overload metrics (servestack/adapters/metrics.py) are per component: its name stands
                # in the VariantName dimension.
                "SERVESTACK_VARIANT_NAME": name,
                "SERVESTACK_INFERENCE_COMPONENT": name,
                "SERVESTACK_METRICS_INTERVAL_SEC": str(METRICS_INTERVAL_SEC),
            }
            model = servestack_model(
                self,
                f"Model{cid}",
                role=self.role,
                image_uri=image.image_uri,
                mode="SingleModel",
                model_data_url=model_data[f"{c.model}@{c.version}"].s3_object_url,
                environment=environment,
            )
            self.models[c.component_name] = model

            component_alarms = guardrails.sagemaker_component_alarms(self, f"{cid}", component=name, settings=alarms)
            self.alarms += component_alarms
            self.overload_alarms.append(
                guardrails.sagemaker_overload_alarm(self, endpoint_name=endpoint_name, variant=name, settings=alarms)
            )
            requirements = sagemaker.CfnInferenceComponent.InferenceComponentComputeResourceRequirementsProperty(
                number_of_cpu_cores_required=c.cpu_cores,
                number_of_accelerator_devices_required=c.accelerators or None,
                min_memory_required_in_mb=c.memory_mib,
            )
            component = sagemaker.CfnInferenceComponent(
                self,
                f"Component{cid}",
                inference_component_name=name,
                endpoint_name=self.endpoint.attr_endpoint_name,
                variant_name=VARIANT_NAME,
                specification=sagemaker.CfnInferenceComponent.InferenceComponentSpecificationProperty(
                    model_name=model.attr_model_name,
                    compute_resource_requirements=requirements,
                ),
                runtime_config=sagemaker.CfnInferenceComponent.InferenceComponentRuntimeConfigProperty(
                    copy_count=c.copies
                ),
                deployment_config=guardrails.sagemaker_component_deployment_config(strategy, component_alarms),
            )
            self.components[c.component_name] = component

            target = appscaling.ScalableTarget(
                self,
                f"Scaling{cid}",
                service_namespace=appscaling.ServiceNamespace.SAGEMAKER,
                resource_id=f"inference-component/{name}",
                scalable_dimension="sagemaker:inference-component:DesiredCopyCount",
                min_capacity=c.min_copies,
                max_capacity=c.max_copies,
                role=sagemaker_scaling_role(self, f"ScalingRole{cid}"),
            )
            target.node.add_dependency(component)
            target.scale_to_track_metric(
                "InvocationsPerCopy",
                target_value=c.target_invocations_per_copy,
                predefined_metric=appscaling.PredefinedMetric.SAGEMAKER_INFERENCE_COMPONENT_INVOCATIONS_PER_COPY,
                scale_in_cooldown=Duration.minutes(5),
                scale_out_cooldown=Duration.minutes(1),
            )
            if c.min_copies == 0:
                self._scale_out_from_zero(target, cid, name)
            self.scaling.append(target)

        acknowledge(self.role, {"AwsSolutions-IAM5[Resource::*]": _RESOURCE_STAR_REASON})

    def _scale_out_from_zero(self, target: appscaling.ScalableTarget, cid: str, name: str) -> None:
        """One copy more when a request found none: a step policy on NoCapacityInvocationFailures >= 1."""
        action = appscaling.StepScalingAction(
            self,
            f"ScaleOutFromZero{cid}",
            scaling_target=target,
            adjustment_type=appscaling.AdjustmentType.CHANGE_IN_CAPACITY,
            metric_aggregation_type=appscaling.MetricAggregationType.MAXIMUM,
            cooldown=Duration.minutes(1),
        )
        action.add_adjustment(adjustment=1, lower_bound=0)
        alarm = cw.Alarm(
            self,
            f"NoCapacity{cid}",
            alarm_name=f"{name}-no-capacity",
            alarm_description=f"{name}: a request found no copy (scaled to zero); add one",
            metric=guardrails.sagemaker_component_metric(
                name, "NoCapacityInvocationFailures", "Sum", Duration.minutes(1)
            ),
            threshold=1,
            comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            evaluation_periods=1,
            datapoints_to_alarm=1,
            treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
        )
        alarm.add_alarm_action(cw_actions.ApplicationScalingAction(action))

    def metric(self, name: str, statistic: str, component: str) -> cw.Metric:
        """An invocation metric of one component (by its spec name)."""
        return guardrails.sagemaker_component_metric(
            self.component_names[component], name, statistic, Duration.minutes(1)
        )
