"""`servestack invoke` and `servestack local run-batch`: talk to a running `local up` through its state file."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from servestack.failures import CommandError, ExitCode
from servestack.local import state

CONTENT_TYPES = {".json": "application/json", ".csv": "text/csv", ".npy": "application/x-npy"}


def _request(url: str, data: bytes | None = None, content_type: str | None = None) -> tuple[int, bytes]:
    headers = {"Content-Type": content_type} if content_type else {}
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"{url}: not an http(s) URL")
    method = "POST" if data is not None else "GET"
    request = urllib.request.Request(url, data=data, headers=headers, method=method)  # noqa: S310 - checked above
    try:
        with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 - local endpoints from state
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as error:
        return int(error.code), bytes(error.read())


def invoke(name: str, data: Path, *, state_path: Path | None = None, timeout_sec: float = 120) -> int:
    """POST the file to the deployment; for async, wait for the job and print its result."""
    if not data.is_file():
        raise CommandError(f"--data {data}: no such file; give a request body (.json, .csv or .npy)")
    deployments: dict[str, Any] = state.read(state_path)["deployments"]
    if name not in deployments:
        raise CommandError(
            f"{name}: not a deployment of the running local up ({', '.join(deployments)})", ExitCode.NOT_FOUND
        )
    d = deployments[name]
    body = data.read_bytes()
    content_type = CONTENT_TYPES.get(data.suffix.lower(), "application/json")
    if d["mode"] in ("realtime", "serverless"):
        status, answer = _request(f"{d['url']}/invocations", body, content_type)
        sys.stdout.write(answer.decode(errors="replace") + "\n")
        return 0 if status == 200 else 1
    if d["mode"] != "async":
        raise CommandError(f"{name}: {d['mode']} deployments run with `servestack local run-batch {name}`")
    status, answer = _request(f"{d['url']}/jobs", body, content_type)
    if status != 202:
        sys.stdout.write(answer.decode(errors="replace") + "\n")
        return 1
    job = json.loads(answer)
    print(f"job {job['job_id']} queued; waiting ({job['status_url']})", file=sys.stderr)
    deadline = time.monotonic() + timeout_sec
    while time.monotonic() < deadline:
        _, answer = _request(job["status_url"])
        current = json.loads(answer)
        if current["status"] == "succeeded":
            _, result = _request(current["result"]["url"])
            sys.stdout.write(result.decode(errors="replace") + "\n")
            return 0
        if current["status"] == "failed":
            sys.stdout.write(json.dumps(current) + "\n")
            return 1
        time.sleep(0.2)
    print(f"job {job['job_id']}: not done after {timeout_sec:.0f}s", file=sys.stderr)
    return 1


class ProgressBar:
    """A one-line progress bar on stderr, by input bytes read."""

    def __init__(self, width: int = 30) -> None:
        self.width = width
        self.last = 0.0

    def __call__(self, progress: Any) -> None:
        now = time.monotonic()
        if now - self.last < 0.2 and progress.bytes_read < progress.total_bytes:
            return
        self.last = now
        done = min(1.0, progress.bytes_read / max(progress.total_bytes, 1))
        bar = "#" * int(done * self.width)
        sys.stderr.write(
            f"\r[{bar:<{self.width}}] {done:6.1%}  {progress.rows:,} rows  {progress.errors:,} bad  "
            f"{progress.rows_per_sec:,.0f} rows/s  parts {progress.parts_done} ({progress.parts_skipped} reused)"
        )
        sys.stderr.flush()


def run_batch(
    name: str,
    *,
    state_path: Path | None = None,
    spec_path: Path | None = None,
    endpoint_url: str | None = None,
    strict: bool = False,
    chunk_rows: int | None = None,
    output_prefix: str | None = None,
) -> int:
    """Run a batch deployment now, in this process, against the running local up (or `--endpoint-url`)."""
    from servestack import project
    from servestack.artifacts import package_dir
    from servestack.local.emulator import aws_environment
    from servestack.local.resources import environment
    from servestack.spec import BatchDeployment, load_spec

    about = state.read(state_path) if endpoint_url is None else {}
    url = endpoint_url or about["endpoint_url"]
    spec_file = spec_path or Path(about.get("spec") or project.spec_path() or project.SPEC_FILE)
    spec = load_spec(spec_file)
    d = spec.deployments.get(name)
    if not isinstance(d, BatchDeployment):
        batch = [n for n, x in spec.deployments.items() if isinstance(x, BatchDeployment)]
        raise CommandError(f"{name}: not a batch deployment ({', '.join(batch)})", ExitCode.NOT_FOUND)
    os.environ.update(aws_environment(url))
    os.environ.update(environment(spec, name))
    package = package_dir(spec.model(d.model, d.version), spec_file.resolve().parent)
    if package is not None:  # the pinned version, as the deployment's Lambda bundle carries it
        os.environ["SERVESTACK_MODEL_DIR"] = str(package)
    from handlers.batch import run_batch as run_job
    from handlers.batch import settings_from

    overrides: dict[str, Any] = {"strict": strict, "chunk_rows": chunk_rows, "output_prefix": output_prefix}
    settings = settings_from(overrides)
    manifest = run_job(settings, on_progress=ProgressBar())
    sys.stderr.write("\n")
    print(f"s3://{settings.bucket}/{settings.output_prefix}manifest.json")
    print(json.dumps({"rows": manifest["rows"], "parts": len(manifest["parts"]), "model": manifest["model"]}))
    return 0
