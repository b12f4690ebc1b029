"""`servestack local run-batch` for an `engine: transform` deployment: a SageMaker Batch Transform job, emulated.

What the schedule's CreateTransformJob request asks for, done here as SageMaker does it:
- `InstanceCount` local `serve` workers of the model's container (its environment, its model data, and what
  SageMaker sets in a transform job: `SAGEMAKER_BATCH=true`, `SAGEMAKER_MAX_PAYLOAD_IN_MB`, ...);
- each input object under the `S3Uri` prefix goes to one worker (objects spread over instances), cut at
  newlines into mini-batches of whole lines of at most `MaxPayloadInMB` (`SplitType: Line`,
  `BatchStrategy: MultiRecord`), posted to `/invocations` in order, at most `MaxConcurrentTransforms` objects
  at once per worker; a line longer than the payload limit, or a mini-batch the container refuses, fails the
  job, and an object is written only when every mini-batch of it succeeded;
- the answers, joined (`AssembleWith: Line`), are written to `<S3OutputPath>/<key below the prefix>.out`.
Before the job runs, it is created as the schedule creates it in AWS: Scheduler's execution id put in
`TransformJobName`, then `CreateTransformJob` on local up's SageMaker API
(servestack/local/sagemaker/transform_jobs.py),
signed with the keys of the schedule's role, so that role's grant (`sagemaker:CreateTransformJob` on the job's
ARN) is checked and the request validated as SageMaker does; a refusal stops the run before anything ran.
(The schedule role's iam:PassRole grant is not checked: whether SageMaker checks it at CreateTransformJob, the
model's role having been passed at CreateModel, is not verified.)
The job's record is InProgress while it runs, then Completed or Failed with the reason (DescribeTransformJob).
The S3 reads and writes are made with the keys of the model's execution role, so the template's grants are
checked as in AWS: the model's data first, fetched from its `ModelDataUrl` and unpacked under the job's own
`/opt/ml/model` as a realtime variant's is (servestack/local/sagemaker/model_data.py); a role that cannot read it fails
the job with SageMaker's download failure reason. When the job ends, SageMaker's "SageMaker Transform Job State
Change" event goes to the function the stack's rule targets (the manifest step), through the local Lambda API,
as EventBridge would.
The local scheduler fires transform schedules the same way (servestack/local/up/services.py: create, then execute_job).
"""

from __future__ import annotations

import json
import os
import secrets
import string
import sys
import tempfile
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servestack.local.batch import print_manifest
from servestack.local.hosting import RealtimeProcess, free_port, without_identity
from servestack.local.sagemaker.model_data import ModelDataError

MIB = 1024 * 1024
CONTAINER_MODEL_DIR = "/opt/ml/model"  # where SageMaker unpacks a model's data in its container
EXECUTION_ID = "<aws.scheduler.execution-id>"
# EventBridge Scheduler's execution id: 16 lower-case letters and digits (its User Guide's example of the
# context attribute is "d32c5kddcf5bb8c3").
EXECUTION_ID_ALPHABET = string.ascii_lowercase + string.digits


class TransformFailed(Exception):
    """The job failed, as SageMaker would report it (FailureReason)."""


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str

    @classmethod
    def parse(cls, uri: str) -> S3Location:
        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        return cls(bucket, prefix)


def mini_batches(body: bytes, limit_bytes: int) -> list[bytes]:
    """Whole lines, packed in order into pieces of at most `limit_bytes` (SplitType Line, MultiRecord)."""
    pieces: list[bytes] = []
    start = 0
    while start < len(body):
        end = min(start + limit_bytes, len(body))
        if end < len(body):
            cut = body.rfind(b"\n", start, end)
            if cut < start:
                raise TransformFailed(f"a record is larger than MaxPayloadInMB ({limit_bytes // MIB} MB)")
            end = cut + 1
        pieces.append(body[start:end])
        start = end
    return pieces


def post(url: str, body: bytes, content_type: str, timeout_sec: float) -> bytes:
    import httpx

    response = httpx.post(
        f"{url}/invocations", content=body, headers={"Content-Type": content_type}, timeout=timeout_sec
    )
    if response.status_code != 200:
        detail = response.content[:500].decode(errors="replace")
        raise TransformFailed(f"the container answered {response.status_code} to a mini-batch: {detail}")
    return response.content


def assembled(answers: list[bytes]) -> bytes:
    """AssembleWith Line: the answers in order, each ending with a newline."""
    return b"".join(a if a.endswith(b"\n") or not a else a + b"\n" for a in answers)


def execution_id() -> str:
    return "".join(secrets.choice(EXECUTION_ID_ALPHABET) for _ in range(16))


def role_client(about: dict[str, Any], role: str, service: str, **options: Any) -> Any:
    """A boto3 client for `service` signing with the keys local up gave `role` (a role name or ARN; the state
    file's identities), with `options` as `Session.client` takes them (endpoint_url, config)."""
    from servestack.failures import CommandError
    from servestack.local.emulator import session_client

    keys = about["identities"].get(role.rsplit("/", 1)[-1])
    if keys is None:
        raise CommandError(f"{role}: no keys for this role in the state file; restart `servestack local up`")
    return session_client(
        service,
        aws_access_key_id=keys["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=keys["AWS_SECRET_ACCESS_KEY"],
        aws_session_token=keys.get("AWS_SESSION_TOKEN"),
        region_name=about.get("region", "us-east-1"),
        **options,
    )


class JobRefused(Exception):
    """SageMaker refused CreateTransformJob (AccessDenied, a ValidationException...): `code: message`."""

    def __init__(self, job_name: str, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.job_name = job_name


def create_job(about: dict[str, Any], transform: dict[str, Any]) -> dict[str, Any]:
    """CreateTransformJob as the schedule's role, with the schedule's input and a fresh execution id, on local
    up's SageMaker API: the request as SageMaker accepted it; raises JobRefused with SageMaker's answer."""
    from botocore.config import Config
    from botocore.exceptions import ClientError

    request = json.loads(json.dumps(transform["job"]).replace(EXECUTION_ID, execution_id()))
    config = Config(retries={"mode": "standard", "max_attempts": 1})
    sagemaker = role_client(about, transform["scheduler_role"], "sagemaker", endpoint_url=about["aws_api_url"],
                            config=config)  # fmt: skip
    try:
        sagemaker.create_transform_job(**request)
    except ClientError as error:
        refusal = error.response["Error"]
        raise JobRefused(request["TransformJobName"], refusal.get("Code", "?"), refusal.get("Message", "")) from None
    finally:
        sagemaker.close()
    return dict(request)


def report_end(about: dict[str, Any], job_name: str, status: str, reason: str) -> None:
    """Tell local up the job ended, so DescribeTransformJob reports it (local up's own route, not an AWS API)."""
    from servestack.local.emulator import developer, signed
    from servestack.local.sagemaker.transform_jobs import REPORT_PREFIX

    # local up's own route answers only the developer's signature (any caller could end a job otherwise)
    status_code, answer = signed(
        "POST", f"{about['aws_api_url']}{REPORT_PREFIX}{job_name}", developer(about), str(about.get("region") or
        "us-east-1"), body=json.dumps({"status": status, "reason": reason}).encode(),
        headers={"Content-Type": "application/json"}, service="sagemaker", timeout_sec=30,
    )  # fmt: skip
    if status_code != 200:
        print(f"transform job {job_name}: local up did not record its end: {answer[:300]!r}", file=sys.stderr)


def run_transform(
    about: dict[str, Any], name: str, transform: dict[str, Any], developer: tuple[Any, Any], workers: int | None = None
) -> int:
    """One transform job created as the schedule creates it, emulated, then the manifest step (invoked with
    `developer`, the CLI's boto3 session and config, as EventBridge would); prints the manifest's location and a
    summary."""
    from servestack.failures import CommandError, ExitCode

    try:
        job = create_job(about, transform)
    except JobRefused as refused:  # stops the command with one line, as the CLI's other AWS refusals do
        raise CommandError(
            f"{name}: the schedule's role {transform['scheduler_role']} cannot create transform job "
            f"{refused.job_name}: {refused}",
            ExitCode.AWS,
        ) from None
    return execute_job(about, name, transform, job, developer, workers)


def execute_job(
    about: dict[str, Any],
    name: str,
    transform: dict[str, Any],
    job: dict[str, Any],
    developer: tuple[Any, Any],
    workers: int | None = None,
) -> int:
    """The emulation of a created job (`job`: its CreateTransformJob request), its end reported to local up, then
    the manifest step."""
    from botocore.config import Config

    job_name = str(job["TransformJobName"])
    config = Config(s3={"addressing_style": "path"}, retries={"mode": "standard", "max_attempts": 3})
    s3 = role_client(about, transform["execution_role"], "s3", endpoint_url=about["endpoint_url"], config=config)
    source = S3Location.parse(job["TransformInput"]["DataSource"]["S3DataSource"]["S3Uri"])
    output = S3Location.parse(job["TransformOutput"]["S3OutputPath"])
    content_type = str(job["TransformInput"].get("ContentType", "application/jsonlines"))
    limit = int(job.get("MaxPayloadInMB", 6)) * MIB
    concurrency = int(job.get("MaxConcurrentTransforms", 1))
    timeout_sec = float((job.get("ModelClientConfig") or {}).get("InvocationsTimeoutInSeconds", 600))
    count = workers or int(job["TransformResources"]["InstanceCount"])
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
        **transform["environment"],
        "SAGEMAKER_BATCH": "true",
        "SAGEMAKER_BATCH_STRATEGY": "MULTI_RECORD",
        "SAGEMAKER_MAX_PAYLOAD_IN_MB": str(limit // MIB),
        "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS": str(concurrency),
    }
    processes: list[RealtimeProcess] = []
    scratch = tempfile.TemporaryDirectory(prefix=f"{job_name}-")  # the job's instance storage
    status, reason = "Completed", ""
    try:
        keys = [
            obj["Key"]
            for page in s3.get_paginator("list_objects_v2").paginate(Bucket=source.bucket, Prefix=source.prefix)
            for obj in page.get("Contents", [])
            if not obj["Key"].endswith("/")
        ]
        url = transform.get("model_data_url")
        if url:  # SageMaker downloads the model with the execution role before the instances start
            role = str(
                (about["identities"].get(transform["execution_role"]) or {}).get("arn", transform["execution_role"])
            )
            environment = with_model_data(environment, s3, str(url), scratch.name, role)
        print(f"{name}: transform job {job_name}: {len(keys)} objects over {count} local workers", file=sys.stderr)
        for index in range(count):
            processes.append(
                RealtimeProcess.start(  # the job's environment, never this process's AWS identity
                    f"{name}/transform-{index}",
                    free_port(),
                    env=environment,
                    output=sys.stderr.fileno(),
                    base_env=without_identity(os.environ),
                )
            )
        for process in processes:
            process.wait_ready(timeout_sec=120)
        failures: list[str] = []
        lock = threading.Lock()

        def transform_object(index: int, key: str) -> None:
            url = processes[index % count].url
            try:
                body = s3.get_object(Bucket=source.bucket, Key=key)["Body"].read()
                answers = [post(url, piece, content_type, timeout_sec) for piece in mini_batches(body, limit)]
                relative = key.removeprefix(source.prefix)
                target = f"{output.prefix.rstrip('/')}/{relative}.out" if output.prefix else f"{relative}.out"
                s3.put_object(Bucket=output.bucket, Key=target, Body=assembled(answers))
            except Exception as error:  # the job's FailureReason names the object, as SageMaker's does
                with lock:
                    failures.append(f"{key}: {error}")

        with ThreadPoolExecutor(max_workers=count * concurrency) as pool:
            list(pool.map(transform_object, range(len(keys)), keys))
        if failures:
            status, reason = "Failed", "; ".join(sorted(failures))[:1024]
    except (TransformFailed, ModelDataError) as error:
        status, reason = "Failed", str(error)
    except Exception as error:  # the execution role may not list the input (AccessDenied): the job fails
        status, reason = "Failed", str(error)[:1024]
    finally:
        for process in processes:
            process.stop()
        scratch.cleanup()
    print(f"{name}: transform job {job_name} {status}{': ' + reason if reason else ''}", file=sys.stderr)
    report_end(about, job_name, status, reason)
    return _job_ended(about, name, transform, job_name, status, reason, developer)


def with_model_data(environment: dict[str, str], s3: Any, url: str, root: str, role: str) -> dict[str, str]:
    """`environment` with /opt/ml/model (and paths below it) pointing at the model data fetched from `url` with
    the client `s3` (signed as the execution role `role`) into `root`; ModelDataError when it cannot be."""
    from servestack.local.sagemaker.model_data import fetch_model_data

    model_dir = fetch_model_data(
        s3, url, Path(root) / CONTAINER_MODEL_DIR.lstrip("/"), role=role, compressed=not url.endswith("/")
    )
    return {
        key: str(model_dir) + value[len(CONTAINER_MODEL_DIR) :]
        if value == CONTAINER_MODEL_DIR or value.startswith(CONTAINER_MODEL_DIR + "/")
        else value
        for key, value in environment.items()
    }


def state_change_event(job: dict[str, Any], job_name: str, status: str, reason: str, region: str) -> dict[str, Any]:
    """EventBridge's "SageMaker Transform Job State Change" event (its detail is DescribeTransformJob's shape)."""
    from servestack.local.cloudformation import ACCOUNT

    account = ACCOUNT  # the account of every local ARN (DescribeTransformJob's ARN is the same)
    detail: dict[str, Any] = {
        "TransformJobName": job_name,
        "TransformJobArn": f"arn:aws:sagemaker:{region}:{account}:transform-job/{job_name.lower()}",
        "TransformJobStatus": status,
        "ModelName": job.get("ModelName"),
        "TransformInput": job.get("TransformInput"),
        "TransformOutput": job.get("TransformOutput"),
        "TransformResources": job.get("TransformResources"),
    }
    if reason:
        detail["FailureReason"] = reason
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "SageMaker Transform Job State Change",
        "source": "aws.sagemaker",
        "account": account,
        "region": region,
        "resources": [detail["TransformJobArn"]],
        "detail": detail,
    }


def _job_ended(
    about: dict[str, Any],
    name: str,
    transform: dict[str, Any],
    job_name: str,
    status: str,
    reason: str,
    developer: tuple[Any, Any],
) -> int:
    if transform.get("on_end") is None:
        print(f"{name}: no function handles the job's end; no manifest", file=sys.stderr)
        return 0 if status == "Completed" else 1
    event = state_change_event(transform["job"], job_name, status, reason, about.get("region", "us-east-1"))
    session, config = developer
    lambdas = session.client("lambda", endpoint_url=about["aws_api_url"], config=config)
    response = lambdas.invoke(FunctionName=transform["on_end"], Payload=json.dumps(event).encode())
    answer = json.loads(response["Payload"].read() or b"null")
    if response.get("FunctionError") or status != "Completed":
        message = answer.get("errorMessage") if isinstance(answer, dict) else answer
        print(f"{name}: the run failed: {message}", file=sys.stderr)
        return 1
    print_manifest(session, config, about, answer["manifest"])
    return 0
