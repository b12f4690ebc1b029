"""The blocks every deployment of `serving.yaml` shares: the models it names, its release strategy, its alarms,
its batching, and the keys of every mode (`_DeploymentBase`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, Self

from pydantic import Field, model_validator

from servestack.aws_rules import (
    ALARM_PERIOD_RULE,
    LARGEST_PAYLOAD_BYTES,
    SAGEMAKER_ASYNC,
    SAGEMAKER_REALTIME,
    EngineLimit,
)
from servestack.spec.base import (
    Between,
    BetweenByRule,
    LogRetentionDays,
    Name,
    OneOf,
    Percent,
    S3Prefix,
    Schedule,
    Strict,
    TimeZone,
    Version,
    _fail,
    uses_gpu,
)


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


class Capture(Strict):
    """Data capture (docs/monitoring.md): which share of the requests is recorded, what of them, without which
    columns, and where under the deployment's bucket. The same keys in every mode; SageMaker Serverless
    Inference alone cannot capture (realtime `serverless:` refuses the block)."""

    sample_percent: Annotated[float, Between(0, 100)] = 100.0
    what: Literal["inputs", "outputs", "both"] = "both"
    # Personal data: these model inputs (or a pipeline's columns) never reach a captured record.
    exclude_columns: list[str] = Field(default_factory=list)
    prefix: S3Prefix | None = Field(default=None, description="default capture/<deployment>/")

    @model_validator(mode="after")
    def _columns_unique(self) -> Self:
        for name in self.exclude_columns:
            if self.exclude_columns.count(name) > 1:
                _fail("exclude_columns", repr(name), "listed once")
        return self

    def prefix_of(self, deployment: str) -> str:
        return self.prefix or f"capture/{deployment}/"


# The monitor's baseline files the scheduled check reads in its function (servestack/monitor/baseline.py): not
# Parquet, which needs pyarrow, left out of the Lambda bundle to stay under its size limit.
MONITOR_BASELINE_SUFFIXES = (".csv", ".jsonl", ".ndjson", ".json")


class Monitor(Strict):
    """Scheduled drift monitoring (docs/monitoring.md): on `schedule`, the same check as `servestack monitor` over
    the last `window_hours` of the deployment's capture, against `baseline` (a project file; default: the
    package's `baseline.<suffix>`, `models push --sample`), with the command's thresholds and their defaults
    (servestack/monitor/drift.py `Thresholds`, tests/unit/test_spec.py keeps them equal)."""

    schedule: Schedule = "rate(1 day)"
    timezone: TimeZone = "UTC"
    window_hours: Annotated[int, Between(1, 24 * 31)] = 24
    min_rows: Annotated[int, Between(1, 10_000_000)] = 100
    max_psi: Annotated[float, Between(0, 1000)] = 0.2
    max_js: Annotated[float, Between(0, 1)] = 0.1
    max_unseen: Annotated[float, Between(0, 1)] = 0.01
    max_out_of_range: Annotated[float, Between(0, 1)] = 0.05
    max_missing_increase: Annotated[float, Between(0, 1)] = 0.05
    baseline: Annotated[str, Field(min_length=1, max_length=1024)] | None = Field(
        default=None, description="a .csv or .jsonl file of the project (relative to serving.yaml)"
    )

    @model_validator(mode="after")
    def _baseline_readable(self) -> Self:
        if self.baseline is not None and not self.baseline.lower().endswith(MONITOR_BASELINE_SUFFIXES):
            _fail(
                "baseline",
                repr(self.baseline),
                f"a {', '.join(MONITOR_BASELINE_SUFFIXES)} file (the check's function has no pyarrow for Parquet)",
            )
        return self


class GpuSettings(Strict):
    """How a GPU instance runs the model: `provider: tensorrt` puts onnxruntime's TensorRT provider before CUDA
    (engines built on a model's first runs and cached on the instance), `fp16: true` lets TensorRT run layers in
    float16. The container reads them as SERVESTACK_GPU_PROVIDER and SERVESTACK_GPU_FP16
    (servestack/inference/providers.py)."""

    provider: Literal["cuda", "tensorrt"] = "cuda"
    fp16: bool = False

    @property
    def environment(self) -> dict[str, str]:
        return {"SERVESTACK_GPU_PROVIDER": self.provider, "SERVESTACK_GPU_FP16": str(self.fp16).lower()}

    @model_validator(mode="after")
    def _fp16_is_tensorrts(self) -> Self:
        if self.fp16 and self.provider != "tensorrt":
            _fail("fp16", "true", "allowed with provider: cuda (float16 is TensorRT's option: provider: tensorrt)")
        return self


def check_gpu(gpu: GpuSettings | None, instance_type: str, *, runs_on_instances: bool, instead: str) -> None:
    """`gpu:` of an async or batch deployment: only where it runs on SageMaker instances (`runs_on_instances`;
    else `instead` says what to choose) of a GPU instance type."""
    if gpu is None:
        return
    if not runs_on_instances:
        _fail("gpu", "a gpu block", f"used here: {instead}")
    if not uses_gpu(instance_type):
        _fail(
            "instance_type",
            repr(instance_type),
            "a GPU instance type (ml.g*, ml.p*) with gpu: set: a CPU instance runs the CPU image, without CUDA or "
            "TensorRT (remove gpu:, or choose a GPU type)",
        )


class _DeploymentBase(Strict):
    model: Name
    version: Version | None = Field(default=None, description="default: the only declared version of `model`")
    alarms: AlarmSettings = AlarmSettings()
    batching: Batching = Batching()
    # Default: what the deployment's engine accepts (`engine_limit`, servestack/aws_rules.py's table); more is refused.
    max_payload_bytes: Annotated[int, BetweenByRule(1, LARGEST_PAYLOAD_BYTES, SAGEMAKER_ASYNC.rule)] = (
        SAGEMAKER_REALTIME.max_payload_bytes
    )
    log_retention_days: LogRetentionDays = 30
    capture: Capture | None = Field(default=None, description="data capture (docs/monitoring.md); default off")
    monitor: Monitor | None = Field(default=None, description="scheduled drift check of the capture; default off")

    @classmethod
    def engine_of(cls, data: Mapping[str, Any]) -> EngineLimit:
        """The engine that runs a deployment declared as `data` (its keys as written), whose limits it takes."""
        return SAGEMAKER_REALTIME

    @property
    def engine_limit(self) -> EngineLimit:
        return self.engine_of(self.model_dump(include={"mode", "backend", "serverless", "runner"}))

    @model_validator(mode="before")
    @classmethod
    def _payload_limit_of_engine(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "max_payload_bytes" not in data:
            data = {**data, "max_payload_bytes": cls.engine_of(data).max_payload_bytes}
        return data

    def _monitor_refusal(self) -> str | None:
        """Why this mode refuses `monitor:` whatever its capture (None: it takes it)."""
        return None

    @model_validator(mode="after")
    def _monitor_reads_capture(self) -> Self:
        """The scheduled check reads what capture records: the inputs, under the capture prefix."""
        if self.monitor is None:
            return self
        refused = self._monitor_refusal()
        if refused is not None:
            _fail("monitor", "a monitor block", refused)
        if self.capture is None:
            _fail("monitor", "a monitor block", "allowed without capture: (the check reads the captured records); "
                  "add a capture: block")  # fmt: skip
        elif self.capture.what == "outputs":
            _fail("monitor", "a monitor block", "allowed with capture.what: outputs (the check compares the inputs "
                  "too); capture inputs or both")  # fmt: skip
        return self

    @model_validator(mode="after")
    def _payload_within_engine(self) -> Self:
        limit = self.engine_limit
        if self.max_payload_bytes > limit.max_payload_bytes:
            _fail(
                "max_payload_bytes",
                self.max_payload_bytes,
                f"in 1..{limit.max_payload_bytes}; AWS: {limit.rule.text} ({limit.rule.url})",
            )
        return self
