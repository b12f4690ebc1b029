"""The schema of `serving.yaml`: which models exist and how each deployment serves them.

`load_spec(path)` reads and validates the file. Every problem is reported at once, one line each, as
`<dotted path>: <value> is not <allowed>`, e.g.
`deployments.fraud-api.strategy.canary_percent: 150 is not in 1..99`. Unknown keys are rejected.

This module must not import aws_cdk: the CLI imports it and has to start fast.
"""

from __future__ import annotations

import re
import zoneinfo
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Self

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError, core_schema

from servestack.aws_rules import (
    ALARM_PERIOD_RULE,
    FARGATE_ARM64_RULE,
    FARGATE_MEMORY_MIB,
    FARGATE_SIZE_RULE,
    SERVERLESS_EXCLUSIONS_RULE,
    TRANSFORM_PAYLOAD_RULE,
    AwsRule,
    fargate_memory_choices,
)
from servestack.instance_types import KnownInstanceType, instance_shape

__all__ = [
    "MODES",
    "AlarmSettings",
    "AsyncDeployment",
    "BatchDeployment",
    "Batching",
    "Component",
    "Deployment",
    "ModelSpec",
    "RealtimeDeployment",
    "RealtimeServerless",
    "ServerlessDeployment",
    "ServingSpec",
    "ShadowVariant",
    "SpecError",
    "Strategy",
    "Variant",
    "load_spec",
    "parse_spec",
    "uses_gpu",
]

MODES = ("realtime", "serverless", "async", "batch")
DNS_NAME = re.compile(r"^[a-z]([a-z0-9-]{0,30}[a-z0-9])?$")
VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,31}$")
# NVIDIA GPU families (ml.g4dn, ml.g5, ml.g6, ml.p3, ml.p4d, ml.p5...): the GPU image, onnxruntime with CUDA.
GPU_FAMILY = re.compile(r"^ml\.[gp]\d")
# AWS Inferentia/Trainium (ml.inf1, ml.inf2, ml.trn1...): they run models compiled for AWS Neuron.
NEURON_FAMILY = re.compile(r"^ml\.(inf|trn)\d")
S3_PREFIX = re.compile(r"^[A-Za-z0-9!_.*'()/-]+/$")
SCHEDULE = re.compile(r"^(cron\((\S+ ){5}\S+\)|rate\(\d+ (minute|minutes|hour|hours|day|days)\))$")
# CloudWatch Logs accepts only these retention periods.
LOG_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 3653)


class SpecError(ValueError):
    """`serving.yaml` is invalid; `problems` holds one `<path>: <value> is not <allowed>` line each."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  {p}" for p in problems)
        super().__init__(f"{source}: {len(problems)} problem(s)\n{lines}")


# --- constrained scalar types ---------------------------------------------------------------------


@dataclass(frozen=True)
class Between:
    """Inclusive numeric range whose error names both bounds (`150 is not in 1..99`)."""

    lo: float
    hi: float

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self._check, handler(source))

    def _check(self, value: float) -> float:
        if not self.lo <= value <= self.hi:
            raise PydanticCustomError(
                "out_of_range",
                "{value} is not in {lo}..{hi}",
                {"value": _num(value), "lo": _num(self.lo), "hi": _num(self.hi)},
            )
        return value


@dataclass(frozen=True)
class OneOf:
    """Value restricted to a fixed set of numbers (CloudWatch retention days, Fargate CPU units...)."""

    allowed: tuple[int, ...]

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self._check, handler(source))

    def _check(self, value: int) -> int:
        if value not in self.allowed:
            allowed = ", ".join(str(a) for a in self.allowed)
            raise PydanticCustomError(
                "not_allowed", "{value} is not one of {allowed}", {"value": value, "allowed": allowed}
            )
        return value


@dataclass(frozen=True)
class Matches:
    """String matching a pattern; the error says in words what is allowed."""

    pattern: re.Pattern[str]
    allowed: str

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self._check, handler(source))

    def _check(self, value: str) -> str:
        if not self.pattern.fullmatch(value):
            raise PydanticCustomError(
                "bad_format", "{value} is not {allowed}", {"value": repr(value), "allowed": self.allowed}
            )
        return value


@dataclass(frozen=True)
class BetweenByRule(Between):
    """A range AWS sets; the error quotes its rule."""

    rule: AwsRule

    def _check(self, value: float) -> float:
        if not self.lo <= value <= self.hi:
            raise PydanticCustomError(
                "out_of_range",
                "{value} is not in {lo}..{hi}; {rule}",
                {"value": _num(value), "lo": _num(self.lo), "hi": _num(self.hi), "rule": str(self.rule)},
            )
        return value


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _check_timezone(value: str) -> str:
    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise PydanticCustomError(
            "bad_timezone",
            "{value} is not an IANA time zone such as 'UTC' or 'Europe/Paris'",
            {"value": repr(value)},
        ) from None
    return value


def uses_gpu(instance_type: str) -> bool:
    """Whether an instance type has NVIDIA GPUs, so its container is the GPU image
    (servestack/cdk/containers/gpu.Dockerfile); every other accepted type runs the CPU image
    (servestack/cdk/containers/cpu.Dockerfile)."""
    return GPU_FAMILY.match(instance_type) is not None


def _check_accelerator(value: str) -> str:
    if NEURON_FAMILY.match(value):
        raise PydanticCustomError(
            "neuron_instance",
            "{value} is not supported: Inferentia and Trainium instances run models compiled for AWS Neuron, "
            "which onnxruntime cannot use; choose a GPU type (ml.g*, ml.p*) or a CPU type (ml.c*, ml.m*, ml.r*...)",
            {"value": repr(value)},
        )
    return value


def _to_str(value: Any) -> Any:
    # YAML reads `version: 1` as an int; versions are labels.
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


Name = Annotated[str, Matches(DNS_NAME, "a DNS-style name (a-z, 0-9, '-', starts with a letter, <= 32 chars)")]
Version = Annotated[str, BeforeValidator(_to_str), Matches(VERSION, "a version label (letters, digits, '.', '_', '-')")]
# Instance types: checked against the list kept in servestack/data/ (servestack/instance_types.py says where it
# comes from and how to refresh it), with the nearest names suggested; then the accelerator rules.
InstanceType = Annotated[str, KnownInstanceType("ProductionVariantInstanceType"), AfterValidator(_check_accelerator)]
TransformInstanceType = Annotated[str, KnownInstanceType("TransformInstanceType"), AfterValidator(_check_accelerator)]
S3Prefix = Annotated[str, Matches(S3_PREFIX, "an S3 key prefix ending in '/' without a leading '/'")]
Schedule = Annotated[str, Matches(SCHEDULE, "'cron(<6 fields>)' or 'rate(<n> minutes|hours|days)'")]
TimeZone = Annotated[str, BeforeValidator(_check_timezone)]
Percent = Annotated[int, Between(1, 99)]
Architecture = Literal["x86_64", "arm64"]
LambdaMemoryMiB = Annotated[int, Between(128, 10240)]
LogRetentionDays = Annotated[int, OneOf(LOG_RETENTION_DAYS)]


class Strict(BaseModel):
    """Base of every block: frozen, and unknown keys are errors that list the known ones."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            unknown = [str(k) for k in data if k not in cls.model_fields]
            if unknown:
                raise PydanticCustomError(
                    "unknown_key",
                    "unknown key is not one of {allowed}",
                    {"keys": unknown, "allowed": ", ".join(cls.model_fields)},
                )
        return data


# --- blocks shared by deployments ------------------------------------------------------------------


class ModelSpec(Strict):
    """A model artifact: `<path>/{model.onnx,manifest.json,sample-request.json,sample-response.json}`."""

    name: Name
    version: Version
    path: str | None = Field(default=None, description="default models/artifacts/<name>/<version>")

    @property
    def artifact_path(self) -> str:
        return self.path or f"models/artifacts/{self.name}/{self.version}"

    @property
    def key(self) -> str:
        return f"{self.name}@{self.version}"


class Strategy(Strict):
    """How a new release takes traffic. `bake_minutes` is how long the old fleet is kept after the shift."""

    type: Literal["all_at_once", "canary", "linear"] = "canary"
    canary_percent: Percent = 10
    linear_step_percent: Percent = 20
    interval_minutes: Annotated[int, Between(1, 60)] = 5
    bake_minutes: Annotated[int, Between(0, 60)] = 10

    @property
    def steps(self) -> int:
        """Number of wait intervals before all traffic is on the new release."""
        if self.type == "canary":
            return 1
        if self.type == "linear":
            return -(-100 // self.linear_step_percent) - 1
        return 0


class AlarmSettings(Strict):
    """Thresholds of the alarms that guard a deployment (and roll a bad release back)."""

    error_rate_percent: Annotated[float, Between(0.01, 100)] = 1.0
    p99_latency_ms: Annotated[int, Between(1, 900_000)] = 500
    evaluation_periods: Annotated[int, Between(1, 30)] = 3
    period_sec: Annotated[int, OneOf((10, 20, 30, 60, 300, 900, 3600))] = 60
    oldest_message_age_sec: Annotated[int, Between(60, 1_209_600)] = 900
    # Realtime: a period with more 429s than this counts as overloaded; `evaluation_periods` of them in a row
    # fire the overload alarm (operational only: overload does not roll a release back).
    overload_429_per_period: Annotated[int, Between(0, 1_000_000)] = 0

    @model_validator(mode="after")
    def _period_has_data(self) -> Self:
        # Every alarm of a deployment shares this period, and all but the overload alarm watch AWS's own 1-minute
        # metrics: a sub-minute period there is refused rather than made high-resolution.
        if self.period_sec < 60:
            _fail("period_sec", self.period_sec, f"60 or more (a multiple of 60); {ALARM_PERIOD_RULE}")
        return self


class Batching(Strict):
    """Server-side micro-batching and admission (realtime server): `max_queue` requests per worker are admitted;
    past it the answer is 429 with Retry-After."""

    max_batch_size: Annotated[int, Between(1, 4096)] = 512
    max_delay_ms: Annotated[int, Between(0, 1000)] = 0
    max_queue: Annotated[int, Between(1, 1_000_000)] = 64


class _DeploymentBase(Strict):
    model: Name
    version: Version | None = Field(default=None, description="default: the only declared version of `model`")
    alarms: AlarmSettings = AlarmSettings()
    batching: Batching = Batching()
    max_payload_bytes: Annotated[int, Between(1, 6_291_456)] = 6_291_456  # SageMaker real-time and Lambda sync: 6 MB
    log_retention_days: LogRetentionDays = 30


# --- modes ------------------------------------------------------------------------------------------


class Variant(Strict):
    """A production variant of a realtime endpoint; traffic splits by `weight` (A/B)."""

    name: Name
    model: Name
    version: Version | None = None
    weight: Annotated[int, Between(1, 1000)] = 1
    instance_type: InstanceType | None = None


class ShadowVariant(Strict):
    """A variant that gets a copy of `sample_percent` % of the requests; its answers are discarded."""

    name: Name = "shadow"
    model: Name
    version: Version | None = None
    sample_percent: Annotated[int, Between(1, 100)] = 10
    instance_type: InstanceType | None = None


class RealtimeServerless(Strict):
    """SageMaker Serverless Inference instead of instances (CPU only; no GPU)."""

    memory_mib: Annotated[int, OneOf((1024, 2048, 3072, 4096, 5120, 6144))] = 2048
    max_concurrency: Annotated[int, Between(1, 200)] = 20


class Component(Strict):
    """A model placed on a realtime endpoint as a SageMaker inference component: its own share of each instance
    (CPU cores, accelerators, memory), its own copies, scaled on their own (to zero too), and invoked by name
    (`InferenceComponentName`). The component is named `<endpoint name>-<name>` in the templates."""

    name: Name | None = Field(default=None, description="default: the model's name")
    model: Name
    version: Version | None = None
    # InferenceComponentComputeResourceRequirements (SageMaker API reference): cores >= 0.25, accelerators >= 1
    # when set (0 here leaves them out), memory >= 128 MB.
    cpu_cores: Annotated[float, Between(0.25, 192)] = 1.0
    accelerators: Annotated[int, Between(0, 16)] = 0
    memory_mib: Annotated[int, Between(128, 2_097_152)] = 1024
    copies: Annotated[int, Between(0, 1000)] = 1
    min_copies: Annotated[int, Between(0, 1000)] = 1
    max_copies: Annotated[int, Between(1, 1000)] = 2
    target_invocations_per_copy: Annotated[int, Between(1, 1_000_000)] = 1000

    @property
    def component_name(self) -> str:
        return self.name or self.model

    @model_validator(mode="after")
    def _coherent(self) -> Self:
        if self.copies < 1:
            _fail(
                "copies",
                self.copies,
                "in 1..1000: SageMaker creates a component with at least one copy (min_copies: 0 lets autoscaling "
                "take it to zero afterwards)",
            )
        if self.min_copies > self.max_copies:
            _fail("min_copies", self.min_copies, f"<= max_copies ({self.max_copies})")
        if not self.min_copies <= self.copies <= self.max_copies:
            _fail("copies", self.copies, f"in min_copies..max_copies ({self.min_copies}..{self.max_copies})")
        return self


class RealtimeDeployment(_DeploymentBase):
    mode: Literal["realtime"]
    instance_type: InstanceType = "ml.g5.xlarge"
    min_instances: Annotated[int, Between(1, 100)] = 1
    max_instances: Annotated[int, Between(1, 100)] = 2
    target_invocations_per_instance: Annotated[int, Between(1, 1_000_000)] = 1000
    strategy: Strategy = Strategy()
    variants: list[Variant] = Field(default_factory=list, description="default: one variant 'primary' of `model`")
    shadow: ShadowVariant | None = None
    serverless: RealtimeServerless | None = None
    multi_model: bool = False
    components: list[Component] = Field(
        default_factory=list, description="several models on one endpoint, each an inference component"
    )

    @model_validator(mode="before")
    @classmethod
    def _model_from_components(cls, data: Any) -> Any:
        """With components, `model` (the deployment's sample and description) defaults to the first one's."""
        if isinstance(data, Mapping) and "model" not in data:
            components = data.get("components")
            if isinstance(components, list) and components and isinstance(components[0], Mapping):
                first = components[0]
                if "model" in first:
                    data = {**data, "model": first["model"]}
                    if "version" in first and "version" not in data:
                        data["version"] = first["version"]
        return data

    @model_validator(mode="after")
    def _coherent(self) -> Self:
        if self.components:
            self._components_coherent()
        if self.min_instances > self.max_instances:
            _fail("min_instances", self.min_instances, f"<= max_instances ({self.max_instances})")
        names = [v.name for v in self.variants] + ([self.shadow.name] if self.shadow else [])
        for name in names:
            if names.count(name) > 1:
                _fail("variants", repr(name), "a unique variant name")
        if self.shadow and len(self.variants) > 1:
            _fail("shadow", "a shadow variant", "combinable with more than one production variant")
        if self.serverless:
            self._serverless_coherent()
        if self.multi_model and (self.variants or self.shadow):
            _fail("multi_model", "true", "combinable with variants or shadow")
        if self.multi_model and uses_gpu(self.instance_type):
            _fail(
                "instance_type",
                repr(self.instance_type),
                "a CPU instance type (ml.c*, ml.m*, ml.r*...) with multi_model: true: SageMaker runs custom "
                "multi-model containers on CPU instances only (GPU multi-model endpoints need its Triton container)",
            )
        return self

    def _serverless_coherent(self) -> None:
        """What Serverless Inference excludes, of what the spec can express (servestack sets no VPC, data capture
        or Model Monitor, and leaves network isolation off for serverless variants: servestack/cdk/realtime.py)."""
        if self.shadow:
            _fail(
                "shadow",
                "a shadow variant",
                f"supported with serverless (a shadow is a second production variant); {SERVERLESS_EXCLUSIONS_RULE}",
            )
        if len(self.variants) > 1:
            _fail(
                "variants",
                f"{len(self.variants)} variants",
                f"allowed with serverless (one variant at most); {SERVERLESS_EXCLUSIONS_RULE}",
            )
        if self.multi_model:
            _fail("multi_model", "true", f"combinable with serverless; {SERVERLESS_EXCLUSIONS_RULE}")
        # The deployment's own instance_type (default ml.g5.xlarge) is unused with serverless; refuse it only when
        # set, as one set to a GPU type says the user expects a GPU.
        chosen: list[tuple[str, str | None]] = (
            [("instance_type", self.instance_type)] if "instance_type" in self.model_fields_set else []
        )
        chosen += [(f"variants.{i}.instance_type", v.instance_type) for i, v in enumerate(self.variants)]
        for where, itype in chosen:
            if itype is not None and uses_gpu(itype):
                _fail(where, repr(itype), f"usable with serverless (CPU only); {SERVERLESS_EXCLUSIONS_RULE}")

    def _components_coherent(self) -> None:
        """What SageMaker refuses for endpoints that host inference components (docs/sagemaker-strictness.md)."""
        if self.serverless:
            _fail(
                "components",
                "inference components",
                "combinable with serverless: SageMaker places inference components on instance-based variants only",
            )
        if self.multi_model:
            _fail("components", "inference components", "combinable with multi_model: true (one model per component)")
        if self.variants or self.shadow:
            _fail(
                "components",
                "inference components",
                "combinable with variants or shadow in servestack (its component endpoints have one variant)",
            )
        if self.model not in {c.model for c in self.components}:
            served = ", ".join(sorted({c.model for c in self.components}))
            _fail("model", repr(self.model), f"one of the components' models ({served}): the endpoint serves only them")
        names = [c.component_name for c in self.components]
        for name in names:
            if names.count(name) > 1:
                _fail("components", repr(name), "a unique component name (set `name` to tell them apart)")
        gpu = uses_gpu(self.instance_type)
        shape = instance_shape(self.instance_type)
        for i, c in enumerate(self.components):
            where = f"components.{i}"
            if c.accelerators and not gpu:
                _fail(
                    f"{where}.accelerators",
                    c.accelerators,
                    f"available on {self.instance_type}, which has no GPU: use 0 or a GPU type (ml.g*, ml.p*)",
                )
            if shape is None:
                continue
            vcpus, gpus = shape
            # SageMaker places each copy on one instance; a copy bigger than an instance is never placed.
            if c.cpu_cores > vcpus:
                _fail(
                    f"{where}.cpu_cores",
                    _num(c.cpu_cores),
                    f"<= the {vcpus} vCPUs of one {self.instance_type} (a copy runs on one instance)",
                )
            if c.accelerators > gpus:
                _fail(
                    f"{where}.accelerators",
                    c.accelerators,
                    f"<= the {gpus} GPU(s) of one {self.instance_type} (a copy runs on one instance)",
                )


class ServerlessDeployment(_DeploymentBase):
    mode: Literal["serverless"]
    memory_mib: LambdaMemoryMiB = 2048
    # API Gateway HTTP APIs cut integrations at 30 s.
    timeout_sec: Annotated[int, Between(1, 30)] = 15
    architecture: Architecture = "x86_64"
    reserved_concurrency: Annotated[int, Between(1, 10_000)] | None = None
    provisioned_concurrency_min: Annotated[int, Between(0, 10_000)] = 0
    provisioned_concurrency_max: Annotated[int, Between(0, 10_000)] = 0
    provisioned_utilization_percent: Annotated[int, Between(10, 90)] = 70
    throttle_rate_per_sec: Annotated[int, Between(1, 10_000)] = 100
    throttle_burst: Annotated[int, Between(1, 5_000)] = 200
    strategy: Strategy = Strategy()

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
    result_ttl_days: Annotated[int, Between(1, 365)] = 7
    presign_threshold_bytes: Annotated[int, Between(1, 6_291_456)] = 262_144
    # backend: sagemaker
    instance_type: InstanceType = "ml.g5.xlarge"
    max_instances: Annotated[int, Between(1, 100)] = 2
    target_backlog_per_instance: Annotated[int, Between(1, 10_000)] = 5

    @model_validator(mode="after")
    def _coherent(self) -> Self:
        if self.batch_size > 10 and self.batch_window_sec < 1:
            _fail("batch_window_sec", self.batch_window_sec, "in 1..300 when batch_size > 10 (an SQS rule)")
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

    @model_validator(mode="before")
    @classmethod
    def _engine_is_runner(cls, data: Any) -> Any:
        """`engine:` (the issue's word) and `runner:` name the same field; both at once is ambiguous."""
        if isinstance(data, Mapping) and "engine" in data:
            if "runner" in data:
                _fail("engine", repr(data["engine"]), "allowed together with runner: (they name the same field)")
            data = {("runner" if key == "engine" else key): value for key, value in data.items()}
        return data

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
        if self.runner == "fargate":
            self._fargate_coherent()
        return self

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
        if self.architecture == "arm64":
            _fail("architecture", "'arm64'", f"available with runner: fargate (use x86_64); {FARGATE_ARM64_RULE}")


Deployment = Annotated[
    RealtimeDeployment | ServerlessDeployment | AsyncDeployment | BatchDeployment,
    Field(discriminator="mode"),
]


class ServingSpec(Strict):
    """The whole `serving.yaml`."""

    models: list[ModelSpec] = Field(min_length=1)
    deployments: dict[Name, Deployment] = Field(min_length=1)

    def model(self, name: str, version: str | None) -> ModelSpec:
        """The declared model `name` (@ `version`, or its only version)."""
        matches = [m for m in self.models if m.name == name and (version is None or m.version == version)]
        if len(matches) != 1:
            raise KeyError(f"{name}@{version or '?'}")
        return matches[0]

    def models_of(self, deployment: str) -> list[ModelSpec]:
        """Every model a deployment serves (its own, then variants', the shadow's, then components')."""
        d = self.deployments[deployment]
        refs: list[tuple[str, str | None]] = [(d.model, d.version)]
        if isinstance(d, RealtimeDeployment):
            refs += [(v.model, v.version) for v in d.variants]
            refs += [(d.shadow.model, d.shadow.version)] if d.shadow else []
            refs += [(c.model, c.version) for c in d.components]
        out: list[ModelSpec] = []
        for name, version in refs:
            m = self.model(name, version)
            if m not in out:
                out.append(m)
        return out


# --- loading ------------------------------------------------------------------------------------


def _fail(field: str, value: object, allowed: str) -> None:
    raise PydanticCustomError(
        "incoherent", "{value} is not {allowed}", {"field": field, "value": value, "allowed": allowed}
    )


def _references(spec: ServingSpec) -> Iterator[str]:
    """Cross-references pydantic cannot see: model names and versions used by deployments."""
    seen: set[str] = set()
    for i, m in enumerate(spec.models):
        if m.key in seen:
            yield f"models.{i}: {m.name}@{m.version} is not unique"
        seen.add(m.key)

    def check(path: str, name: str, version: str | None) -> Iterator[str]:
        versions = [m.version for m in spec.models if m.name == name]
        declared = ", ".join(sorted({m.name for m in spec.models}))
        if not versions:
            yield f"{path}.model: {name!r} is not a declared model ({declared})"
        elif version is None and len(versions) > 1:
            listed = ", ".join(versions)
            yield f"{path}.version: missing is not allowed when {name!r} has several versions ({listed})"
        elif version is not None and version not in versions:
            yield f"{path}.version: {version!r} is not a declared version of {name!r} ({', '.join(versions)})"

    for dname, d in spec.deployments.items():
        base = f"deployments.{dname}"
        yield from check(base, d.model, d.version)
        if isinstance(d, RealtimeDeployment):
            for i, v in enumerate(d.variants):
                yield from check(f"{base}.variants.{i}", v.model, v.version)
            if d.shadow:
                yield from check(f"{base}.shadow", d.shadow.model, d.shadow.version)
            for i, c in enumerate(d.components):
                yield from check(f"{base}.components.{i}", c.model, c.version)


def _format(err: Mapping[str, Any]) -> str:
    loc = [str(p) for p in err["loc"]]
    # Drop the discriminator tag pydantic inserts after `deployments.<name>`.
    if len(loc) >= 3 and loc[0] == "deployments" and loc[2] in MODES:
        del loc[2]
    if loc and loc[-1] == "[key]":
        loc.pop()
    kind = err["type"]
    ctx: Mapping[str, Any] = err.get("ctx") or {}
    value = err.get("input")
    if kind == "unknown_key":
        keys: list[str] = ctx["keys"]
        return "\n".join(f"{_dotted([*loc, k])}: unknown key is not one of {ctx['allowed']}" for k in keys)
    if kind == "incoherent":
        loc.append(ctx["field"])
        return f"{_dotted(loc)}: {err['msg']}"
    if kind in {"union_tag_invalid", "union_tag_not_found"}:
        shown = repr(ctx.get("tag")) if kind == "union_tag_invalid" else "missing"
        return f"{_dotted([*loc, 'mode'])}: {shown} is not one of {', '.join(repr(m) for m in MODES)}"
    if kind == "missing":
        return f"{_dotted(loc)}: missing is not allowed (required)"
    if kind == "literal_error":
        return f"{_dotted(loc)}: {value!r} is not one of {ctx['expected']}"
    msg: str = err["msg"]
    if msg.startswith("Input should be "):
        return f"{_dotted(loc)}: {value!r} is not {msg.removeprefix('Input should be ')}"
    if msg.startswith("Value error, "):
        msg = msg.removeprefix("Value error, ")
    return f"{_dotted(loc)}: {msg}"


def _dotted(loc: list[str]) -> str:
    return ".".join(loc) or "<root>"


def parse_spec(data: object, source: str = "serving.yaml") -> ServingSpec:
    """Validate already-parsed YAML/JSON data; raise `SpecError` listing every problem."""
    try:
        spec = ServingSpec.model_validate(data)
    except ValidationError as exc:
        problems = [_format(e) for e in exc.errors(include_url=False)]
        raise SpecError(source, [line for p in problems for line in p.split("\n")]) from None
    problems = list(_references(spec))
    if problems:
        raise SpecError(source, problems)
    return spec


def load_spec(
    path: str | Path, *, artifacts_root: Path | None = None, bundled: bool = True, check_artifacts: bool = True
) -> ServingSpec:
    """Read and validate `serving.yaml`; raise `SpecError` naming each bad path, value and what is allowed.

    Then (`check_artifacts`) every declared model must have its package under `artifacts_root` (default: the
    folder holding the file), or be a bundled one (`bundled`); each missing one is a problem naming the
    folder and the command that creates it (servestack/artifacts.py)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(str(p), [f"<file>: {exc.strerror or exc} is not readable"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(str(p), [f"<yaml>: {exc} is not valid YAML"]) from None
    if not isinstance(data, dict):
        raise SpecError(str(p), [f"<root>: {type(data).__name__} is not a mapping with models and deployments"])
    spec = parse_spec(data, str(p))
    if check_artifacts:
        from servestack import artifacts

        missing = list(artifacts.problems(spec, artifacts_root or p.resolve().parent, bundled=bundled))
        if missing:
            raise SpecError(str(p), missing)
    return spec
