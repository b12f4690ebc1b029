"""The deployment modes besides realtime (servestack/spec/realtime.py): serverless (Lambda behind an HTTP API),
async (S3 + SQS + DynamoDB, on Lambda or a SageMaker async endpoint) and batch (a scheduled Lambda, Fargate task
or Batch Transform job)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, Self

from pydantic import Field, model_validator

from servestack.aws_rules import (
    FARGATE_MEMORY_MIB,
    FARGATE_SIZE_RULE,
    HTTP_API_TIMEOUT_SEC,
    LAMBDA_SYNC,
    SAGEMAKER_ASYNC,
    TRANSFORM_PAYLOAD_RULE,
    EngineLimit,
    fargate_memory_choices,
)
from servestack.gpu_families import transform_refusal
from servestack.spec.base import (
    Architecture,
    Between,
    BetweenByRule,
    InstanceType,
    LambdaMemoryMiB,
    LambdaPackage,
    OneOf,
    S3Prefix,
    Schedule,
    TimeZone,
    TransformInstanceType,
    _fail,
)
from servestack.spec.blocks import GpuSettings, Strategy, _DeploymentBase, check_gpu


class ServerlessDeployment(_DeploymentBase):
    mode: Literal["serverless"]
    memory_mib: LambdaMemoryMiB = 2048
    # API Gateway HTTP APIs cut integrations at 30 s, aws-cdk-lib at 29 (the constructs allow the same range).
    timeout_sec: Annotated[int, Between(1, HTTP_API_TIMEOUT_SEC)] = 15
    architecture: Architecture = "x86_64"
    lambda_package: LambdaPackage = "auto"
    reserved_concurrency: Annotated[int, Between(1, 10_000)] | None = None
    provisioned_concurrency_min: Annotated[int, Between(0, 10_000)] = 0
    provisioned_concurrency_max: Annotated[int, Between(0, 10_000)] = 0
    provisioned_utilization_percent: Annotated[int, Between(10, 90)] = 70
    throttle_rate_per_sec: Annotated[int, Between(1, 10_000)] = 100
    throttle_burst: Annotated[int, Between(1, 5_000)] = 200
    strategy: Strategy = Strategy()

    @classmethod
    def engine_of(cls, data: Mapping[str, Any]) -> EngineLimit:
        return LAMBDA_SYNC  # API Gateway invokes the function synchronously

    @model_validator(mode="after")
    def _coherent(self) -> Self:
        lo, hi = self.provisioned_concurrency_min, self.provisioned_concurrency_max
        if lo > hi:
            _fail("provisioned_concurrency_min", lo, f"<= provisioned_concurrency_max ({hi})")
        if hi > lo and lo < 1:
            _fail(
                "provisioned_concurrency_min",
                lo,
                "in 1..10000 when autoscaling (provisioned_concurrency_max > min)",
            )
        if self.reserved_concurrency is not None and self.reserved_concurrency < hi:
            _fail("reserved_concurrency", self.reserved_concurrency, f">= provisioned_concurrency_max ({hi})")
        return self


class AsyncDeployment(_DeploymentBase):
    mode: Literal["async"]
    backend: Literal["lambda", "sagemaker"] = "lambda"
    batch_size: Annotated[int, Between(1, 10_000)] = 10
    batch_window_sec: Annotated[int, Between(0, 300)] = 1
    max_receive_count: Annotated[int, Between(1, 1000)] = 3
    max_concurrency: Annotated[int, Between(2, 1000)] = 10
    memory_mib: LambdaMemoryMiB = 2048
    timeout_sec: Annotated[int, Between(1, 900)] = 120
    architecture: Architecture = "x86_64"
    lambda_package: LambdaPackage = "auto"
    result_ttl_days: Annotated[int, Between(1, 365)] = 7
    presign_threshold_bytes: Annotated[int, Between(1, 6_291_456)] = 262_144
    # backend: sagemaker
    instance_type: InstanceType = "ml.g5.xlarge"
    max_instances: Annotated[int, Between(1, 100)] = 2
    target_backlog_per_instance: Annotated[int, Between(1, 10_000)] = 5
    gpu: GpuSettings | None = Field(default=None, description="backend: sagemaker on a GPU type: provider, fp16")

    @classmethod
    def engine_of(cls, data: Mapping[str, Any]) -> EngineLimit:
        # The Lambda backend's submit is a synchronous invocation, and its worker runs the same runtime and limit.
        return SAGEMAKER_ASYNC if data.get("backend") == "sagemaker" else LAMBDA_SYNC

    @model_validator(mode="after")
    def _coherent(self) -> Self:
        if self.batch_size > 10 and self.batch_window_sec < 1:
            _fail("batch_window_sec", self.batch_window_sec, "in 1..300 when batch_size > 10 (an SQS rule)")
        if self.capture is not None and self.backend == "sagemaker":
            _fail(
                "capture",
                "a capture block",
                "combinable with backend: sagemaker in servestack yet (its container does not know the job id a "
                "record carries); use backend: lambda",
            )
        check_gpu(
            self.gpu,
            self.instance_type,
            runs_on_instances=self.backend == "sagemaker",
            instead="backend: sagemaker on a GPU instance type (the Lambda backend has no GPU)",
        )
        return self


class BatchDeployment(_DeploymentBase):
    mode: Literal["batch"]
    schedule: Schedule = "cron(0 3 * * ? *)"
    timezone: TimeZone = "UTC"
    input_prefix: S3Prefix | None = Field(default=None, description="default batch/<deployment>/input/")
    output_prefix: S3Prefix | None = Field(default=None, description="default batch/<deployment>/output/")
    # Where a run executes: one Lambda invocation, one Fargate task, or a SageMaker Batch Transform job over
    # `instance_count` instances of the realtime image (`engine:` is accepted as another name for it).
    runner: Literal["lambda", "fargate", "transform"] = "lambda"

    # Input: by default every .jsonl/.ndjson/.json, .csv and .parquet object under the input prefix (a
    # transform job has one content type: jsonl unless set). Output parts: JSON Lines, or Parquet.
    input_format: Literal["jsonl", "csv", "parquet"] | None = None
    output_format: Literal["jsonl", "parquet"] = "jsonl"
    memory_mib: LambdaMemoryMiB = 2048
    timeout_sec: Annotated[int, Between(1, 900)] = 900
    architecture: Architecture = "x86_64"
    lambda_package: LambdaPackage = "auto"
    fargate_cpu: Annotated[int, OneOf((256, 512, 1024, 2048, 4096, 8192, 16384))] = 1024
    fargate_memory_mib: Annotated[int, Between(512, 122_880)] = 4096
    retry_attempts: Annotated[int, Between(0, 185)] = 2
    max_event_age_sec: Annotated[int, Between(60, 86_400)] = 3600
    # runner: transform (SageMaker's CreateTransformJob limits: MaxPayloadInMB 0..100, instance count >= 1)
    instance_type: TransformInstanceType = "ml.m5.xlarge"
    instance_count: Annotated[int, Between(1, 100)] = 1
    max_payload_mb: Annotated[int, BetweenByRule(1, 100, TRANSFORM_PAYLOAD_RULE)] = 6
    max_concurrent_transforms: Annotated[int, Between(1, 64)] = 2
    transform_timeout_sec: Annotated[int, Between(1, 3600)] = 600
    # A column of the input copied to each output row, to join predictions back (a model with named columns);
    # without it a row is known by its file and line. Not with runner: transform (the container answers lines).
    id_column: Annotated[str, Field(min_length=1, max_length=255)] | None = None
    # A longer input line is an error row, never read whole: 1 MiB keeps a record's parse ~1% of a job's memory.
    max_record_bytes: Annotated[int, Between(1024, 64 * 1024 * 1024)] = 1024 * 1024
    # Refused while Batch Transform has no host AMI with a driver the GPU image runs on (gpu_families.py).
    gpu: GpuSettings | None = Field(default=None, description="runner: transform on a GPU type: provider, fp16")

    @classmethod
    def engine_of(cls, data: Mapping[str, Any]) -> EngineLimit:
        # Every runner's runtime keeps Lambda's synchronous cap; a transform job's mini-batches are MaxPayloadInMB's.
        return LAMBDA_SYNC

    @model_validator(mode="before")
    @classmethod
    def _engine_is_runner(cls, data: Any) -> Any:
        """`engine:` (the issue's word) and `runner:` name the same field; both at once is ambiguous."""
        if isinstance(data, Mapping) and "engine" in data:
            if "runner" in data:
                _fail("engine", repr(data["engine"]), "allowed together with runner: (they name the same field)")
            data = {("runner" if key == "engine" else key): value for key, value in data.items()}
        return data

    def _monitor_refusal(self) -> str | None:
        """The check reads the runs' JSON Lines and CSV inputs and JSON Lines parts (servestack/monitor/batch_runs.py),
        joined by file and line."""
        if self.runner == "transform":
            return (
                "usable with runner: transform yet (a transform job's answers hold no file and line to join them to "
                "the rows they scored); use runner: lambda or fargate"
            )
        parquet = [f"{key}: parquet" for key in ("input_format", "output_format") if getattr(self, key) == "parquet"]
        if parquet:
            return (
                f"usable with {' and '.join(parquet)} (the check's function reads the runs' objects without pyarrow, "
                "left out of its bundle to stay under Lambda's size limit: JSON Lines and CSV inputs, JSON Lines "
                "parts); write jsonl or csv input and jsonl output to monitor this deployment"
            )
        return None

    @model_validator(mode="after")
    def _coherent(self) -> Self:
        # pyarrow alone is ~165 MB installed: the Lambda bundle (<= 150 MB unzipped, servestack/cdk/bundling.py) leaves
        # it out, so Parquet needs the container image.
        parquet = "Parquet needs pyarrow, which the Lambda bundle leaves out to stay under 150 MB"
        if self.runner == "lambda" and self.input_format == "parquet":
            _fail("input_format", "'parquet'", f"readable with runner: lambda ({parquet}); use runner: fargate")
        if self.runner == "lambda" and self.output_format == "parquet":
            _fail("output_format", "'parquet'", f"writable with runner: lambda ({parquet}); use runner: fargate")
        if self.runner == "transform" and self.input_format == "parquet":
            _fail(
                "input_format",
                "'parquet'",
                "readable with runner: transform (Batch Transform splits input at lines: SplitType Line); "
                "use runner: fargate, or jsonl or csv",
            )
        if self.runner == "transform" and self.id_column is not None:
            _fail(
                "id_column",
                repr(self.id_column),
                "allowed with runner: transform (the realtime container answers each line in order; rows are known "
                "by file and line); use runner: lambda or fargate",
            )
        reserved = ("file", "line", "error", "prediction", "label", "probabilities")
        if self.id_column is not None and (self.id_column in reserved or self.id_column.startswith("proba_")):
            _fail("id_column", repr(self.id_column), f"one of the output's own fields ({', '.join(reserved)}, proba_*)")
        if self.runner == "transform" and self.output_format == "parquet":
            _fail(
                "output_format",
                "'parquet'",
                "writable with runner: transform (Batch Transform assembles answers as lines); use runner: fargate",
            )
        if self.runner == "transform" and self.max_concurrent_transforms * self.max_payload_mb > 100:
            _fail(
                "max_concurrent_transforms",
                f"{self.max_concurrent_transforms} x max_payload_mb {self.max_payload_mb} = "
                f"{self.max_concurrent_transforms * self.max_payload_mb} MB",
                f"<= 100 MB; {TRANSFORM_PAYLOAD_RULE}",
            )
        no_gpu_transform = transform_refusal()
        check_gpu(
            self.gpu,
            self.instance_type,
            runs_on_instances=self.runner == "transform" and no_gpu_transform is None,
            instead=(
                "runner: transform on a GPU instance type (Lambda and Fargate have no GPU)"
                if no_gpu_transform is None
                else "no batch runner has a GPU (Lambda and Fargate have none, and Batch Transform runs on CPU "
                "types: its GPU host AMIs' NVIDIA drivers are older than 580, which the GPU image's CUDA 13 "
                "needs); remove gpu:, or serve the model on a GPU with mode: async (backend: sagemaker) or mode: "
                "realtime"
            ),
        )
        if self.runner == "fargate":
            self._fargate_coherent()
        if self.capture is not None:
            self._capture_coherent()
        return self

    def _capture_coherent(self) -> None:
        """A run's input and output objects are its capture (docs/monitoring.md): every row of them, as written."""
        assert self.capture is not None
        if self.capture.exclude_columns:
            _fail(
                "capture.exclude_columns",
                self.capture.exclude_columns,
                "usable in batch mode (its capture is the run's own input objects, which hold every column)",
            )
        if self.capture.sample_percent != 100:
            _fail(
                "capture.sample_percent",
                self.capture.sample_percent,
                "other than 100 in batch mode (its capture is the run's own input and output objects, whole)",
            )

    def _fargate_coherent(self) -> None:
        choices = fargate_memory_choices(self.fargate_cpu)
        if self.fargate_memory_mib not in choices:
            lo, hi, step = FARGATE_MEMORY_MIB[self.fargate_cpu]
            allowed = ", ".join(map(str, choices)) if len(choices) <= 8 else f"{lo}..{hi} in steps of {step}"
            _fail(
                "fargate_memory_mib",
                self.fargate_memory_mib,
                f"a memory size Fargate allows with fargate_cpu: {self.fargate_cpu} ({allowed} MiB); "
                f"{FARGATE_SIZE_RULE}",
            )
