"""Batch mode: `handler` runs on an EventBridge Scheduler payload (Lambda) or from the CLI / Fargate task;
`transform_done` runs after a SageMaker Batch Transform job (engine: transform) and writes its manifest.

Payload (servestack/cdk/batch.py sends it): `{"deployment", "bucket", "input_prefix", "output_prefix", "model"}`,
optionally `"strict"`, `"chunk_rows"`, `"output_format"` (jsonl or parquet), `"max_record_bytes"` and
`"id_column"`. Missing keys fall back to the `SERVESTACK_BATCH_*` environment (what the Fargate task gets), so an
EventBridge rule's plain "Scheduled Event" works too. The scoring itself (chunks, parts, manifest, resume, error
file) is `servestack.inference.tabular.BatchJob`; this module is its S3 store.
"""

from __future__ import annotations

import gc

# The Fargate task's start-up (`python -m handlers.batch`, or this module run the same way) imports its modules
# with garbage collection off: the ~100 collections they set off find nothing (modules, classes, functions live as
# long as the task) and cost ~0.03 CPU s. `main` sets those objects aside for good (`gc.freeze`) and turns
# collection back on.
if __name__ == "__main__":
    gc.disable()

import base64
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from aws_lambda_powertools import Logger
from botocore.exceptions import ClientError

from servestack.adapters.aws.clients import aws_client
from servestack.inference.errors import InternalError, NoInput, ServingError
from servestack.inference.service import ModelRepository, parse_target
from servestack.inference.settings import EnvironmentSettings, ServingSettings
from servestack.inference.tabular import MAX_RECORD_BYTES, BatchJob, Progress, StoredObject

logger = Logger(service="servestack")


BATCH_PREFIX = "SERVESTACK_BATCH_"
# The Fargate task's exit codes (docs/batch.md): a run with nothing under its input prefix exits EX_NOINPUT of
# sysexits.h ("an input file did not exist or was not readable"), any other failure 1; ECS reports either as the
# container's exitCode, which the deployment's failure alarm counts (servestack/cdk/batch.py).
EXIT_NO_INPUT = 66
EXIT_FAILED = 1
# A line of 64 MiB already costs ~1.5 GB to parse on the line-by-line path: more would not fit the smaller jobs.
MAX_RECORD_BYTES_CEILING = 64 * 1024 * 1024
# pyarrow's allocator in the task's process. Its default, mimalloc, handed each chunk's freed buffers back to the
# kernel and faulted them in again for the next chunk, as 2 MiB huge pages zeroed whole: in perf, a third of a
# Parquet job's CPU was the kernel clearing those pages. glibc's malloc keeps freed buffers for the next chunk
# (three paired runs of a 1,000,000-row Parquet job on one core: 0.4-1.0 CPU s less). Read by Arrow when pyarrow first
# allocates, so set before any import of it; a task definition that sets the variable keeps its own.
ARROW_MEMORY_POOL = "system"


class BatchSettings(EnvironmentSettings, frozen=True, kw_only=True):
    """One batch run; the scheduler payload's keys override these `SERVESTACK_BATCH_*` defaults."""

    deployment: str = ""
    bucket: str
    input_prefix: str
    output_prefix: str
    model: str | None = None
    chunk_rows: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 10_000
    strict: bool = False
    output_format: Literal["jsonl", "parquet"] = "jsonl"
    # Which objects under the input prefix are input: by default every suffix servestack.inference.tabular reads; a
    # transform
    # job has one content type, jsonl unless set.
    input_format: Literal["jsonl", "csv", "parquet"] | None = None
    # A longer line is an error row, never read whole (servestack/inference/tabular/rows.py says why 1 MiB).
    max_record_bytes: Annotated[int, msgspec.Meta(ge=1024, le=MAX_RECORD_BYTES_CEILING)] = MAX_RECORD_BYTES
    # A column of the input copied to each output row, to join predictions back (models with named columns);
    # without it, a row is known by its file and line.
    id_column: str | None = None


BLOCK_BYTES = 8 * 1024 * 1024


class S3Store:
    """`servestack.inference.tabular.Store` on one S3 bucket, streaming reads in blocks."""

    def __init__(self, bucket: str, client: Any = None) -> None:
        self.bucket = bucket
        self.s3 = client or aws_client("s3")

    def list(self, prefix: str) -> list[StoredObject]:
        found: list[StoredObject] = []
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                found.append(StoredObject(obj["Key"], int(obj["Size"]), str(obj["ETag"]).strip('"')))
        return found

    def blocks(self, key: str) -> Iterator[bytes]:
        body = self.s3.get_object(Bucket=self.bucket, Key=key)["Body"]
        try:
            yield from body.iter_chunks(chunk_size=BLOCK_BYTES)
        finally:
            body.close()

    def download(self, key: str, path: Path) -> None:
        with path.open("wb") as out:
            for block in self.blocks(key):
                out.write(block)

    def get(self, key: str) -> bytes:
        return bytes(self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read())

    def metadata(self, key: str) -> dict[str, str] | None:
        try:
            return dict(self.s3.head_object(Bucket=self.bucket, Key=key)["Metadata"])
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise

    def put(self, key: str, body: bytes, metadata: dict[str, str], *, sha256: str | None = None) -> None:
        # With the part's sha256 as its checksum, S3 refuses a body that arrived different (BadDigest), and
        # botocore sends it instead of computing a CRC32 of the body on the job's core.
        checksum = {"ChecksumSHA256": base64.b64encode(bytes.fromhex(sha256)).decode()} if sha256 else {}
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=body, Metadata=metadata, **checksum)

    def delete(self, key: str) -> None:
        self.s3.delete_object(Bucket=self.bucket, Key=key)


def run_batch(
    settings: BatchSettings,
    *,
    on_progress: Callable[[Progress], None] | None = None,
    store: Any = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Score one scheduled run; returns the manifest written next to the parts. `progress`, when given, is
    the run's (rows, rows/s from the start of the run, after the model loaded)."""
    # From the environment, as every other handler: SERVESTACK_DEFAULT_MODEL and SERVESTACK_MODEL_DIR are set by
    # the stack (and by local up), so a model other than the default `digits` loads.
    serving = ServingSettings.from_environment(max_batch_rows=max(settings.chunk_rows, 10_000))
    repository = ModelRepository(serving)
    repository.load_all(only=parse_target(settings.model, serving.default_model)[0])
    job = BatchJob(
        store=store or S3Store(settings.bucket),
        model=repository.resolve(settings.model),
        input_prefix=settings.input_prefix,
        output_prefix=settings.output_prefix,
        deployment=settings.deployment,
        chunk_rows=settings.chunk_rows,
        strict=settings.strict,
        output_format=settings.output_format,
        input_format=settings.input_format,
        max_record_bytes=settings.max_record_bytes,
        id_column=settings.id_column or None,
        on_progress=on_progress,
        progress=progress or Progress(),
    )
    return job.run()


def _log_progress(progress: Progress) -> None:
    logger.info(
        "batch progress",
        extra={"rows": progress.rows, "errors": progress.errors, "parts": progress.parts_done,
               "skipped": progress.parts_skipped, "rows_per_sec": round(progress.rows_per_sec)},
    )  # fmt: skip


def settings_from(payload: dict[str, Any]) -> BatchSettings:
    """The run's settings: payload keys over `SERVESTACK_BATCH_*` (a plain scheduled event carries none)."""
    overrides = {k: v for k, v in payload.items() if k in BatchSettings.__struct_fields__ and v is not None}
    return BatchSettings.from_environment(prefix=BATCH_PREFIX, **overrides)


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    settings = settings_from(event)
    manifest = run_batch(settings, on_progress=_log_progress)
    logger.info("batch done", extra={"rows": manifest["rows"], "parts": len(manifest["parts"])})
    return {"manifest": f"s3://{settings.bucket}/{settings.output_prefix}manifest.json", "rows": manifest["rows"]}


@logger.inject_lambda_context(clear_state=True)
def transform_done(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """EventBridge's "SageMaker Transform Job State Change" for this deployment's job (the rule matches its
    name prefix and the final states): on Completed, write the manifest and the error file; on Failed or
    Stopped, raise with SageMaker's reason, which the failure alarm counts."""
    from servestack.inference.manifest import read_manifest
    from servestack.inference.tabular.transform import assemble

    detail = event.get("detail") or {}
    job, status = str(detail.get("TransformJobName", "")), str(detail.get("TransformJobStatus", ""))
    if status != "Completed":
        raise InternalError(f"transform job {job} ended {status}: {detail.get('FailureReason') or 'no reason given'}")
    settings = settings_from({})
    serving = ServingSettings.from_environment()
    package = _package_dir(serving.model_dir, settings.model or serving.default_model)
    manifest = assemble(
        S3Store(settings.bucket),
        read_manifest(package),
        deployment=settings.deployment,
        input_prefix=settings.input_prefix,
        output_prefix=settings.output_prefix,
        job=job,
        input_format=settings.input_format or "jsonl",
    )
    logger.info("transform assembled", extra={"job": job, "rows": manifest["rows"], "parts": len(manifest["parts"])})
    return {"manifest": f"s3://{settings.bucket}/{settings.output_prefix}manifest.json", "rows": manifest["rows"]}


def _package_dir(model_dir: Path, name: str) -> Path:
    """The model's package in the bundle (its manifest names the model in the batch manifest)."""
    if (model_dir / "manifest.json").is_file():
        return model_dir
    versions = sorted((model_dir / name).glob("*/manifest.json"))
    if not versions:
        raise InternalError(f"{model_dir}: no package of model {name!r} in this bundle")
    from servestack.inference.service import version_order

    return max((path.parent for path in versions), key=lambda folder: version_order(folder.name))


def main() -> int:
    """The Fargate task's entry (`python -m handlers.batch`, servestack/cdk/batch.py FARGATE_COMMAND): one
    run with the `SERVESTACK_BATCH_*` settings the task definition sets. Its last line is its outcome, one JSON
    object: the manifest's location and rows, or `{"error": {"type", "message"}, "exit_code"}`. A failed run exits
    non-zero, which ECS reports: EXIT_NO_INPUT for an empty input prefix, EXIT_FAILED otherwise. An expected
    failure (servestack's own errors: no input, a setting it cannot use, a strict run's bad row) is that one line,
    no traceback; an unexpected one (a bug, an AWS call that failed) keeps Python's traceback."""
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", ARROW_MEMORY_POOL)
    gc.freeze()  # what the imports made (collection off meanwhile: see the top of this module)
    gc.enable()
    try:
        return _run_task()
    finally:
        # The process ends next. Python's shutdown searches every object still alive for garbage cycles (the
        # imported modules, botocore's service model, onnxruntime's and Arrow's objects): ~0.2 CPU s of a one-core
        # 1,000,000-row Parquet job (8 interleaved pairs: 2.11 -> 1.88 CPU s, median). Frozen, they are left to
        # the exit to free; objects are still freed as their last reference goes, only the search is skipped.
        gc.freeze()


def _run_task() -> int:
    """`main`'s run: its outcome line and exit code."""
    try:
        settings = settings_from({})
    except ServingError as error:
        return _failed(error)
    progress = Progress()
    try:
        store = S3Store(settings.bucket)
        # The S3 client's service model and endpoint rules (tens of thousands of objects, made with collection
        # paused) live as long as the task: set aside too, so the run's collections do not search them again.
        gc.freeze()
        manifest = run_batch(settings, on_progress=_log_progress, progress=progress, store=store)
    except ServingError as error:
        if isinstance(error, InternalError):  # a check of servestack's own failed: its traceback is the report
            raise
        return _failed(error, bucket=settings.bucket)
    logger.info("batch done", extra={"rows": manifest["rows"], "parts": len(manifest["parts"])})
    run_seconds = round(time.perf_counter() - progress.started, 3)  # after start-up: what bench/batch_job.py reads
    print(json.dumps({"manifest": f"s3://{settings.bucket}/{settings.output_prefix}manifest.json",
                      "rows": manifest["rows"], "run_seconds": run_seconds,
                      "startup_cpu_seconds": round(progress.started_cpu, 3)}))  # fmt: skip
    return 0


def _failed(error: ServingError, bucket: str | None = None) -> int:
    """The task's outcome line for an expected failure, and its exit code."""
    code = EXIT_NO_INPUT if isinstance(error, NoInput) else EXIT_FAILED
    message = error.message
    if isinstance(error, NoInput) and bucket:  # the job knows its prefix, its store the bucket: name both
        message = message.replace(f"under {error.value}", f"under s3://{bucket}/{error.value}", 1)
    print(json.dumps({"error": {"type": error.error_type, "message": message}, "exit_code": code}), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
