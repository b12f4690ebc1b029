"""The SageMaker container entry: `serve` (or `python -m handlers.realtime serve`).

Listens on 8080 (or SAGEMAKER_BIND_TO_PORT), one worker per core, or one per GPU when onnxruntime offers
CUDA, each loading the models once in the background so `/ping` answers 503 until they are warm. SIGTERM
drains in-flight requests (uvicorn's graceful shutdown) before the process exits.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from fastapi import FastAPI
from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from handlers.app import create_app
from models.service import ModelRepository
from models.settings import ServingSettings


class ContainerSettings(BaseSettings):
    """The container's own knobs; SageMaker's variable names win over ours."""

    model_config = SettingsConfigDict(extra="ignore", frozen=True)

    # 0.0.0.0: inside a container SageMaker reaches the server from outside its network namespace.
    host: str = Field(default="0.0.0.0", validation_alias=AliasChoices("SERVESTACK_HOST"))  # noqa: S104
    port: int = Field(
        default=8080,
        ge=1,
        le=65535,
        validation_alias=AliasChoices("SAGEMAKER_BIND_TO_PORT", "SERVESTACK_PORT"),
    )
    workers: int | None = Field(
        default=None,
        ge=1,
        validation_alias=AliasChoices("SAGEMAKER_MODEL_SERVER_WORKERS", "SERVESTACK_WORKERS"),
    )
    graceful_shutdown_sec: int = Field(
        default=30, ge=0, validation_alias=AliasChoices("SERVESTACK_GRACEFUL_SHUTDOWN_SEC")
    )
    log_level: str = Field(default="info", validation_alias=AliasChoices("SERVESTACK_LOG_LEVEL"))


def gpu_count() -> int:
    """GPUs the NVIDIA driver exposes to this container (no CUDA library needed to count them)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([device for device in visible.split(",") if device.strip() and device.strip() != "-1"])
    return len(list(Path("/proc/driver/nvidia/gpus").glob("*")))


def default_workers(providers: str) -> int:
    """One worker per GPU when CUDA will be used (each holds its own session), else one per core."""
    import onnxruntime

    cuda_wanted = providers == "auto" or "CUDAExecutionProvider" in providers
    gpus = gpu_count() if "CUDAExecutionProvider" in onnxruntime.get_available_providers() else 0
    if cuda_wanted and gpus:
        return gpus
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def create_server_app() -> FastAPI:
    """uvicorn's factory: each worker process builds its own app and loads its own sessions."""
    return create_app(ModelRepository(ServingSettings()), load_in_background=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="serve", description=__doc__)
    parser.add_argument("command", nargs="?", default="serve", choices=["serve"], help="SageMaker runs `serve`")
    parser.parse_args(argv)
    import uvicorn

    container = ContainerSettings()
    serving = ServingSettings()
    uvicorn.run(
        "handlers.realtime:create_server_app",
        factory=True,
        host=container.host,
        port=container.port,
        workers=container.workers or default_workers(serving.providers),
        timeout_graceful_shutdown=container.graceful_shutdown_sec,
        log_level=container.log_level,
        access_log=False,
        server_header=False,
    )


if __name__ == "__main__":
    main()
