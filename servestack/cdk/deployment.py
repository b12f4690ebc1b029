"""One CloudFormation stack per deployment in serving.yaml, and the function that adds them all to an app.

A stack holds the shared pieces (artifact bucket, log retention), the construct of its mode
(servestack/cdk/<mode>.py, paired with servestack/adapters/<mode>.py), its dashboard, and outputs the smoke
test reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aws_cdk import CfnOutput, Environment, Stack, Tags
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk.aws_logs import ILogGroup
from constructs import Construct

from servestack.architectures import Architecture, instance_architecture
from servestack.artifacts import sample_file
from servestack.cdk.asynchronous import AsyncEndpoint
from servestack.cdk.batch import BatchJob
from servestack.cdk.bundling import FunctionCode, function_code
from servestack.cdk.capture import LogCapture, capture_environment
from servestack.cdk.components import ComponentEndpoint
from servestack.cdk.images import MODEL_PACKAGES, dockerfile_name, dockerfile_workdir, image_context
from servestack.cdk.monitoring import add_drift_monitor
from servestack.cdk.observability import PERIOD, DeploymentDashboard, Panel, percentiles
from servestack.cdk.realtime import RealtimeEndpoint, model_data_archive
from servestack.cdk.scaling_guard import suspended
from servestack.cdk.serverless import ServerlessEndpoint
from servestack.cdk.shared import ArtifactBucket
from servestack.spec import (
    AsyncDeployment,
    BatchDeployment,
    Capture,
    ModelSpec,
    RealtimeDeployment,
    ServerlessDeployment,
    ServingSpec,
    Variant,
    uses_gpu,
)
from servestack.template import default_entry_points

# What each architecture's images are built as (servestack/architectures.py); the assets manifest records it.
_PLATFORMS = {"x86_64": ecr_assets.Platform.LINUX_AMD64, "arm64": ecr_assets.Platform.LINUX_ARM64}


@dataclass(frozen=True)
class SmokeGrant:
    """What the pipeline's smoke test (servestack/cdk/smoke.py) calls on a deployment: one action on resources named
    `arn:<partition>:<service>:<region>:<account>:<resource>`. The pipeline's stack cannot refer to a stage's
    resources, so the smoke step's role is granted exactly these, by their fixed names."""

    action: str
    service: str
    resources: tuple[str, ...]


def read_sample(root: Path, model: ModelSpec, which: str) -> Any:
    """The package's sample request/response; missing, the error names the command that writes it."""
    return json.loads(sample_file(model, root, which).read_text(encoding="utf-8"))


class DeploymentStack(Stack):
    """Everything one deployment of serving.yaml needs, in its own stack (deploy it by name)."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        spec: ServingSpec,
        deployment: str,
        root: Path,
        entry_points: Path | None = None,
        name_prefix: str = "servestack-",
        env: Environment | None = None,
    ) -> None:
        d = spec.deployments[deployment]
        super().__init__(
            scope, id, env=env, description=f"servestack deployment {deployment} ({d.mode}, model {d.model})"
        )
        Tags.of(self).add("servestack:deployment", deployment)
        Tags.of(self).add("servestack:mode", d.mode)
        self.deployment = deployment
        self.mode = d.mode
        self.root = root  # the project: serving.yaml and its model packages
        # The entry modules the functions and containers run (shipped as the package `handlers`): the project's
        # own, or servestack's default ones.
        self.entry_points = entry_points or default_entry_points()
        self.resource_name = f"{name_prefix}{deployment}"
        models = spec.models_of(deployment)
        primary = models[0]
        self.served_packages = [m.artifact_path for m in models]  # whose declared requirements its images install
        # The architectures of the container images this stack builds (its endpoint's, its Fargate task's, its
        # function's when a container image): a pipeline that builds a linux/arm64 one on x86_64 hosts needs QEMU
        # (servestack/cdk/pipeline.py).
        self.image_architectures: set[Architecture] = set()
        self.shared = ArtifactBucket(self, "Artifacts")
        bucket = self.shared.bucket
        name = self.resource_name
        self.construct: Construct

        if isinstance(d, RealtimeDeployment) and d.components:
            components = [
                c.model_copy(update={"version": spec.model(c.model, c.version).version}) for c in d.components
            ]
            data = {
                m.key: s3_assets.Asset(self, f"ModelData{i}", path=str(model_data_archive(root, [m])))
                for i, m in enumerate(models)
            }
            ce = ComponentEndpoint(
                self,
                "Components",
                endpoint_name=name,
                model_data=data,
                components=components,
                image=self._image_for(d.instance_type),
                instance_type=d.instance_type,
                min_instances=d.min_instances,
                max_instances=d.max_instances,
                max_payload_bytes=d.max_payload_bytes,
                log_retention_days=d.log_retention_days,
                strategy=d.strategy,
                alarms=d.alarms,
                batching=d.batching,
                gpu=d.gpu,
            )
            self.construct = ce
            alarms = [*ce.alarms, *ce.overload_alarms]
            panels = [
                Panel(
                    "Model latency by component (µs, as SageMaker publishes it)",
                    [
                        m
                        for c in components
                        for m in percentiles(ce.metric("ModelLatency", "p99", c.component_name), c.component_name)
                    ],
                ),
                Panel(
                    "Invocations and errors by component",
                    [ce.metric("Invocations", "Sum", c.component_name) for c in components],
                    [ce.metric("Invocation5XXErrors", "Sum", c.component_name) for c in components]
                    + [ce.metric("NoCapacityInvocationFailures", "Sum", c.component_name) for c in components],
                ),
            ]
            # The smoke test invokes the component serving the deployment's model (the spec requires one).
            smoke = next(c for c in components if c.model == primary.name)
            component = ce.component_names[smoke.component_name]
            self._smoke(
                "sagemaker-component",
                f"{name}/{component}",
                SmokeGrant(
                    "sagemaker:InvokeEndpoint", "sagemaker", (f"endpoint/{name}", f"inference-component/{component}")
                ),
            )
        elif isinstance(d, RealtimeDeployment):
            variants = d.variants or [Variant(name="primary", model=primary.name, version=primary.version)]
            # The images the variants run: (GPU?, CPU architecture) of each variant's instance type; SageMaker
            # Serverless Inference runs the x86_64 CPU image.
            images = {
                (False, "x86_64") if d.serverless is not None else (uses_gpu(t), instance_architecture(t))
                for t in [
                    *(v.instance_type or d.instance_type for v in variants),
                    *([d.shadow.instance_type or d.instance_type] if d.shadow else []),
                ]
            }
            resolved = [v.model_copy(update={"version": spec.model(v.model, v.version).version}) for v in variants]
            shadow = d.shadow
            if shadow is not None:
                shadow = shadow.model_copy(update={"version": spec.model(shadow.model, shadow.version).version})
            data = {
                m.key: s3_assets.Asset(self, f"ModelData{i}", path=str(model_data_archive(root, [m])))
                for i, m in enumerate(models)
                if not d.multi_model  # multi-model endpoints load from their S3 prefix instead
            }
            rt = RealtimeEndpoint(
                self,
                "Realtime",
                endpoint_name=name,
                gpu_image=self._image("gpu") if (True, "x86_64") in images else None,
                cpu_image=self._image("cpu") if (False, "x86_64") in images else None,
                cpu_arm64_image=self._image("cpu", "arm64") if (False, "arm64") in images else None,
                model_data=data,
                variants=resolved,
                default_model=primary.name,
                shadow=shadow,
                instance_type=d.instance_type,
                min_instances=d.min_instances,
                max_instances=d.max_instances,
                target_invocations_per_instance=d.target_invocations_per_instance,
                serverless=d.serverless,
                multi_model_bucket=bucket if d.multi_model else None,
                max_payload_bytes=d.max_payload_bytes,
                log_retention_days=d.log_retention_days,
                strategy=d.strategy,
                alarms=d.alarms,
                batching=d.batching,
                gpu=d.gpu,
                deployment=deployment,
                autoscaling=deployment not in suspended(self),
                capture=d.capture,
                capture_bucket=bucket if d.capture is not None else None,
            )
            self.construct = rt
            if d.capture is not None and rt.log_capture:
                self._log_capture(d.capture, [rt.logs])
            alarms = [*rt.alarms, *rt.overload_alarms]
            instance_ns = "/aws/sagemaker/Endpoints"
            overload_ns = "servestack"  # the containers' EMF metrics (servestack/adapters/metrics.py)
            panels = [
                Panel(
                    "Model latency (µs, as SageMaker publishes it)",
                    percentiles(rt.metric("ModelLatency", "p99"), "model"),
                ),
                Panel(
                    "Invocations and errors",
                    [rt.metric("Invocations", "Sum")],
                    [rt.metric("Invocation4XXErrors", "Sum"), rt.metric("Invocation5XXErrors", "Sum")],
                ),
                Panel("Invocations per instance", [rt.metric("InvocationsPerInstance", "Sum")]),
                Panel(
                    "Overload: queued and admitted requests per worker (max), 429s (sum)",
                    [rt.metric("QueueDepth", "Maximum", variant=v.name, namespace=overload_ns) for v in resolved]
                    + [rt.metric("InFlight", "Maximum", variant=v.name, namespace=overload_ns) for v in resolved],
                    [rt.metric("Rejected", "Sum", variant=v.name, namespace=overload_ns) for v in resolved],
                ),
                Panel(
                    "Utilisation (%)",
                    [
                        rt.metric("CPUUtilization", "Average", namespace=instance_ns),
                        rt.metric("GPUUtilization", "Average", namespace=instance_ns),
                        rt.metric("GPUMemoryUtilization", "Average", namespace=instance_ns),
                    ],
                ),
            ]
            self._smoke("sagemaker", name, SmokeGrant("sagemaker:InvokeEndpoint", "sagemaker", (f"endpoint/{name}",)))
        elif isinstance(d, ServerlessDeployment):
            # the pre-traffic hook asks each new version for its packaged sample: the package must hold one
            read_sample(root, primary, "request"), read_sample(root, primary, "response")
            sl = ServerlessEndpoint(
                self,
                "Serverless",
                name=name,
                code=self._code(models, d.architecture, d.lambda_package),
                model_name=primary.name,
                memory_mib=d.memory_mib,
                timeout_sec=d.timeout_sec,
                architecture=d.architecture,
                reserved_concurrency=d.reserved_concurrency,
                provisioned_concurrency_min=d.provisioned_concurrency_min,
                provisioned_concurrency_max=d.provisioned_concurrency_max,
                provisioned_utilization_percent=d.provisioned_utilization_percent,
                throttle_rate_per_sec=d.throttle_rate_per_sec,
                throttle_burst=d.throttle_burst,
                max_payload_bytes=d.max_payload_bytes,
                log_retention_days=d.log_retention_days,
                strategy=d.strategy,
                alarms=d.alarms,
            )
            self.construct = sl
            if d.capture is not None:
                for variable, value in capture_environment(d.capture, deployment=deployment, mode="serverless").items():
                    sl.function.add_environment(variable, value)
                self._log_capture(d.capture, [sl.function.log_group])
            alarms = [*sl.alarms, sl.api_5xx_alarm]
            alias = sl.alias
            panels = [
                Panel("Duration (ms)", percentiles(alias.metric_duration(), "duration")),
                Panel(
                    "Invocations, errors, throttles",
                    [alias.metric_invocations(period=PERIOD, statistic="Sum")],
                    [
                        alias.metric_errors(period=PERIOD, statistic="Sum"),
                        alias.metric_throttles(period=PERIOD),
                    ],
                ),
                Panel(
                    "HTTP API 4xx / 5xx and p99 latency",
                    [
                        sl.http.api.metric_client_error(period=PERIOD, statistic="Sum"),
                        sl.http.api.metric_server_error(period=PERIOD, statistic="Sum"),
                    ],
                    [sl.http.api.metric_latency(period=PERIOD, statistic="p99")],
                ),
                Panel(
                    "Concurrency",
                    [
                        alias.metric("ConcurrentExecutions", period=PERIOD, statistic="Maximum"),
                        alias.metric("ProvisionedConcurrencyUtilization", period=PERIOD, statistic="Maximum"),
                    ],
                ),
            ]
            self._smoke(
                "lambda-http",
                alias.function_arn,
                SmokeGrant("lambda:InvokeFunction", "lambda", (f"function:{name}:{alias.alias_name}",)),
            )
            CfnOutput(self, "ApiUrl", value=sl.http.url, description="IAM-authenticated (SigV4) HTTP API")
        elif isinstance(d, AsyncDeployment):
            sagemaker_backend = d.backend == "sagemaker"
            ae = AsyncEndpoint(
                self,
                "Async",
                name=name,
                code=self._code(models, d.architecture, d.lambda_package),
                bucket=bucket,
                model_name=primary.name,
                batch_size=d.batch_size,
                batch_window_sec=d.batch_window_sec,
                max_receive_count=d.max_receive_count,
                max_concurrency=d.max_concurrency,
                memory_mib=d.memory_mib,
                timeout_sec=d.timeout_sec,
                architecture=d.architecture,
                result_ttl_days=d.result_ttl_days,
                presign_threshold_bytes=d.presign_threshold_bytes,
                max_payload_bytes=d.max_payload_bytes,
                log_retention_days=d.log_retention_days,
                alarms=d.alarms,
                backend=d.backend,
                image=self._image_for(d.instance_type) if sagemaker_backend else None,
                model_data=s3_assets.Asset(self, "ModelData0", path=str(model_data_archive(root, [primary])))
                if sagemaker_backend
                else None,
                instance_type=d.instance_type,
                max_instances=d.max_instances,
                target_backlog_per_instance=d.target_backlog_per_instance,
                gpu=d.gpu,
                deployment=deployment,
                autoscaling=deployment not in suspended(self),
            )
            self.construct = ae
            if d.capture is not None:  # the Lambda backend's worker (the spec refuses the SageMaker backend's)
                for variable, value in capture_environment(d.capture, deployment=deployment, mode="async").items():
                    ae.worker.add_environment(variable, value)
                self._log_capture(d.capture, [ae.worker.log_group])
            alarms = ae.alarms
            panels = [
                Panel(
                    "Queue depth",
                    [
                        ae.queue.metric_approximate_number_of_messages_visible(period=PERIOD),
                        ae.queue.metric_approximate_number_of_messages_not_visible(period=PERIOD),
                    ],
                    [ae.dead_letters.metric_approximate_number_of_messages_visible(period=PERIOD)],
                ),
                Panel(
                    "Oldest notification age (s)" if sagemaker_backend else "Oldest job age (s)",
                    [ae.queue.metric_approximate_age_of_oldest_message(period=PERIOD)],
                ),
                Panel(
                    "Notifier duration (ms)" if sagemaker_backend else "Worker duration (ms)",
                    percentiles(ae.worker.metric_duration(), "notifier" if sagemaker_backend else "worker"),
                ),
                Panel(
                    "Submissions and errors",
                    [
                        ae.submit.metric_invocations(period=PERIOD),
                        ae.worker.metric_invocations(period=PERIOD),
                    ],
                    [
                        ae.submit.metric_errors(period=PERIOD),
                        ae.worker.metric_errors(period=PERIOD),
                        ae.worker.metric_throttles(period=PERIOD),
                        ae.http.api.metric_client_error(period=PERIOD),
                        ae.http.api.metric_server_error(period=PERIOD),
                    ],
                ),
            ]
            if sagemaker_backend:
                backlog = {"EndpointName": name}
                panels.append(
                    Panel(
                        "SageMaker backlog (jobs waiting) and scale-from-zero signal",
                        [
                            cw.Metric(
                                namespace="AWS/SageMaker",
                                metric_name="ApproximateBacklogSize",
                                dimensions_map=backlog,
                                statistic="Average",
                                period=PERIOD,
                            )
                        ],
                        [
                            cw.Metric(
                                namespace="AWS/SageMaker",
                                metric_name="HasBacklogWithoutCapacity",
                                dimensions_map=backlog,
                                statistic="Maximum",
                                period=PERIOD,
                            )
                        ],
                    )
                )
            self._smoke(
                "lambda-async",
                ae.submit.function_arn,
                SmokeGrant("lambda:InvokeFunction", "lambda", (f"function:{name}-submit",)),
            )
            CfnOutput(self, "ApiUrl", value=ae.http.url, description="IAM-authenticated (SigV4) HTTP API")
        elif isinstance(d, BatchDeployment):
            fargate, transform = d.runner == "fargate", d.runner == "transform"
            bj = BatchJob(
                self,
                "Batch",
                name=name,
                bucket=bucket,
                model_name=primary.name,
                schedule=d.schedule,
                timezone=d.timezone,
                input_prefix=d.input_prefix or f"batch/{deployment}/input/",
                output_prefix=d.output_prefix or f"batch/{deployment}/output/",
                runner=d.runner,
                code=None if fargate else self._code(models, d.architecture, d.lambda_package),
                image=self._batch_image(models, d.architecture)
                if fargate
                else self._image_for(d.instance_type)
                if transform
                else None,
                # The Fargate image carries the model packages where its Dockerfile copies `models/`.
                model_dir=f"{dockerfile_workdir('cpu').rstrip('/')}/{MODEL_PACKAGES}" if fargate else None,
                model_data=s3_assets.Asset(self, "ModelData0", path=str(model_data_archive(self.root, [primary])))
                if transform
                else None,
                input_format=d.input_format,
                output_format=d.output_format,
                id_column=d.id_column,
                max_record_bytes=d.max_record_bytes,
                instance_type=d.instance_type,
                instance_count=d.instance_count,
                max_payload_mb=d.max_payload_mb,
                max_concurrent_transforms=d.max_concurrent_transforms,
                transform_timeout_sec=d.transform_timeout_sec,
                gpu=d.gpu,
                memory_mib=d.memory_mib,
                timeout_sec=d.timeout_sec,
                architecture=d.architecture,
                fargate_cpu=d.fargate_cpu,
                fargate_memory_mib=d.fargate_memory_mib,
                retry_attempts=d.retry_attempts,
                max_event_age_sec=d.max_event_age_sec,
                max_payload_bytes=d.max_payload_bytes,
                log_retention_days=d.log_retention_days,
            )
            self.construct = bj
            alarms = bj.alarms
            panels = [
                Panel(
                    "Batch failures and dead letters",
                    [bj.dead_letters.metric_approximate_number_of_messages_visible(period=PERIOD)],
                )
            ]
            if bj.function is not None:
                panels += [
                    Panel("Run duration (ms)", percentiles(bj.function.metric_duration(), "run")),
                    Panel(
                        "Runs and errors",
                        [bj.function.metric_invocations(period=PERIOD)],
                        [bj.function.metric_errors(period=PERIOD)],
                    ),
                ]
            # `<group>/<schedule>`: the schedule is in the deployment's own group (servestack/cdk/batch.py).
            self._smoke(
                "batch",
                f"{name}/{bj.schedule.schedule_name}",
                SmokeGrant("scheduler:GetSchedule", "scheduler", (f"schedule/{name}/{name}",)),
            )
        else:  # pragma: no cover - the spec's discriminated union is exhaustive
            raise TypeError(f"unknown deployment mode {d!r}")

        if d.monitor is not None and d.capture is not None:  # the spec refuses monitor: without capture:
            # A batch deployment's runs are its capture, and its schedule group is the check's too.
            runs = self.construct if isinstance(self.construct, BatchJob) else None
            monitor = add_drift_monitor(
                self, name=name, deployment=deployment, monitor=d.monitor, capture=d.capture, model=primary,
                bucket=bucket, root=root, entry_points=self.entry_points,
                architecture=getattr(d, "architecture", "x86_64"), log_retention_days=d.log_retention_days,
                batch_prefixes=(runs.input_prefix, runs.output_prefix) if runs is not None else None,
                schedule_group=runs.schedule_group if runs is not None else None,
            )  # fmt: skip
            alarms = [*alarms, *monitor.alarms]  # drift, and the check's own failures
            panels.append(Panel("Drift score by column (PSI or Jensen-Shannon distance)", [monitor.scores]))
        CfnOutput(self, "Bucket", value=bucket.bucket_name)
        self.alarms = alarms
        self.dashboard = DeploymentDashboard(self, "Dashboard", dashboard_name=name, panels=panels, alarms=alarms)

    def _log_capture(self, capture: Capture, log_groups: list[ILogGroup]) -> None:
        """Ship the capture lines of `log_groups` to the capture prefix (servestack/cdk/capture.py)."""
        LogCapture(
            self,
            "Capture",
            log_groups=log_groups,
            bucket=self.shared.bucket,
            prefix=capture.prefix_of(self.deployment),
            stream_name=f"{self.resource_name}-capture",
            deployment=self.deployment,
        )

    def _smoke(self, kind: str, target: str, grant: SmokeGrant) -> None:
        """Outputs the pipeline's smoke test reads: what to invoke and how (see servestack/cdk/smoke.py), and what its
        role must be allowed to call."""
        self.smoke_kind = CfnOutput(self, "SmokeKind", value=kind)
        self.smoke_target = CfnOutput(self, "SmokeTarget", value=target)
        self.smoke_grant = grant

    def _code(self, models: list[ModelSpec], architecture: str, package: str = "auto") -> FunctionCode:
        """The deployment's functions' code: a zip bundle, or a container image past Lambda's zip limit."""
        code = function_code(
            entry_points=self.entry_points,
            artifacts=[m.artifact_path for m in models],
            artifacts_root=self.root,
            architecture=architecture,
            package=package,
        )
        self.lambda_package = code.package_type
        if code.image_context is not None:
            self.image_architectures.add("arm64" if architecture == "arm64" else "x86_64")
        return code

    def _batch_image(self, models: list[ModelSpec], architecture: Architecture) -> ecr_assets.DockerImageAsset:
        """The CPU image for a Fargate batch task, built for the task's architecture from a context that carries
        the deployment's model packages (servestack/cdk/images.py): a task has no SageMaker to fetch its model."""
        context = image_context(
            flavour="cpu",
            entry_points=self.entry_points,
            artifacts_root=self.root,
            artifacts=[m.artifact_path for m in models],
        )
        self.image_architectures.add(architecture)
        return ecr_assets.DockerImageAsset(
            self,
            "BatchImage",
            directory=str(context),
            file=dockerfile_name("cpu"),
            platform=_PLATFORMS[architecture],
        )

    def _image_for(self, instance_type: str) -> ecr_assets.DockerImageAsset:
        """The GPU image on a GPU instance type (ml.g*, ml.p*), else the CPU image, each built for the type's CPU
        architecture (servestack/architectures.py: linux/arm64 on Graviton)."""
        flavour = "gpu" if uses_gpu(instance_type) else "cpu"
        return self._image(flavour, instance_architecture(instance_type))

    def _image(self, flavour: str, architecture: Architecture = "x86_64") -> ecr_assets.DockerImageAsset:
        """The realtime container's image of `flavour` for `architecture`, one per stack: its model comes from
        SageMaker (ModelDataUrl), so it carries none."""
        # The x86_64 ids are the ones every stack had before arm64 images: their logical ids stay the same.
        id = f"{flavour.title()}Image" if architecture == "x86_64" else f"{flavour.title()}Arm64Image"
        existing = self.node.try_find_child(id)
        if isinstance(existing, ecr_assets.DockerImageAsset):
            return existing
        self.image_architectures.add(architecture)
        context = image_context(
            flavour=flavour, entry_points=self.entry_points, artifacts_root=self.root, serves=self.served_packages
        )
        return ecr_assets.DockerImageAsset(
            self,
            id,
            directory=str(context),
            file=dockerfile_name(flavour),
            platform=_PLATFORMS[architecture],
        )


def add_deployments(
    scope: Construct,
    spec: ServingSpec,
    root: Path,
    *,
    entry_points: Path | None = None,
    name_prefix: str = "servestack-",
    only: list[str] | None = None,
    env: Environment | None = None,
) -> list[DeploymentStack]:
    """A `DeploymentStack` per deployment (or those in `only`), with id `<name_prefix><deployment>`."""
    wanted = only or list(spec.deployments)
    unknown = [n for n in wanted if n not in spec.deployments]
    if unknown:
        raise ValueError(f"deployments {unknown} are not in serving.yaml ({', '.join(spec.deployments)})")
    return [
        DeploymentStack(
            scope,
            f"{name_prefix}{n}",
            spec=spec,
            deployment=n,
            root=root,
            entry_points=entry_points,
            name_prefix=name_prefix,
            env=env,
        )
        for n in wanted
    ]
