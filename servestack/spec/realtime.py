"""Realtime mode's deployment (a SageMaker endpoint) and its parts: A/B variants, a shadow variant, Serverless
Inference, inference components; with what SageMaker refuses of their combinations."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, Self

from pydantic import Field, model_validator

from servestack.aws_rules import SAGEMAKER_REALTIME, SAGEMAKER_SERVERLESS, SERVERLESS_EXCLUSIONS_RULE, EngineLimit
from servestack.instance_types import instance_shape
from servestack.spec.base import Between, InstanceType, Name, OneOf, Strict, Version, _fail, _num, uses_gpu
from servestack.spec.blocks import GpuSettings, Strategy, _DeploymentBase


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
    gpu: GpuSettings | None = Field(default=None, description="GPU instance types only: the GPU provider and fp16")

    @classmethod
    def engine_of(cls, data: Mapping[str, Any]) -> EngineLimit:
        return SAGEMAKER_SERVERLESS if data.get("serverless") is not None else SAGEMAKER_REALTIME

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
        if self.gpu is not None:
            self._gpu_coherent()
        if self.multi_model and uses_gpu(self.instance_type):
            _fail(
                "instance_type",
                repr(self.instance_type),
                "a CPU instance type (ml.c*, ml.m*, ml.r*...) with multi_model: true: SageMaker runs custom "
                "multi-model containers on CPU instances only (GPU multi-model endpoints need its Triton container)",
            )
        return self

    def _gpu_coherent(self) -> None:
        """`gpu:` sets the GPU image's provider: every instance type of the deployment must be a GPU one, as a CPU
        instance runs the CPU image, which has neither CUDA nor TensorRT."""
        if self.serverless is not None:
            _fail("gpu", "a gpu block", "combinable with serverless (SageMaker Serverless Inference has no GPU)")
        chosen: list[tuple[str, str | None]] = [("instance_type", self.instance_type)]
        chosen += [(f"variants.{i}.instance_type", v.instance_type) for i, v in enumerate(self.variants)]
        chosen += [("shadow.instance_type", self.shadow.instance_type)] if self.shadow is not None else []
        for where, itype in chosen:
            if itype is not None and not uses_gpu(itype):
                _fail(
                    where,
                    repr(itype),
                    "a GPU instance type (ml.g*, ml.p*) with gpu: set: a CPU instance runs the CPU image, without "
                    "CUDA or TensorRT (remove gpu:, or choose a GPU type)",
                )

    def _serverless_coherent(self) -> None:
        """What Serverless Inference excludes, of what the spec can express (servestack sets no VPC or Model
        Monitor, and leaves network isolation off for serverless variants: servestack/cdk/realtime.py)."""
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
        if self.capture is not None:
            _fail("capture", "a capture block", f"combinable with serverless; {SERVERLESS_EXCLUSIONS_RULE}")
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
        if self.capture is not None:
            _fail(
                "capture",
                "a capture block",
                "combinable with components in servestack yet (capture an instance-based endpoint without components)",
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
