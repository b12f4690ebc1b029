"""Serving settings, read once from the environment and passed down.

Nothing inside the core reads `os.environ`; adapters build a `ServingSettings` at start-up and hand it over.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

BUNDLED_ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
SAGEMAKER_MODEL_DIR = Path("/opt/ml/model")

SIX_MEBIBYTES = 6 * 1024 * 1024


def default_model_dir() -> Path:
    """SageMaker mounts model data at /opt/ml/model; elsewhere serve the models bundled with the code."""
    if (SAGEMAKER_MODEL_DIR / "manifest.json").exists() or any(SAGEMAKER_MODEL_DIR.glob("*/*/manifest.json")):
        return SAGEMAKER_MODEL_DIR
    return BUNDLED_ARTIFACTS


class ServingSettings(BaseSettings):
    """Every knob of the inference core and the HTTP adapters. Environment variables use `SERVESTACK_`."""

    model_config = SettingsConfigDict(env_prefix="SERVESTACK_", extra="ignore", frozen=True)

    model_dir: Path = Field(default_factory=default_model_dir)
    default_model: str = "digits"
    # "auto" takes CUDA when onnxruntime offers it, else CPU; or a comma list such as "CPUExecutionProvider".
    providers: str = "auto"
    intra_op_threads: int = Field(default=1, ge=1, le=256)
    warmup: bool = True
    max_payload_bytes: int = Field(default=SIX_MEBIBYTES, ge=1)
    max_batch_rows: int = Field(default=10_000, ge=1)

    @field_validator("default_model")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must name a model, e.g. 'digits'")
        return value.strip()
