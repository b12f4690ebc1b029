"""The SageMaker container entry: `serve` (or `python -m servestack.adapters.realtime serve`).

Listens on 8080 (or SAGEMAKER_BIND_TO_PORT), one worker per core, or one per GPU when onnxruntime offers
CUDA, each loading the models once in the background so `/ping` answers 503 until they are warm. SIGTERM
drains in-flight requests (the HTTP server's graceful shutdown) before the process exits. With
`SERVESTACK_MULTI_MODEL=true` (or SageMaker's `SAGEMAKER_MULTI_MODEL`) it serves SageMaker's multi-model API
instead (servestack/adapters/multi_model.py).

The HTTP server is granian (HTTP parsing and connection handling in Rust) unless
`SERVESTACK_HTTP_SERVER=uvicorn` (uvicorn + httptools + uvloop), and on granian the app runs behind its RSGI
interface (servestack/adapters/rsgi.py). Both choices were made by numbers: `python -m bench.servers` measures the
ceiling, the 1-row and 32-row paths and overload on each, side by side (README "Measured").
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import tempfile
from typing import TYPE_CHECKING, Annotated, Literal

import msgspec

from servestack.inference.devices import gpu_count
from servestack.inference.settings import EnvironmentSettings, ServingSettings

if TYPE_CHECKING:
    from servestack.adapters.app import ServingApp
    from servestack.adapters.rsgi import RSGIApp


class ContainerSettings(EnvironmentSettings, frozen=True, kw_only=True):
    """The container's own knobs; SageMaker's variable names win over ours."""

    # 0.0.0.0: inside a container SageMaker reaches the server from outside its network namespace.
    host: str = "0.0.0.0"  # noqa: S104
    port: Annotated[int, msgspec.Meta(ge=1, le=65535)] = 8080
    workers: Annotated[int, msgspec.Meta(ge=1)] | None = None
    graceful_shutdown_sec: Annotated[int, msgspec.Meta(ge=0)] = 30
    log_level: Literal["critical", "error", "warning", "info", "debug", "trace"] = "info"
    http_server: Literal["granian", "uvicorn"] = "granian"
    # Idle connections are bounded (granian): a connection that has not sent a whole request head within
    # `header_read_timeout_sec` (a new one, a kept-alive one between requests, or one sending its head byte by
    # byte) is closed, and one worker holds at most `max_connections` connections. granian counts connections,
    # not requests, against this cap (its `backpressure`, by default backlog / workers = 1,024): an idle crowd
    # of about 1,000 per worker locked new callers out until granian's 30 s header timeout freed a place. The
    # cap is set far above such a crowd and the kernel's file limit raised to fit. 10 s, not less: clients keep
    # pooled connections for about 5 s (httpx's keep-alive expiry, the local router's 2 s), and a server closing
    # one just as a client reuses it costs that client a failed request.
    header_read_timeout_sec: Annotated[float, msgspec.Meta(ge=0.001, le=60)] = 10.0
    max_connections: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 20_000

    @classmethod
    def aliases(cls) -> dict[str, tuple[str, ...]]:
        return {"port": ("SAGEMAKER_BIND_TO_PORT",), "workers": ("SAGEMAKER_MODEL_SERVER_WORKERS",)}


def default_workers(providers: str) -> int:
    """One worker per GPU when CUDA will be used (each holds its own session), else one per core."""
    cuda_wanted = providers == "auto" or "CUDAExecutionProvider" in providers
    gpus = gpu_count() if cuda_wanted else 0
    if gpus:
        import onnxruntime  # only where there are GPUs to use: the serving master loads no model, workers do

        if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
            return gpus
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


APP_FACTORY = "servestack.adapters.realtime:create_server_app"
RSGI_APP_FACTORY = "servestack.adapters.realtime:create_rsgi_app"


# The cyclic collector's first-generation threshold in a serving worker (CPython's default: 700). A request
# allocates a few dozen container objects (a task, futures, dicts, arrays' views) that all die with it, so at the
# default the collector ran every ~70 requests under load, about 2% of a worker's time in a perf profile; at
# 20,000 it runs about 30 times less often, over the same few live objects.
YOUNG_COLLECTION_THRESHOLD = 20_000


def tune_collector() -> None:
    """The serving worker's garbage collector: young collections far rarer (`YOUNG_COLLECTION_THRESHOLD`); the
    app freezes what start-up built once its models are loaded (`ServingApp`)."""
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, middle, old)


def create_server_app() -> ServingApp:
    """The HTTP server's factory: each worker process builds its own app and loads its own sessions. (Imported
    here: the master process, which only starts and watches the workers, never loads the app, numpy or
    onnxruntime.)"""
    from servestack.adapters.app import build_repository, create_app

    tune_collector()
    repository = build_repository(ServingSettings.from_environment())
    return create_app(repository, load_in_background=True, freeze_after_load=True)


def create_rsgi_app() -> RSGIApp:
    """granian's factory: the same app behind its RSGI interface (servestack/adapters/rsgi.py)."""
    from servestack.adapters.rsgi import RSGIApp

    return RSGIApp(create_server_app())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="serve", description=__doc__)
    parser.add_argument("command", nargs="?", default="serve", choices=["serve"], help="SageMaker runs `serve`")
    parser.parse_args(argv)
    container = ContainerSettings.from_environment()
    serving = ServingSettings.from_environment()
    if serving.multi_model and not serving.multi_model_state_dir:
        # The workers share the set of loaded models (servestack/inference/multi_model.py): one fresh folder per start,
        # which
        # every worker process inherits through the environment.
        os.environ["SERVESTACK_MULTI_MODEL_STATE_DIR"] = tempfile.mkdtemp(prefix="servestack-mme-")
    workers = container.workers or default_workers(serving.providers)
    if container.http_server == "uvicorn":
        run_uvicorn(container, workers)
    else:
        run_granian(container, workers)


def run_uvicorn(container: ContainerSettings, workers: int) -> None:
    import uvicorn

    uvicorn.run(
        APP_FACTORY,
        factory=True,
        host=container.host,
        port=container.port,
        workers=workers,
        timeout_graceful_shutdown=container.graceful_shutdown_sec,
        log_level=container.log_level,
        access_log=False,
        server_header=False,
        lifespan="on",
    )


def run_granian(container: ContainerSettings, workers: int) -> None:
    """granian with the RSGI interface (servestack/adapters/rsgi.py: models load in the background from its init hook,
    `/ping` says when), HTTP/1.1 only (SageMaker speaks nothing else to a container), no websockets, no access
    log. On SIGTERM it stops accepting, lets in-flight requests finish, and stops a worker still busy after
    `graceful_shutdown_sec`."""
    from granian import Granian
    from granian.constants import HTTPModes, Interfaces, Loops
    from granian.http import HTTP1Settings
    from granian.log import LogLevels

    raise_file_limit(container.max_connections * workers + 1_024)
    Granian(
        RSGI_APP_FACTORY,
        factory=True,
        address=container.host,
        port=container.port,
        interface=Interfaces.RSGI,
        workers=workers,
        http=HTTPModes.http1,
        http1_settings=HTTP1Settings(header_read_timeout=max(1, round(container.header_read_timeout_sec * 1000))),
        backpressure=container.max_connections,
        backlog=4096,
        websockets=False,
        loop=Loops.uvloop if importlib.util.find_spec("uvloop") else Loops.asyncio,
        log_level=LogLevels("debug" if container.log_level == "trace" else container.log_level),
        log_access=False,
        workers_kill_timeout=container.graceful_shutdown_sec or None,
    ).serve()


def raise_file_limit(wanted: int) -> None:
    """The soft limit on open files raised toward `wanted` (at most the hard limit), so that the connection
    cap, not the file limit, is what bounds connections (a container's soft limit is often 1,024)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ceiling = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < ceiling:
        resource.setrlimit(resource.RLIMIT_NOFILE, (ceiling, hard))


if __name__ == "__main__":
    main()
