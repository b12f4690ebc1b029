"""`servestack local up`: every deployment of serving.yaml on this machine, on an AWS emulator.

- An emulator: moto's `ThreadedMotoServer` in this process (a configured or free port), or the endpoint
  of `--endpoint-url` / `AWS_ENDPOINT_URL` (LocalStack...). Buckets, queues with DLQs and tables are created
  with the names the CDK stacks use (servestack/local/resources.py).
- realtime: the container entry (`python -m handlers.realtime serve`) as a child process per deployment.
- serverless: a child serving HTTP that turns requests into HTTP API v2 events for `handlers.serverless`.
- async: a child for the submit/status API, and a child polling SQS for the worker.
- batch: a child running the schedule; `servestack local run-batch NAME` runs it now. Its input prefix is
  seeded with the model's sample rows.
- the AWS APIs: one port (`--aws-port`, default 8090) where boto3's `sagemaker-runtime` (`invoke_endpoint`,
  `invoke_endpoint_async`) and `lambda` (`invoke`) clients work unchanged with `endpoint_url=`
  (servestack/local/aws_front.py). Each child that runs Lambda handlers also serves the Invoke API for them.
Children's output is one log stream, each line tagged `[deployment/role]`. The state file says where
everything is, for `servestack invoke` and `run-batch`. Ctrl-C or SIGTERM stops everything.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING, Any

from servestack.local import state
from servestack.local.processes import (
    REPO_ROOT,
    free_port,
    http_status,
    port_is_free,
    stop_process,
)

if TYPE_CHECKING:
    from servestack.local.aws_front import AwsFront
    from servestack.local.sagemaker_front import AsyncTarget, RealtimeTarget

DEFAULT_PORT = 8080
DEFAULT_AWS_PORT = 8090


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    url: str | None = None
    threads: list[threading.Thread] = field(default_factory=list)

    def stop(self, grace_sec: float = 10.0) -> None:
        stop_process(self.process, grace_sec)
        for thread in self.threads:
            thread.join(timeout=2)


def _pump(tag: str, stream: IO[bytes], out: IO[str]) -> threading.Thread:
    def copy() -> None:
        for raw in iter(stream.readline, b""):
            out.write(f"[{tag}] {raw.decode(errors='replace').rstrip()}\n")
            out.flush()
        stream.close()

    thread = threading.Thread(target=copy, name=f"log-{tag}", daemon=True)
    thread.start()
    return thread


def _spawn(tag: str, argv: list[str], env: dict[str, str]) -> Child:
    process = subprocess.Popen(
        argv, cwd=REPO_ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    assert process.stdout is not None
    return Child(tag, process, threads=[_pump(tag, process.stdout, sys.stdout)])


def _wait_http(child: Child, url: str, timeout_sec: float = 60) -> None:
    deadline = time.monotonic() + timeout_sec
    while time.monotonic() < deadline:
        if child.process.poll() is not None:
            raise RuntimeError(f"{child.name}: exited with code {child.process.returncode}")
        if http_status(url) is not None:
            return
        time.sleep(0.1)
    raise TimeoutError(f"{child.name}: {url} not answering after {timeout_sec:.0f}s")


def sample_path(model_dir: Path, model: str, version: str) -> Path:
    return model_dir / model / version / "sample-request.json"


def shown(path: Path) -> str:
    relative = path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path
    return shlex.quote(str(relative))


def seed_batch_input(s3: Any, bucket: str, prefix: str, sample: Path) -> str | None:
    """A small JSON Lines file from the model's sample rows, unless the prefix already holds input."""
    if s3.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1).get("KeyCount", 0):
        return None
    rows = json.loads(sample.read_text())["instances"]
    key = f"{prefix}sample.jsonl"
    s3.put_object(Bucket=bucket, Key=key, Body="".join(json.dumps(row) + "\n" for row in rows).encode())
    return key


def run(
    port: int | None,
    model_dir: Path | None,
    workers: int,
    *,
    spec_path: Path | None = None,
    endpoint_url: str | None = None,
    emulator_port: int = 0,
    state_path: Path | None = None,
    visibility_timeout_sec: int | None = None,
    aws_port: int | None = None,
) -> int:
    from servestack.local.emulator import EmbeddedEmulator, aws_environment, clients
    from servestack.local.resources import ensure_all, environment, function_names, names
    from servestack.local.sagemaker_front import AsyncTarget, RealtimeTarget
    from servestack.spec import AsyncDeployment, BatchDeployment, RealtimeDeployment, SpecError, load_spec

    spec_file = spec_path or (Path("serving.yaml") if Path("serving.yaml").exists() else REPO_ROOT / "serving.yaml")
    try:
        spec = load_spec(spec_file)
    except SpecError as error:
        print(error, file=sys.stderr)
        return 2
    realtime_port = port if port is not None else DEFAULT_PORT
    if not port_is_free(realtime_port):
        if port is not None:
            print(f"port {realtime_port} is in use; pick another with --port", file=sys.stderr)
            return 2
        realtime_port = free_port()
    api_port = aws_port if aws_port is not None else DEFAULT_AWS_PORT
    if not port_is_free(api_port) or api_port == realtime_port:
        if aws_port is not None:
            print(f"port {api_port} is in use; pick another with --aws-port", file=sys.stderr)
            return 2
        api_port = free_port()
    artifacts = (model_dir or REPO_ROOT / "models" / "artifacts").resolve()
    model_env = {"SERVESTACK_MODEL_DIR": str(artifacts)} if model_dir is not None else {}
    stop_requested = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        stop_requested.set()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    external = endpoint_url or os.environ.get("AWS_ENDPOINT_URL")
    emulator = None if external else EmbeddedEmulator(emulator_port)
    url = external or emulator.url  # type: ignore[union-attr]
    aws_env = aws_environment(url)
    children: list[Child] = []
    front: AwsFront | None = None
    state_file = state_path or state.default_path()
    try:
        aws = clients(url)
        created = ensure_all(aws, spec, visibility_timeout=visibility_timeout_sec)
        # --- issue 6: the model registry on the emulator, seeded with serving.yaml's models ---
        from servestack.local import endpoint
        from servestack.registry import seed_local

        registry_uri = seed_local(aws["s3"], spec, artifacts)
        # --- end issue 6 ---
        rows: list[tuple[str, str, str]] = []
        curls: list[str] = []
        recorded: dict[str, dict[str, Any]] = {}
        waits: list[Callable[[], None]] = []
        spec_arg = ["--spec", str(spec_file.resolve())]
        runner = [sys.executable, "-m", "servestack.local.runner"]
        endpoints: dict[str, RealtimeTarget | AsyncTarget] = {}  # by SageMaker endpoint name
        invoke_hosts: dict[str, str] = {}  # Lambda function -> the Invoke API of the child that runs it
        public_functions: dict[str, str] = {}  # the names `lambda.invoke` accepts -> function

        def hosting(tag: str, argv: list[str], env: dict[str, str], function: str) -> Child:
            """A child that runs `function` and answers `lambda.invoke` for it on its `--invoke-port`."""
            invoke_port = free_port()
            invoke_hosts[function] = f"http://127.0.0.1:{invoke_port}"
            child = _spawn(tag, [*argv, "--invoke-port", str(invoke_port)], env)
            waits.append(functools.partial(_wait_http, child, f"{invoke_hosts[function]}/"))
            return child

        for name, d in spec.deployments.items():
            model = spec.model(d.model, d.version)
            sample = sample_path(artifacts, model.name, model.version)
            env = {
                **aws_env,
                **model_env,
                **environment(spec, name, queue_url=created.get(name, {}).get("queue_url", "")),
            }
            if not isinstance(d, RealtimeDeployment):  # issue 14: the pinned version only, as its Lambda bundle
                env["SERVESTACK_MODEL_DIR"] = str(artifacts / model.name / model.version)
            n = names(name, d)
            entry: dict[str, Any] = {"mode": d.mode, "model": model.key, "sample": str(sample)}
            functions = function_names(name, d)
            public_functions |= functions
            if functions:
                entry["lambda_functions"] = sorted(functions)
            if isinstance(d, RealtimeDeployment):
                chosen = realtime_port if not any(c.name.endswith("/realtime") for c in children) else free_port()
                # issue 6: a router (variants by weight, shadow, rehearsals) in front of the realtime children
                argv = endpoint.argv(name, spec_file.resolve(), chosen, artifacts, registry_uri, workers=workers)
                child = _spawn(f"{name}/realtime", argv, env)
                child.url = f"http://127.0.0.1:{chosen}"
                children.append(child)
                waits.append(functools.partial(_wait_http, child, f"{child.url}/ping"))
                entry["url"] = child.url
                endpoints[name] = RealtimeTarget(child.url, tuple(v.name for v in d.variants) or ("primary",))
                curls += [f"curl -s {child.url}/ping", _curl(f"{child.url}/invocations", sample)]
                curls.append(f"curl -s {child.url}/_servestack/metrics")
            elif isinstance(d, BatchDeployment):
                argv = [*runner, "scheduler", name, *spec_arg]
                children.append(hosting(f"{name}/scheduler", argv, env, functions[name]))
                seeded = seed_batch_input(aws["s3"], n.bucket, n.input_prefix, sample)
                entry |= {"bucket": n.bucket, "input_prefix": n.input_prefix, "output_prefix": n.output_prefix}
                entry |= {"schedule": f"{d.schedule} {d.timezone}", "seeded": seeded}
                curls.append(f"{_self_command()} local run-batch {name}")
            else:
                http_port = free_port()
                argv = [*runner, "http", name, *spec_arg, "--port", str(http_port)]
                child = hosting(f"{name}/http", argv, env, functions[name])
                child.url = f"http://127.0.0.1:{http_port}"
                children.append(child)
                if isinstance(d, AsyncDeployment):
                    argv = [*runner, "poller", name, *spec_arg]
                    children.append(hosting(f"{name}/poller", argv, env, functions[f"{name}-worker"]))
                    entry |= {"bucket": n.bucket, "table": n.table, **created[name]}
                    threshold = d.presign_threshold_bytes
                    endpoints[name] = AsyncTarget(child.url, n.bucket, n.result_prefix, threshold)
                    curls.append(_curl(f"{child.url}/jobs", sample))
                    curls.append(f"curl -s {child.url}/jobs/JOB_ID")
                else:
                    curls.append(_curl(f"{child.url}/invocations", sample))
                waits.append(functools.partial(_wait_http, child, f"{child.url}/"))
                entry["url"] = child.url
            rows.append((name, d.mode, entry.get("url") or f"s3://{n.bucket}/{n.input_prefix}"))
            recorded[name] = entry
        for wait in waits:
            wait()
        front = _start_aws_front(api_port, endpoints, public_functions, invoke_hosts, aws["s3"])
        about = {"endpoint_url": url, "aws_api_url": front.url, "spec": str(spec_file.resolve()), "pid": os.getpid()}
        state.write(state_file, {**about, "registry": registry_uri}, recorded)  # registry: issue 6
        print(f"\naws emulator: {url}  (state: {state_file})", flush=True)
        print(f"{'deployment':<24} {'mode':<11} url", flush=True)
        for name, mode, where in rows:
            print(f"{name:<24} {mode:<11} {where}", flush=True)
        print(f"{'(aws apis)':<24} {'boto3':<11} {front.url}", flush=True)
        print("", flush=True)
        for line in curls:
            print(line, flush=True)
        print(_boto3_lines(front.url, endpoints, public_functions), flush=True)
        print("\nCtrl-C stops everything.", flush=True)
        while not stop_requested.wait(0.5):
            for child in children:
                if child.process.poll() is not None:
                    print(f"{child.name}: exited with code {child.process.returncode}", file=sys.stderr)
                    return 1
        return 0
    finally:
        if front is not None:
            front.close()
        for child in reversed(children):
            child.stop()
        if emulator is not None:
            emulator.stop()
        state.remove(state_file)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        print("stopped", flush=True)


def _start_aws_front(
    port: int,
    endpoints: dict[str, RealtimeTarget | AsyncTarget],
    functions: dict[str, str],
    hosts: dict[str, str],
    s3: Any,
) -> AwsFront:
    """SageMaker Runtime + Lambda Invoke for boto3 on one port (servestack/local/aws_front.py)."""
    import httpx

    from servestack.local.aws_front import AwsFront, LambdaRouter
    from servestack.local.sagemaker_front import AsyncTarget, RealtimeTarget, SageMakerRuntime

    realtime = {name: target for name, target in endpoints.items() if isinstance(target, RealtimeTarget)}
    asynchronous = {name: target for name, target in endpoints.items() if isinstance(target, AsyncTarget)}
    invoke_client = httpx.Client(timeout=httpx.Timeout(960.0, connect=5.0))  # up to Lambda's 900 s timeout
    router = LambdaRouter(functions, hosts, invoke_client)
    return AwsFront(SageMakerRuntime(realtime, asynchronous, s3), router, port).serve_in_background()


def _boto3_lines(api_url: str, endpoints: dict[str, RealtimeTarget | AsyncTarget], functions: dict[str, str]) -> str:
    from servestack.local.sagemaker_front import RealtimeTarget

    lines = [f"\n# boto3 with endpoint_url={api_url!r} and any credentials (docs/boto3-local.md):"]
    for name, target in endpoints.items():
        operation = "invoke_endpoint" if isinstance(target, RealtimeTarget) else "invoke_endpoint_async"
        lines.append(f"#   sagemaker-runtime {operation}(EndpointName={name!r}, ...)")
    lines.append(f"#   lambda invoke(FunctionName=..., Payload=...): {', '.join(functions)}")
    return "\n".join(lines)


def _self_command() -> str:
    """How this CLI was started, so the printed command works without an activated venv."""
    argv0 = Path(sys.argv[0])
    if argv0.name == "servestack" and argv0.exists():
        return shown(argv0.resolve()) if not argv0.is_absolute() else shlex.quote(str(argv0))
    return f"{shlex.quote(sys.executable)} -m servestack.cli"


def _curl(url: str, sample: Path) -> str:
    return f"curl -s -X POST {url} -H 'Content-Type: application/json' --data @{shown(sample)}"
