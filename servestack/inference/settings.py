"""Serving settings, read once from the environment and passed down.

Nothing inside the core reads `os.environ`; adapters call `ServingSettings.from_environment()` at start-up
and hand the result over. Settings are msgspec structs: validated like pydantic models (types, bounds,
unknown names refused), but importing pydantic costs a Lambda cold start ~170 ms, msgspec a few.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Self

import msgspec

from servestack.inference.errors import ConfigurationError

# The model packages shipped beside the code: a Lambda bundle and an image put `models/artifacts/` next to the
# `servestack` package (`/var/task`, `/opt/program`), as a project's checkout does.
BUNDLED_ARTIFACTS = Path(__file__).resolve().parents[2] / "models" / "artifacts"
SAGEMAKER_MODEL_DIR = Path("/opt/ml/model")
# Where SageMaker extracts each multi-model archive (`/opt/ml/models/<model_name>/model`).
SAGEMAKER_MULTI_MODEL_ROOT = Path("/opt/ml/models")
ENV_PREFIX = "SERVESTACK_"

SIX_MEBIBYTES = 6 * 1024 * 1024


def default_model_dir() -> Path:
    """SageMaker mounts model data at /opt/ml/model; elsewhere serve the models bundled with the code."""
    if (SAGEMAKER_MODEL_DIR / "manifest.json").exists() or any(SAGEMAKER_MODEL_DIR.glob("*/*/manifest.json")):
        return SAGEMAKER_MODEL_DIR
    return BUNDLED_ARTIFACTS


def _decode_path(kind: type, value: Any) -> Any:
    if kind is Path and isinstance(value, str):
        return Path(value)
    raise NotImplementedError(kind)


class EnvironmentSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Settings whose fields come from `<prefix><FIELD NAME>` environment variables (or their aliases)."""

    @classmethod
    def from_environment(
        cls, environ: Mapping[str, str] | None = None, prefix: str = ENV_PREFIX, **overrides: Any
    ) -> Self:
        source = os.environ if environ is None else environ
        aliases = cls.aliases()
        values: dict[str, Any] = {}
        for name in cls.__struct_fields__:
            for variable in (*aliases.get(name, ()), f"{prefix}{name.upper()}"):
                if variable in source:
                    values[name] = source[variable]
                    break
        values.update(overrides)
        try:
            return msgspec.convert(values, cls, strict=False, dec_hook=_decode_path)
        except msgspec.ValidationError as exc:
            where = re.search(r"at `\$\.(\w+)`", str(exc)) or re.search(r"field `(\w+)`", str(exc))
            variable = f"{prefix}{where.group(1).upper()}" if where else "settings"
            raise ConfigurationError(
                f"{variable}: {values.get(where.group(1)) if where else ''!r} is invalid: {exc}",
                field=variable,
                value=values.get(where.group(1)) if where else None,
                allowed=str(exc).split(" - at ")[0],
            ) from None

    @classmethod
    def aliases(cls) -> dict[str, tuple[str, ...]]:
        """Other variable names a field may come from (e.g. SageMaker's own); they win over ours."""
        return {}


def _model_dir_factory() -> Path:
    return default_model_dir()


def _cache_dir_factory() -> Path:
    return Path(tempfile.gettempdir()) / "servestack-model-cache"


class ServingSettings(EnvironmentSettings, frozen=True, kw_only=True):
    """Every knob of the inference core and the HTTP adapters. Environment variables use `SERVESTACK_`."""

    model_dir: Path = msgspec.field(default_factory=_model_dir_factory)
    default_model: str = "digits"
    # "auto" takes CUDA when onnxruntime offers it, else CPU; or a comma list such as "CPUExecutionProvider".
    providers: str = "auto"
    # On a GPU: `cuda` runs onnxruntime's CUDA provider; `tensorrt` puts TensorRT before it where this onnxruntime
    # offers it (servestack/inference/providers.py), its engines cached under `cache_dir`; `gpu_fp16` lets
    # TensorRT run layers in float16. serving.yaml's `gpu: {provider: tensorrt, fp16: true}` sets both.
    gpu_provider: Literal["cuda", "tensorrt"] = "cuda"
    gpu_fp16: bool = False
    intra_op_threads: Annotated[int, msgspec.Meta(ge=1, le=256)] = 1
    warmup: bool = True
    max_payload_bytes: Annotated[int, msgspec.Meta(ge=1)] = SIX_MEBIBYTES
    max_batch_rows: Annotated[int, msgspec.Meta(ge=1)] = 10_000
    # Micro-batching and admission control, per worker process. 512 rows: onnxruntime's cost per row at batch
    # 512 is under half its cost at 32 (bench/realtime.py prints raw rows/s at 1/32/128), a batch's fixed costs
    # (the call, stacking, splitting) are shared by more requests (32-row requests: 9% less CPU each than at
    # 256), and a batch only holds what is already queued, so a lone 1-row request still runs at once.
    max_batch_size: Annotated[int, msgspec.Meta(ge=1, le=65_536)] = 512
    max_delay_ms: Annotated[float, msgspec.Meta(ge=0, le=1000)] = 0.0
    max_queue_rows: Annotated[int, msgspec.Meta(ge=1)] = 8192
    max_queue_requests: Annotated[int, msgspec.Meta(ge=1)] = 64
    # A 429 is answered after this pause: clients that retry at once (ignoring Retry-After) then cannot
    # turn rejections into a storm that starves the admitted requests of the event loop. A refusal costs
    # about one raw HTTP request, so the pause bounds their rate: 1 s (the shortest Retry-After) keeps 448
    # excess connections to ~450 refusals/s, where 200 ms let them make ~2,200/s and cost ~20% of goodput.
    reject_pause_ms: Annotated[float, msgspec.Meta(ge=0, le=5000)] = 1000.0
    request_timeout_sec: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 60.0
    # A request body must have arrived this long after its read began, or the request is answered 408. The
    # body is read before the request takes one of the `max_queue_requests` slots, so a client that stalls
    # mid-body holds a connection for at most this long, and never a slot.
    body_read_timeout_sec: Annotated[float, msgspec.Meta(gt=0, le=300)] = 10.0
    # Multi-model serving: when `registry_uri` is set (`s3://bucket/prefix/` or a directory), models load from
    # the registry on first request into an LRU cache bounded by bytes and by count (per worker process).
    registry_uri: str = ""
    cache_budget_bytes: Annotated[int, msgspec.Meta(ge=1)] = 1 << 30
    cache_max_models: Annotated[int, msgspec.Meta(ge=1)] = 100
    # Estimated memory of one onnxruntime session beyond its weights (measured ~180 KiB for a small CPU MLP).
    cache_session_overhead_bytes: Annotated[int, msgspec.Meta(ge=0)] = 256 * 1024
    cache_dir: Path = msgspec.field(default_factory=_cache_dir_factory)
    # Comma list of targets (`name`, `name@version`) loaded at start; readiness waits for them.
    prewarm: str = ""
    # How long an unversioned target (`digits`) keeps the version its alias resolved to.
    alias_ttl_sec: Annotated[float, msgspec.Meta(ge=0)] = 30.0
    cache_load_threads: Annotated[int, msgspec.Meta(ge=1, le=64)] = 2
    # SageMaker multi-model mode (`Mode: MultiModel`): the container serves the multi-model API
    # (servestack/adapters/multi_model.py) for models SageMaker extracts below `multi_model_root`; the set of loaded
    # models is shared by the workers through `multi_model_state_dir` (`serve` makes a fresh one per container start).
    multi_model: bool = False
    multi_model_root: Path = SAGEMAKER_MULTI_MODEL_ROOT
    multi_model_state_dir: str = ""
    # Overload metrics (queue depth, admitted requests, 429s) written as CloudWatch EMF to stdout every
    # `metrics_interval_sec` per worker (0: off), with the endpoint and variant as dimensions.
    metrics_interval_sec: Annotated[float, msgspec.Meta(ge=0, le=3600)] = 0.0
    endpoint_name: str = ""
    variant_name: str = ""
    # Data capture (servestack/inference/capture.py): a JSON object, '' for none.
    capture: str = ""

    @classmethod
    def aliases(cls) -> dict[str, tuple[str, ...]]:
        return {"multi_model": ("SAGEMAKER_MULTI_MODEL",)}

    def __post_init__(self) -> None:
        if not self.default_model.strip():
            raise ValueError("default_model must name a model, e.g. 'digits'")

    @property
    def prewarm_targets(self) -> list[str]:
        return [target.strip() for target in self.prewarm.split(",") if target.strip()]
