"""`servestack invoke` and `servestack local run-batch`: call a running `local up` as the developer would
call the deployed stacks, through its state file.

Every call goes through the same doors as in the cloud, signed with the developer's keys: SageMaker Runtime's
`InvokeEndpoint` for realtime, the IAM-authenticated HTTP API (SigV4, `execute-api`) for serverless and
async; for batch, Lambda's `Invoke` of the batch function with its schedule's input, signed with the schedule
role's keys as the schedule invokes it (servestack/local/scheduler/schedules.py).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from servestack.failures import CommandError, ExitCode
from servestack.inference import media_types
from servestack.local.batch import print_manifest
from servestack.local.emulator import developer, sagemaker_runtime, signed, state

# The codecs' types first: `mimetypes` knows no `.npy`, and what it says of `.csv` or `.json` varies by platform.
CONTENT_TYPES = {".json": "application/json", ".csv": "text/csv", ".npy": "application/x-npy"}


def content_type_of(data: Path, given: str | None = None) -> str:
    """The media type `data` is sent with: `given` (`--content-type`) when there is one, else the codecs' type of
    its extension, else the one `mimetypes` guesses (`.jpg` -> `image/jpeg`, `.wav` -> `audio/x-wav`: a model's
    `preprocess` hook reads those bytes); a file without an extension is JSON, as it always was, and one whose
    extension nothing knows is `application/octet-stream`."""
    if given:
        return given
    suffix = data.suffix.lower()
    if not suffix:
        return "application/json"
    known = CONTENT_TYPES.get(suffix)
    if known is not None:
        return known
    return media_types.guessed_type(data.name)  # as a batch job types a file it hands to the hook


def invoke(
    name: str,
    data: Path,
    *,
    state_path: Path | None = None,
    timeout_sec: float = 120,
    component: str | None = None,
    content_type: str | None = None,
) -> int:
    """Send the file to the deployment (to one of its inference components) with its media type
    (`content_type_of`); for async, wait for the job and print its result."""
    if not data.is_file():
        raise CommandError(f"--data {data}: no such file; give a request body (.json, .csv, .npy, or any file)")
    about = state.read(state_path)
    deployments: dict[str, Any] = about["deployments"]
    if name not in deployments:
        raise CommandError(
            f"{name}: not a deployment of the running local up ({', '.join(deployments)})", ExitCode.NOT_FOUND
        )
    d = deployments[name]
    body = data.read_bytes()
    content_type = content_type_of(data, content_type)
    region = about.get("region", "us-east-1")
    keys = developer(about)
    if d["mode"] == "realtime":
        session, config = sagemaker_runtime(about)
        runtime = session.client("sagemaker-runtime", endpoint_url=about["aws_api_url"], config=config)
        named: dict[str, str] = {}
        if component is not None:
            components: dict[str, Any] = d.get("components") or {}
            full = f"{d['endpoint_name']}-{component}"
            named["InferenceComponentName"] = full if full in components else component
        try:
            response = runtime.invoke_endpoint(
                EndpointName=d["endpoint_name"], Body=body, ContentType=content_type, **named
            )
        except runtime.exceptions.ClientError as error:
            print(f"{name}: {error}", file=sys.stderr)
            return 1
        sys.stdout.write(response["Body"].read().decode(errors="replace") + "\n")
        return 0
    if d["mode"] == "serverless":
        status, answer = signed("POST", f"{d['url']}/invocations", keys, region, body=body,
                                headers={"Content-Type": content_type})  # fmt: skip
        sys.stdout.write(answer.decode(errors="replace") + "\n")
        return 0 if status == 200 else 1
    if d["mode"] != "async":
        raise CommandError(f"{name}: {d['mode']} deployments run with `servestack local run-batch {name}`")
    return invoke_job(d["url"], body, content_type, keys, region, timeout_sec)


def invoke_job(url: str, body: bytes, content_type: str, keys: Any, region: str, timeout_sec: float) -> int:
    """Submit to an async deployment's job API as the developer (a payload over the inline limit through the
    presigned upload, with its progress on stderr), wait for the job, and print its result."""
    import boto3

    from servestack.client import AsyncJobsClient, ServingClientError, SigV4, upload_progress

    session = boto3.session.Session(
        aws_access_key_id=keys.access_key_id,
        aws_secret_access_key=keys.secret_access_key,
        aws_session_token=keys.session_token,
    )
    with AsyncJobsClient(url, auth=SigV4(region, "execute-api", session=session)) as jobs:
        try:
            job = jobs.submit(body, content_type, on_upload=upload_progress(sys.stderr))
        except ServingClientError as refused:
            sys.stdout.write(json.dumps(refused.body) if not isinstance(refused.body, str) else refused.body)
            sys.stdout.write("\n")
            return 1
        print(f"job {job['job_id']} queued; waiting ({job['status_url']})", file=sys.stderr)
        try:
            final = jobs.wait(job, timeout_sec=timeout_sec)
        except TimeoutError as late:
            print(str(late), file=sys.stderr)
            return 1
        if final["status"] == "failed":
            sys.stdout.write(json.dumps(final) + "\n")
            return 1
        try:
            sys.stdout.write(jobs.result(final).decode(errors="replace") + "\n")
        except ServingClientError as unreadable:
            print(f"job {job['job_id']}: its result could not be read: {unreadable}", file=sys.stderr)
            return 1
        return 0


def run_batch(
    name: str,
    *,
    state_path: Path | None = None,
    strict: bool = False,
    chunk_rows: int | None = None,
    output_prefix: str | None = None,
    download: Path | None = None,
) -> int:
    """Run a batch deployment now: invoke its function with its schedule's input, as the schedule would (as
    its role); with `download`, merge the run's output into that file (servestack/local/batch/data.py)."""
    from servestack.local.batch import data as batch_data
    from servestack.progress import Progress

    if download is not None:
        batch_data.download_format(download)  # a bad suffix stops before the run, not after
    about = state.read(state_path)
    d = about["deployments"].get(name)
    if d is None or d.get("mode") != "batch" or "target" not in d:
        batch = [n for n, x in about["deployments"].items() if x.get("mode") == "batch"]
        raise CommandError(
            f"{name}: not a batch deployment of the running local up ({', '.join(batch) or 'none'})",
            ExitCode.NOT_FOUND,
        )
    _retire_seeded(about, d)
    if "transform" in d:  # engine: transform: the Batch Transform job its schedule would create, emulated
        if download is not None:
            raise CommandError(f"--download: {name} runs as a transform job, whose output is not merged yet")
        from servestack.local.sagemaker import run_transform

        return run_transform(about, name, d["transform"], sagemaker_runtime(about))
    bucket, _, output = batch_data.batch_location(about, name)
    output = output_prefix or output
    overrides = {"strict": strict or None, "chunk_rows": chunk_rows, "output_prefix": output_prefix}
    with Progress().step(f"run-batch {name}") as step, _counting_parts(about, bucket, output, step):
        if "task" in d:
            code = _run_task(about, name, d, {k: v for k, v in overrides.items() if v is not None})
            manifest_url = f"s3://{bucket}/{output}manifest.json"
        else:
            code, manifest_url = _invoke_batch(about, name, d, overrides)
        step.finish("succeeded" if code == 0 else "failed")
    if code != 0:
        return code
    if "task" not in d:
        session, config = sagemaker_runtime(about)
        print_manifest(session, config, about, manifest_url)
    if download is not None:
        batch_data.download(about, manifest_url, download)
    return 0


def _invoke_batch(about: dict[str, Any], name: str, d: dict[str, Any], overrides: dict[str, Any]) -> tuple[int, str]:
    payload = dict(d["input"])
    payload |= {k: v for k, v in overrides.items() if v is not None}
    print(f"invoking {d['target']} with its schedule's input, as its schedule's role", file=sys.stderr)
    from servestack.local.scheduler import invoke_as_schedule_role

    response = invoke_as_schedule_role(about, d, payload)
    answer = json.loads(response["Payload"].read() or b"null")
    if response.get("FunctionError"):
        print(f"{name}: the run failed: {answer.get('errorType')}: {answer.get('errorMessage')}", file=sys.stderr)
        return 1, ""
    return 0, str(answer["manifest"])


@contextmanager
def _counting_parts(about: dict[str, Any], bucket: str, prefix: str, step: Any) -> Iterator[None]:
    """While a run goes on: how many parts it has written so far, as the step's detail."""
    import threading

    from servestack.local.batch import s3_client

    s3 = s3_client(about)
    stop = threading.Event()
    before: set[str] = set()

    def parts() -> set[str]:
        listing = s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}parts/")
        return {f"{o['Key']}{o.get('ETag')}" for o in listing.get("Contents", [])}

    def watch() -> None:
        while not stop.wait(1.0):
            with suppress(Exception):  # the count is a courtesy: a failed listing never stops the run
                step.update(f"{len(parts() - before)} part(s) written")

    before = parts()
    thread = threading.Thread(target=watch, name="batch-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def _retire_seeded(about: dict[str, Any], deployment: dict[str, Any]) -> None:
    """local up's sample input leaves the prefix once the user's input is there (servestack/local/batch/seed.py)."""
    from servestack.local.batch import retire_seeded_input

    source = deployment.get("input") or {}
    # Not gated on the state file's `seeded`: the object's own mark says whether it is local up's sample.
    if not source.get("bucket") or not source.get("input_prefix"):
        return
    session, config = sagemaker_runtime(about)
    s3 = session.client("s3", endpoint_url=about["endpoint_url"], config=config)
    retire_seeded_input(s3, source["bucket"], source["input_prefix"])


def _run_task(about: dict[str, Any], name: str, d: dict[str, Any], overrides: dict[str, Any]) -> int:
    """A batch deployment on Fargate: RunTask as its schedule's role, then its task's container from the image's
    staged build context, as its task role (servestack/local/ecs/tasks.py)."""
    from servestack.local.ecs import run_as_schedule

    return run_as_schedule(about, name, d, overrides)
