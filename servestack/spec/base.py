"""The ground every block of `serving.yaml` stands on: `SpecError`, the constrained scalar types (names, versions,
instance types, ranges whose errors name their bounds...) and `Strict`, the base of every block.

Must not import aws_cdk (the CLI imports the spec).
"""

from __future__ import annotations

import re
import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, GetCoreSchemaHandler, model_validator
from pydantic_core import PydanticCustomError, core_schema

from servestack.aws_rules import AwsRule
from servestack.gpu_families import gpu_family, image_refusal, runs_the_image, transform_refusal
from servestack.instance_types import KnownInstanceType, known

DNS_NAME = re.compile(r"^[a-z]([a-z0-9-]{0,30}[a-z0-9])?$")
VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,31}$")
# NVIDIA GPU families (ml.g4dn, ml.g5, ml.g6, ml.p4d, ml.p5...): the GPU image, onnxruntime with CUDA; which of
# them it runs on is servestack/gpu_families.py's table.
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


# The kept list of Batch Transform's instance types: its GPU types run on Transform's own host AMIs
# (TransformAmiVersion), not the endpoints' (servestack/gpu_families.py).
TRANSFORM_ENUM = "TransformInstanceType"


def runnable_gpu_families(enum: str) -> list[str]:
    """`ml.<family>.*` of each GPU family in the kept list of `enum` that servestack's GPU image runs on."""
    if enum == TRANSFORM_ENUM and transform_refusal() is not None:
        return []
    families = {gpu_family(t) for t in known(enum)}
    return sorted(f"ml.{f.family}.*" for f in families if f is not None and runs_the_image(f))


@dataclass(frozen=True)
class AcceleratorRules:
    """A pydantic validator: refuses the accelerators servestack's images cannot use (AWS Neuron; a GPU the GPU
    image has no kernels for, or whose CPUs it is not built for: servestack/gpu_families.py; any GPU in Batch
    Transform while none of its host AMIs has a driver the GPU image runs on), naming the GPU types of `enum`
    it runs on."""

    enum: str

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self._check, handler(source))

    def _check(self, value: str) -> str:
        if NEURON_FAMILY.match(value):
            raise PydanticCustomError(
                "neuron_instance",
                "{value} is not supported: Inferentia and Trainium instances run models compiled for AWS Neuron, "
                "which onnxruntime cannot use; choose a GPU type (ml.g*, ml.p*) or a CPU type (ml.c*, ml.m*, "
                "ml.r*...)",
                {"value": repr(value)},
            )
        family = gpu_family(value)
        reason: str | None = None
        if family is None and GPU_FAMILY.match(value):
            # A GPU family botocore lists (after a refresh of the kept list) that the table does not know yet:
            # refused, not guessed (tests/unit/test_gpu_families.py keeps the two in step).
            reason = "servestack does not know its GPU (add its family to servestack/gpu_families.py)"
        elif family is not None:
            reason = image_refusal(family)
        if reason is not None:
            raise PydanticCustomError(
                "gpu_not_runnable",
                "{value} is not supported: {reason}; choose {choices}",
                {"value": repr(value), "reason": reason, "choices": self._choices()},
            )
        transform = transform_refusal() if self.enum == TRANSFORM_ENUM and uses_gpu(value) else None
        if transform is not None:
            raise PydanticCustomError(
                "gpu_transform",
                "{value} is not supported for Batch Transform: {reason}; choose a CPU type (ml.c*, ml.m*, ml.r*...) "
                "for Batch Transform, or serve the model on a GPU with mode: async (backend: sagemaker) or mode: "
                "realtime",
                {"value": repr(value), "reason": transform},
            )
        return value

    def _choices(self) -> str:
        families = runnable_gpu_families(self.enum)
        cpu = "a CPU type (ml.c*, ml.m*, ml.r*...)"
        return f"a GPU type the image runs on ({', '.join(families)}) or {cpu}" if families else cpu


def _to_str(value: Any) -> Any:
    # YAML reads `version: 1` as an int; versions are labels.
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


Name = Annotated[str, Matches(DNS_NAME, "a DNS-style name (a-z, 0-9, '-', starts with a letter, <= 32 chars)")]
Version = Annotated[str, BeforeValidator(_to_str), Matches(VERSION, "a version label (letters, digits, '.', '_', '-')")]
# Instance types: checked against the list kept in servestack/data/ (servestack/instance_types.py says where it
# comes from and how to refresh it), with the nearest names suggested; then the accelerator rules.
InstanceType = Annotated[
    str, KnownInstanceType("ProductionVariantInstanceType"), AcceleratorRules("ProductionVariantInstanceType")
]
TransformInstanceType = Annotated[
    str, KnownInstanceType("TransformInstanceType"), AcceleratorRules("TransformInstanceType")
]
S3Prefix = Annotated[str, Matches(S3_PREFIX, "an S3 key prefix ending in '/' without a leading '/'")]
Schedule = Annotated[str, Matches(SCHEDULE, "'cron(<6 fields>)' or 'rate(<n> minutes|hours|days)'")]
TimeZone = Annotated[str, BeforeValidator(_check_timezone)]
Percent = Annotated[int, Between(1, 99)]
Architecture = Literal["x86_64", "arm64"]
# How a Lambda function ships: `auto` is a zip bundle while the model packages and servestack's runtime fit
# Lambda's 250 MB unzipped limit, else a container image (up to 10 GB); `zip` or `image` forces one.
LambdaPackage = Literal["auto", "zip", "image"]
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


def _fail(field: str, value: object, allowed: str) -> None:
    raise PydanticCustomError(
        "incoherent", "{value} is not {allowed}", {"field": field, "value": value, "allowed": allowed}
    )
