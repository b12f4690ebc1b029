"""`servestack local up`: start the local topology, print how to call it, stop it cleanly on Ctrl-C/SIGTERM.

Today it runs the realtime container entry over the bundled models; the emulator-backed modes
(serverless, async, batch) join it as they land.
"""

from __future__ import annotations

import shlex
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from servestack.local.processes import REPO_ROOT, RealtimeProcess, free_port, port_is_free

DEFAULT_PORT = 8080


def sample_curl(url: str, sample: Path) -> str:
    shown = sample.relative_to(Path.cwd()) if sample.is_relative_to(Path.cwd()) else sample
    return f"curl -s -X POST {url}/invocations -H 'Content-Type: application/json' --data @{shlex.quote(str(shown))}"


def run(port: int | None, model_dir: Path | None, default_model: str, workers: int) -> int:
    chosen = port if port is not None else DEFAULT_PORT
    if not port_is_free(chosen):
        if port is not None:
            print(f"port {chosen} is in use; pick another with --port", file=sys.stderr)
            return 2
        chosen = free_port()
    env = {"SERVESTACK_DEFAULT_MODEL": default_model}
    if model_dir is not None:
        env["SERVESTACK_MODEL_DIR"] = str(model_dir.resolve())
    stop_requested = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        stop_requested.set()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    server = RealtimeProcess.start(f"{default_model}-realtime", chosen, env=env, workers=workers)
    try:
        server.wait_ready()
        artifacts = (model_dir or REPO_ROOT / "models" / "artifacts").resolve()
        sample = next(iter(sorted(artifacts.glob(f"{default_model}/*/sample-request.json"))), None)
        print(f"{'deployment':<24} {'mode':<10} url", flush=True)
        print(f"{server.name:<24} {'realtime':<10} {server.url}", flush=True)
        print(f"\ncurl -s {server.url}/ping", flush=True)
        if sample is not None:
            print(sample_curl(server.url, sample), flush=True)
        print("\nCtrl-C stops everything.", flush=True)
        while not stop_requested.wait(0.5):
            if server.process.poll() is not None:
                print(f"{server.name}: exited with code {server.process.returncode}", file=sys.stderr)
                return 1
        return 0
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        print("stopped", flush=True)
