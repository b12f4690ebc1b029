"""Realtime mode: a SageMaker endpoint running the GPU container (servestack/adapters/realtime.py via `serve`).

One SageMaker Model per production variant (A/B by weight) plus an optional shadow variant, a blue/green
`DeploymentConfig` (all at once / canary / linear from the spec, with bake time) that rolls back on the
variants' 5xx-rate and p99-latency alarms, and target-tracking autoscaling on invocations per instance.
Options: SageMaker Serverless Inference instead of instances, and multi-model mode.

Model data is a deterministic `model.tar.gz` (`<name>/<version>/...`) built at synth time and uploaded as a
file asset; the container reads it from `/opt/ml/model`.

Multi-model mode (`Mode: MultiModel`) points `ModelDataUrl` at the registry's S3 prefix (`s3://<bucket>/models/`).
A caller's `TargetModel` is the key of a package archive below it, `<name>/<version>.tar.gz`, which
`servestack models push` writes next to the package's files (servestack/inference/registry.py). SageMaker downloads and
extracts that archive and calls the container's multi-model API (`POST /models`, `/models/{name}/invoke`...,
servestack/adapters/multi_model.py). Aliases (`live`) are not TargetModels: SageMaker caches a loaded archive by its
key,
so a mutable key would keep serving the old bytes; resolve the alias to a version first.

The image follows the instance type: the GPU image (servestack/cdk/containers/gpu.Dockerfile) on ml.g*/ml.p* instances,
the
CPU image (servestack/cdk/containers/cpu.Dockerfile) on every other type and on Serverless Inference.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

from aws_cdk import Duration, Stack
from aws_cdk import aws_applicationautoscaling as appscaling
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import aws_sagemaker as sagemaker
from constructs import Construct

import servestack.cdk.guardrails as guardrails
from servestack.architectures import instance_architecture
from servestack.aws_rules import SAGEMAKER_REALTIME, SAGEMAKER_SERVERLESS, EngineLimit
from servestack.cdk.capture import capture_environment, data_capture_config, native_capture
from servestack.cdk.scaling_guard import check_variants
from servestack.cdk.shared import acknowledge, check_range, endpoint_log_group, grant_sagemaker_logging, logical_id
from servestack.cdk.sources import package_members
from servestack.gpu_families import AL2023_GPU_4_1, inference_ami
from servestack.spec import (
    AlarmSettings,
    Batching,
    Capture,
    GpuSettings,
    ModelSpec,
    RealtimeServerless,
    ShadowVariant,
    Strategy,
    Variant,
    uses_gpu,
)

CONTAINER_MODEL_DIR = "/opt/ml/model"
# How often each container worker writes its overload metrics (EMF) to stdout (servestack/adapters/metrics.py).
METRICS_INTERVAL_SEC = 10
# The host AMI of GPU production variants (ProductionVariant.InferenceAmiVersion). The GPU image is CUDA 13.0
# (servestack/cdk/containers/gpu.Dockerfile: PyPI's onnxruntime-gpu is a CUDA 13 build), which needs an NVIDIA
# driver >= 580: CUDA 13.x runs on the r580 branch and newer, older ones only through NVIDIA's
# forward-compatibility libraries. SageMaker's AMI versions (ProductionVariant API reference and "Best practices
# to minimize interruptions during GPU driver upgrades", checked 2026-12-04 against botocore 1.44.8's model):
# al2-ami-sagemaker-inference-gpu-2 and -2-1 carry driver 535 / CUDA 12.2, -gpu-3-1 driver 550 / CUDA 12.4,
# al2023-ami-sagemaker-inference-gpu-4-1 driver 580 / CUDA 13.0; the default host AMI (none named) is older still
# on ml.g4dn/g5/p4d. Only 4-1 carries a driver that runs CUDA 13, and its container toolkit mounts no
# CUDA-compat libraries, which the image does not need on that driver. Each GPU family's AMI, and the families the
# image cannot run on at all, are servestack/gpu_families.py's table. Batch Transform's host AMIs
# (TransformResources.TransformAmiVersion) carry driver 470 or 535 only: the spec refuses GPU types for Batch
# Transform (servestack/gpu_families.py `transform_refusal`).
GPU_INFERENCE_AMI_VERSION = AL2023_GPU_4_1
_ECR_AUTH_REASON = (
    "ecr:GetAuthorizationToken has no resource-level permissions (AWS requires Resource '*'); image pulls "
    "themselves are scoped to the asset repository."
)
_METRICS_REASON = (
    "cloudwatch:PutMetricData has no resource-level permissions; it is limited by a condition to the "
    "/aws/sagemaker/Endpoints namespace."
)


def model_data_archive(root: Path, models: Sequence[ModelSpec], cache_dir: Path | None = None) -> Path:
    """A reproducible `model.tar.gz` holding `<name>/<version>/<files>` (same input, same bytes): each package's
    files as its manifest names them (servestack/cdk/sources.py `package_members`: the model, its hooks, its
    listed files, the samples), a package missing one refused."""
    members: list[tuple[str, Path]] = []
    for m in models:
        base = root / m.artifact_path
        if not (base / "model.onnx").is_file():
            raise FileNotFoundError(
                f"{base / 'model.onnx'} not found for model {m.name}@{m.version}: run `make models` "
                "(or fix `path` in serving.yaml)"
            )
        members += [(f"{m.name}/{m.version}/{name}", path) for name, path in package_members(base)]
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for arcname, path in members:
            info = tarfile.TarInfo(arcname)
            info.size, info.mtime, info.mode = path.stat().st_size, 0, 0o644
            with path.open("rb") as stream:
                tar.addfile(info, stream)
    packed = gzip.compress(raw.getvalue(), compresslevel=6, mtime=0)
    digest = hashlib.sha256(packed).hexdigest()[:20]
    out_dir = cache_dir or Path(tempfile.gettempdir()) / "servestack-model-data"
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"{digest}" / "model.tar.gz"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_bytes(packed)
        tmp.replace(out)
    return out


def gpu_inference_ami(instance_type: str) -> str | None:
    """The InferenceAmiVersion of a production variant on `instance_type`: the CUDA 13 image's host AMI on GPU
    types (servestack/gpu_families.py; ValueError for a GPU the image cannot run on), none on CPU types."""
    return inference_ami(instance_type) if uses_gpu(instance_type) else None


def single_model_environment(model_name: str) -> dict[str, str]:
    """The container's settings for one model unpacked from its model data (async backend, Batch Transform)."""
    return {
        "SERVESTACK_MODEL_DIR": CONTAINER_MODEL_DIR,
        "SERVESTACK_DEFAULT_MODEL": model_name,
        "SERVESTACK_PROVIDERS": "auto",
    }


# How long a body past the realtime limit may take to arrive (the setting's ceiling): SageMaker reads a large
# async payload from S3 and streams it to the container, 1 GiB at >= 3.5 MB/s.
LARGE_BODY_READ_TIMEOUT_SEC = 300


def engine_environment(engine: EngineLimit, max_payload_bytes: int) -> dict[str, str]:
    """The container's limits, its engine's (servestack/aws_rules.py's table): the body it accepts and how long a
    request may take. A limit past the realtime one (SageMaker async) also lifts the row bounds, which exist to
    keep a realtime batch small: a body of N bytes holds at most N rows, and the body's size is already bounded."""
    check_range(engine.engine, "max_payload_bytes", max_payload_bytes, 1, engine.max_payload_bytes)
    environment = {
        "SERVESTACK_MAX_PAYLOAD_BYTES": str(max_payload_bytes),
        "SERVESTACK_REQUEST_TIMEOUT_SEC": str(engine.timeout_sec),
    }
    if max_payload_bytes > SAGEMAKER_REALTIME.max_payload_bytes:
        environment |= {
            "SERVESTACK_MAX_BATCH_ROWS": str(max_payload_bytes),
            "SERVESTACK_MAX_QUEUE_ROWS": str(max_payload_bytes),
            "SERVESTACK_BODY_READ_TIMEOUT_SEC": str(LARGE_BODY_READ_TIMEOUT_SEC),
        }
    return environment


def servestack_model(
    scope: Construct,
    construct_id: str,
    *,
    role: iam.IRole,
    image_uri: str,
    model_data_url: str,
    environment: dict[str, str],
    mode: str | None = None,
    network_isolation: bool = True,
) -> sagemaker.CfnModel:
    """A SageMaker model of the servestack container, for every construct that runs one (realtime variants,
    inference components, the SageMaker async backend, Batch Transform): network-isolated, as the container
    reads only its model data and answers on its port, and created after its role's policies exist.
    `network_isolation=False` for Serverless Inference, which does not support it (and is isolated anyway)."""
    model = sagemaker.CfnModel(
        scope,
        construct_id,
        execution_role_arn=role.role_arn,
        enable_network_isolation=network_isolation,
        primary_container=sagemaker.CfnModel.ContainerDefinitionProperty(
            image=image_uri, mode=mode, model_data_url=model_data_url, environment=environment
        ),
    )
    model.node.add_dependency(role)
    return model


def sagemaker_scaling_role(scope: Construct, id: str) -> iam.IRole:
    """Application Auto Scaling's service-linked role for SageMaker variants (created by AWS on first use)."""
    arn = Stack.of(scope).format_arn(
        service="iam",
        region="",
        resource="role",
        resource_name="aws-service-role/sagemaker.application-autoscaling.amazonaws.com/"
        "AWSServiceRoleForApplicationAutoScaling_SageMakerEndpoint",
    )
    return iam.Role.from_role_arn(scope, id, arn, mutable=False)


class RealtimeEndpoint(Construct):
    """A SageMaker realtime endpoint with blue/green releases, auto-rollback alarms and autoscaling.

    `model_data` maps each served model key (`name@version`) to its uploaded `model.tar.gz` asset. Each variant
    runs `gpu_image` on a GPU instance type (ml.g*, ml.p*), `cpu_arm64_image` (built for linux/arm64) on an AWS
    Graviton type (ml.c7g, ml.m6g...: servestack/architectures.py) and `cpu_image` otherwise (and on serverless).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        endpoint_name: str,
        model_data: dict[str, s3_assets.Asset],
        variants: Sequence[Variant],
        default_model: str,
        shadow: ShadowVariant | None = None,
        instance_type: str = "ml.g5.xlarge",
        min_instances: int = 1,
        max_instances: int = 2,
        target_invocations_per_instance: int = 1000,
        serverless: RealtimeServerless | None = None,
        multi_model_bucket: s3.IBucket | None = None,
        max_payload_bytes: int | None = None,
        log_retention_days: int = 30,
        strategy: Strategy | None = None,
        alarms: AlarmSettings | None = None,
        batching: Batching | None = None,
        gpu: GpuSettings | None = None,
        gpu_image: ecr_assets.DockerImageAsset | None = None,
        cpu_image: ecr_assets.DockerImageAsset | None = None,
        cpu_arm64_image: ecr_assets.DockerImageAsset | None = None,
        deployment: str | None = None,
        autoscaling: bool = True,
        capture: Capture | None = None,
        capture_bucket: s3.IBucket | None = None,
    ) -> None:
        super().__init__(scope, id)
        if capture is not None and capture_bucket is None:
            raise ValueError(f"RealtimeEndpoint {endpoint_name}: capture needs capture_bucket")
        check_range("RealtimeEndpoint", "len(variants)", len(variants), 1, 10)
        check_range("RealtimeEndpoint", "min_instances", min_instances, 1, 100)
        check_range("RealtimeEndpoint", "max_instances", max_instances, min_instances, 100)
        check_range("RealtimeEndpoint", "len(endpoint_name)", len(endpoint_name), 1, 63)
        if shadow is not None and len(variants) != 1:
            raise ValueError(
                f"RealtimeEndpoint {endpoint_name}: a shadow variant needs exactly 1 production variant, "
                f"not {len(variants)}"
            )
        strategy = strategy or Strategy()
        alarms = alarms or AlarmSettings()
        batching = batching or Batching()
        self.endpoint_name = endpoint_name
        # Multi-model endpoints serve from the model registry's layout (servestack/adapters/aws/registry.py):
        # `models/<name>/<version>/{model.onnx,manifest.json}` + `models/<name>/aliases.json`, the prefix
        # `servestack models push --registry s3://<bucket>/models/` writes to.
        self.multi_model_prefix = "models/"

        self.logs = endpoint_log_group(self, "Logs", endpoint_name=endpoint_name, retention_days=log_retention_days)

        self.role = iam.Role(
            self,
            "ExecutionRole",
            assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"),
            description=f"SageMaker endpoint {endpoint_name}: pull its image, read its model, write its logs",
        )

        def image_for(variant_name: str, itype: str) -> ecr_assets.DockerImageAsset:
            # Serverless Inference runs the x86_64 CPU image; an instance runs the image of its GPU and CPU
            # architecture (servestack/architectures.py: a Graviton type needs the linux/arm64 CPU image).
            gpu = serverless is None and uses_gpu(itype)
            arm64 = serverless is None and not gpu and instance_architecture(itype) == "arm64"
            chosen, argument = (
                (gpu_image, "gpu_image")
                if gpu
                else (cpu_arm64_image, "cpu_arm64_image")
                if arm64
                else (cpu_image, "cpu_image")
            )
            if chosen is None:
                where = "serverless" if serverless is not None else itype
                kind = "GPU" if gpu else "arm64 CPU" if arm64 else "CPU"
                raise ValueError(
                    f"RealtimeEndpoint {endpoint_name}: variant {variant_name} on {where} runs the {kind} image, "
                    f"but {argument}=None"
                )
            return chosen

        self.images: dict[str, ecr_assets.DockerImageAsset] = {}
        for v in variants:
            self.images[v.name] = image_for(v.name, v.instance_type or instance_type)
        if shadow is not None:
            self.images[shadow.name] = image_for(shadow.name, shadow.instance_type or instance_type)
        pulled: list[ecr_assets.DockerImageAsset] = []
        for image in self.images.values():
            if all(image is not other for other in pulled):
                image.repository.grant_pull(self.role)
                pulled.append(image)
        grant_sagemaker_logging(self.role, self.logs)
        # Not for our code (its metrics are EMF log lines): SageMaker's hosting agent publishes the instances'
        # utilisation metrics (CPUUtilization, MemoryUtilization, GPU..., the dashboard's utilisation panel) to
        # /aws/sagemaker/Endpoints with the execution role.
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["cloudwatch:PutMetricData"],
                resources=["*"],
                conditions={"StringLike": {"cloudwatch:namespace": "/aws/sagemaker/Endpoints*"}},
            )
        )
        for asset in model_data.values() if multi_model_bucket is None else ():
            self.role.add_to_policy(
                iam.PolicyStatement(
                    actions=["s3:GetObject"], resources=[asset.bucket.arn_for_objects(asset.s3_object_key)]
                )
            )
        if multi_model_bucket is not None:
            self.role.add_to_policy(
                iam.PolicyStatement(
                    actions=["s3:GetObject"],
                    resources=[multi_model_bucket.arn_for_objects(f"{self.multi_model_prefix}*")],
                )
            )

        # Serverless Inference takes 4 MB where an instance-backed endpoint takes 6 (servestack/aws_rules.py).
        engine = SAGEMAKER_SERVERLESS if serverless is not None else SAGEMAKER_REALTIME
        base_env = {
            "SERVESTACK_MODEL_DIR": CONTAINER_MODEL_DIR,
            "SERVESTACK_DEFAULT_MODEL": default_model,
            "SERVESTACK_PROVIDERS": "auto",
            **engine_environment(engine, max_payload_bytes or engine.max_payload_bytes),
            "SERVESTACK_MAX_BATCH_SIZE": str(batching.max_batch_size),
            "SERVESTACK_MAX_DELAY_MS": str(batching.max_delay_ms),
            "SERVESTACK_MAX_QUEUE_REQUESTS": str(batching.max_queue),
            # serving.yaml's `gpu:` (the spec allows it on GPU instance types only)
            **(gpu.environment if gpu is not None else {}),
        }
        # SageMaker captures the endpoint itself, unless columns are left out: then its containers write capture
        # log lines, which the deployment's LogCapture ships (servestack/cdk/capture.py).
        self.log_capture = capture is not None and not native_capture(capture)
        if capture is not None and self.log_capture:
            base_env |= capture_environment(capture, deployment=deployment or endpoint_name, mode="realtime")

        def model(variant_name: str, model_key: str, model_name: str) -> sagemaker.CfnModel:
            image_uri = self.images[variant_name].image_uri
            variant_env = {
                **base_env,
                "SERVESTACK_ENDPOINT_NAME": endpoint_name,
                "SERVESTACK_VARIANT_NAME": variant_name,
                "SERVESTACK_METRICS_INTERVAL_SEC": str(METRICS_INTERVAL_SEC),
            }
            construct_id = f"Model{variant_name.title().replace('-', '')}"
            if multi_model_bucket is not None:
                # SageMaker downloads `<prefix><TargetModel>` with the execution role, extracts it and calls the
                # container's multi-model API; the container itself never reaches S3.
                return servestack_model(
                    self,
                    construct_id,
                    role=self.role,
                    image_uri=image_uri,
                    mode="MultiModel",
                    model_data_url=multi_model_bucket.s3_url_for_object(self.multi_model_prefix),
                    environment={**variant_env, "SERVESTACK_MULTI_MODEL": "true"},
                )
            return servestack_model(
                self,
                construct_id,
                role=self.role,
                image_uri=image_uri,
                mode="SingleModel",
                model_data_url=model_data[model_key].s3_object_url,
                environment={**variant_env, "SERVESTACK_DEFAULT_MODEL": model_name},
                # SageMaker Serverless Inference does not support network isolation: CreateEndpointConfig of a
                # serverless variant whose model sets it fails.
                network_isolation=serverless is None,
            )

        def production_variant(
            name: str, model_key: str, model_name: str, weight: float, itype: str | None, count: int
        ) -> sagemaker.CfnEndpointConfig.ProductionVariantProperty:
            m = model(name, model_key, model_name)
            if serverless is not None:
                return sagemaker.CfnEndpointConfig.ProductionVariantProperty(
                    variant_name=name,
                    model_name=m.attr_model_name,
                    initial_variant_weight=weight,
                    serverless_config=sagemaker.CfnEndpointConfig.ServerlessConfigProperty(
                        memory_size_in_mb=serverless.memory_mib, max_concurrency=serverless.max_concurrency
                    ),
                )
            return sagemaker.CfnEndpointConfig.ProductionVariantProperty(
                variant_name=name,
                model_name=m.attr_model_name,
                initial_variant_weight=weight,
                instance_type=itype or instance_type,
                initial_instance_count=count,
                inference_ami_version=gpu_inference_ami(itype or instance_type),
            )

        self.variant_names = [v.name for v in variants]
        production = [
            production_variant(
                v.name, f"{v.model}@{v.version}", v.model, float(v.weight), v.instance_type, min_instances
            )
            for v in variants
        ]
        shadows = []
        if shadow is not None:
            # A shadow variant receives (its weight / the production weight) of the requests, as copies.
            weight = float(variants[0].weight) * shadow.sample_percent / 100
            shadows.append(
                production_variant(
                    shadow.name,
                    f"{shadow.model}@{shadow.version}",
                    shadow.model,
                    weight,
                    shadow.instance_type,
                    1,
                )
            )
        self.capture_prefix = capture.prefix_of(deployment or endpoint_name) if capture is not None else None
        self.endpoint_config = sagemaker.CfnEndpointConfig(
            self,
            "EndpointConfig",
            production_variants=production,
            shadow_production_variants=shadows or None,
            data_capture_config=data_capture_config(capture, capture_bucket, self.capture_prefix, self.role)
            if capture is not None and capture_bucket is not None and self.capture_prefix and not self.log_capture
            else None,
        )

        self.alarms: list[cw.Alarm] = []
        for v in variants:
            self.alarms += guardrails.sagemaker_variant_alarms(
                self, endpoint_name=endpoint_name, variant=v.name, settings=alarms
            )
        # Operational, not rollback alarms: sustained 429s call for capacity, not for the previous release.
        self.overload_alarms = [
            guardrails.sagemaker_overload_alarm(self, endpoint_name=endpoint_name, variant=v.name, settings=alarms)
            for v in variants
        ]
        self.endpoint = sagemaker.CfnEndpoint(
            self,
            "Endpoint",
            endpoint_name=endpoint_name,
            endpoint_config_name=self.endpoint_config.attr_endpoint_config_name,
            # Blue/green guardrails are not offered for serverless variants: those update all at once.
            deployment_config=None
            if serverless is not None
            else guardrails.sagemaker_deployment_config(strategy, self.alarms),
        )

        self.scaling: list[appscaling.ScalableTarget] = []
        if serverless is None:
            # SageMaker refuses an instance type change of an autoscaled variant, and a variant renamed or removed
            # under the blue/green policy above (servestack/cdk/scaling_guard.py).
            check_variants(
                self,
                deployment=deployment or endpoint_name,
                endpoint_name=endpoint_name,
                instance_types={v.name: v.instance_type or instance_type for v in variants},
                blue_green=True,
            )
        if serverless is None and autoscaling:
            for v in variants:
                target = appscaling.ScalableTarget(
                    self,
                    f"Scaling{v.name.title().replace('-', '')}",
                    service_namespace=appscaling.ServiceNamespace.SAGEMAKER,
                    resource_id=f"endpoint/{endpoint_name}/variant/{v.name}",
                    scalable_dimension="sagemaker:variant:DesiredInstanceCount",
                    min_capacity=min_instances,
                    max_capacity=max_instances,
                    role=sagemaker_scaling_role(self, f"ScalingRole{v.name.title().replace('-', '')}"),
                )
                target.node.add_dependency(self.endpoint)
                target.scale_to_track_metric(
                    "InvocationsPerInstance",
                    target_value=target_invocations_per_instance,
                    predefined_metric=appscaling.PredefinedMetric.SAGEMAKER_VARIANT_INVOCATIONS_PER_INSTANCE,
                    scale_in_cooldown=Duration.minutes(5),
                    scale_out_cooldown=Duration.minutes(1),
                )
                self.scaling.append(target)

        findings = {"AwsSolutions-IAM5[Resource::*]": f"{_ECR_AUTH_REASON} {_METRICS_REASON}"}
        if multi_model_bucket is not None:
            logical = logical_id(multi_model_bucket)
            findings[f"AwsSolutions-IAM5[Resource::<{logical}.Arn>/{self.multi_model_prefix}*]"] = (
                "Multi-model mode loads any model under the endpoint's own prefix; the set of models changes "
                "at runtime, so the prefix cannot be narrowed further."
            )
        acknowledge(self.role, findings)

    def metric(self, name: str, statistic: str, variant: str | None = None, namespace: str | None = None) -> cw.Metric:
        return guardrails.sagemaker_variant_metric(
            self.endpoint_name,
            variant or self.variant_names[0],
            name,
            statistic,
            Duration.minutes(1),
            namespace or guardrails.SAGEMAKER_NAMESPACE,
        )
