"""Test fixtures: the AWS resources a handler needs, created directly on an emulator for tests (and benches)
that exercise one handler against moto without the CDK app. `local up` itself never uses this: it creates
what the synthesized templates declare (servestack/local/stack/provisioning.py).

Name rule used here: for deployment `<d>`, `resource = servestack-<d>`;
bucket `servestack-<d>`; async queue `servestack-<d>-jobs`, its DLQ `servestack-<d>-dlq`, job table
`servestack-<d>-jobs`; S3 prefixes `async/servestack-<d>/requests/` (uploads under `.../requests/uploads/`)
and `async/servestack-<d>/results/`; batch prefixes from serving.yaml, default `batch/servestack-<d>/input/`
and `.../output/`. `environment()` gives the `SERVESTACK_*` variables the handler of each mode reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from servestack.spec import (
    AsyncDeployment,
    BatchDeployment,
    Deployment,
    RealtimeDeployment,
    ServerlessDeployment,
    ServingSpec,
)

HANDLERS = {
    "serverless": "servestack.adapters.serverless.handler",
    "async-submit": "servestack.adapters.asynchronous.submit_handler",
    "async-worker": "servestack.adapters.asynchronous.worker_handler",
    "batch": "servestack.adapters.batch.handler",
}


@dataclass(frozen=True)
class Names:
    deployment: str
    resource: str
    bucket: str
    queue: str
    dlq: str
    table: str
    request_prefix: str
    result_prefix: str
    input_prefix: str
    output_prefix: str

    @property
    def upload_prefix(self) -> str:
        return f"{self.request_prefix}uploads/"


def names(deployment: str, d: Deployment | None = None) -> Names:
    """Every physical name of `deployment`, by the rule in this module's docstring."""
    resource = f"servestack-{deployment}"
    batch = d if isinstance(d, BatchDeployment) else None
    return Names(
        deployment=deployment,
        resource=resource,
        bucket=resource,
        queue=f"{resource}-jobs",
        dlq=f"{resource}-dlq",
        table=f"{resource}-jobs",
        request_prefix=f"async/{resource}/requests/",
        result_prefix=f"async/{resource}/results/",
        input_prefix=(batch.input_prefix if batch and batch.input_prefix else f"batch/{resource}/input/"),
        output_prefix=(batch.output_prefix if batch and batch.output_prefix else f"batch/{resource}/output/"),
    )


def function_names(deployment: str, d: Deployment) -> dict[str, str]:
    """The Lambda function names `lambda.invoke` answers to locally, each -> the function that runs.

    serverless `<d>`: its handler; async `<d>` (or `<d>-submit`): the submit/status API handler, and
    `<d>-worker`: the SQS worker; batch `<d>`: the batch handler. Realtime deployments have none.
    """
    if isinstance(d, ServerlessDeployment | BatchDeployment):
        return {deployment: deployment}
    if isinstance(d, AsyncDeployment):
        submit, worker = f"{deployment}-submit", f"{deployment}-worker"
        return {deployment: submit, submit: submit, worker: worker}
    return {}


def visibility_timeout_sec(d: AsyncDeployment) -> int:
    """AWS's guidance, as the CDK construct applies it: 6x the function timeout plus the batching window."""
    return 6 * d.timeout_sec + d.batch_window_sec


def model_ref(spec: ServingSpec, deployment: str) -> str:
    d = spec.deployments[deployment]
    return spec.model(d.model, d.version).key


def environment(spec: ServingSpec, deployment: str, *, queue_url: str = "") -> dict[str, str]:
    """The `SERVESTACK_*` variables the deployment's Lambda handlers get (as stacks/*.py set them)."""
    d = spec.deployments[deployment]
    n = names(deployment, d)
    env = {
        "SERVESTACK_DEFAULT_MODEL": d.model,
        "SERVESTACK_MAX_PAYLOAD_BYTES": str(d.max_payload_bytes),
        "POWERTOOLS_SERVICE_NAME": "servestack",
    }
    if isinstance(d, RealtimeDeployment):  # as servestack/cdk/realtime.py sets them on the SageMaker model
        env |= {
            "SERVESTACK_MAX_BATCH_SIZE": str(d.batching.max_batch_size),
            "SERVESTACK_MAX_DELAY_MS": str(d.batching.max_delay_ms),
            "SERVESTACK_MAX_QUEUE_REQUESTS": str(d.batching.max_queue),
        }
    if isinstance(d, AsyncDeployment):
        env |= {
            "SERVESTACK_BUCKET": n.bucket,
            "SERVESTACK_REQUEST_PREFIX": n.request_prefix,
            "SERVESTACK_RESULT_PREFIX": n.result_prefix,
            "SERVESTACK_QUEUE_URL": queue_url,
            # The DLQ sits next to the queue (same account and endpoint), named by the rule above.
            "SERVESTACK_DEAD_LETTER_QUEUE_URL": f"{queue_url.rsplit('/', 1)[0]}/{n.dlq}" if queue_url else "",
            "SERVESTACK_JOBS_TABLE": n.table,
            "SERVESTACK_RESULT_TTL_DAYS": str(d.result_ttl_days),
            "SERVESTACK_PRESIGN_THRESHOLD_BYTES": str(d.presign_threshold_bytes),
            "SERVESTACK_MAX_RECEIVE_COUNT": str(d.max_receive_count),
        }
    if isinstance(d, BatchDeployment):
        env |= {
            "SERVESTACK_BATCH_DEPLOYMENT": deployment,
            "SERVESTACK_BATCH_BUCKET": n.bucket,
            "SERVESTACK_BATCH_INPUT_PREFIX": n.input_prefix,
            "SERVESTACK_BATCH_OUTPUT_PREFIX": n.output_prefix,
            "SERVESTACK_BATCH_MODEL": model_ref(spec, deployment),
        }
    return env


def scheduler_payload(spec: ServingSpec, deployment: str) -> dict[str, Any]:
    """The input EventBridge Scheduler sends to the batch Lambda (servestack/cdk/batch.py builds the same)."""
    n = names(deployment, spec.deployments[deployment])
    return {
        "deployment": n.resource,
        "bucket": n.bucket,
        "input_prefix": n.input_prefix,
        "output_prefix": n.output_prefix,
        "model": spec.deployments[deployment].model,
    }


def ensure_bucket(s3: Any, bucket: str) -> None:
    """Create (idempotently) a versioned bucket, as the CDK artifact bucket is."""
    try:
        s3.head_bucket(Bucket=bucket)
    except Exception:
        s3.create_bucket(Bucket=bucket)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})


def ensure_async(
    clients: dict[str, Any], deployment: str, d: AsyncDeployment, *, visibility_timeout: int | None = None
) -> str:
    """Bucket, DLQ, queue with redrive, job table with TTL, S3 notification on uploads. Returns the queue URL."""
    n = names(deployment, d)
    s3, sqs, ddb = clients["s3"], clients["sqs"], clients["dynamodb"]
    ensure_bucket(s3, n.bucket)
    dlq_url = sqs.create_queue(QueueName=n.dlq, Attributes={"MessageRetentionPeriod": str(14 * 86_400)})["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    redrive = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": str(d.max_receive_count)})
    attributes = {
        "VisibilityTimeout": str(visibility_timeout if visibility_timeout is not None else visibility_timeout_sec(d)),
        "MessageRetentionPeriod": str(4 * 86_400),
        "RedrivePolicy": redrive,
    }
    queue_url = str(sqs.create_queue(QueueName=n.queue)["QueueUrl"])
    sqs.set_queue_attributes(QueueUrl=queue_url, Attributes=attributes)
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    try:
        ddb.create_table(
            TableName=n.table,
            KeySchema=[{"AttributeName": "job_id", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "job_id", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        ddb.get_waiter("table_exists").wait(TableName=n.table, WaiterConfig={"Delay": 1, "MaxAttempts": 30})
        ddb.update_time_to_live(
            TableName=n.table, TimeToLiveSpecification={"Enabled": True, "AttributeName": "expires_at"}
        )
    except ddb.exceptions.ResourceInUseException:
        pass
    s3.put_bucket_notification_configuration(
        Bucket=n.bucket,
        NotificationConfiguration={
            "QueueConfigurations": [
                {
                    "QueueArn": queue_arn,
                    "Events": ["s3:ObjectCreated:*"],
                    "Filter": {"Key": {"FilterRules": [{"Name": "prefix", "Value": n.upload_prefix}]}},
                }
            ]
        },
    )
    return queue_url


def ensure_all(
    clients: dict[str, Any], spec: ServingSpec, *, visibility_timeout: int | None = None
) -> dict[str, dict[str, str]]:
    """Create what every deployment needs; returns `{deployment: {"queue_url": ..., "dlq_url": ...}}`."""
    created: dict[str, dict[str, str]] = {}
    for name, d in spec.deployments.items():
        if isinstance(d, AsyncDeployment):
            url = ensure_async(clients, name, d, visibility_timeout=visibility_timeout)
            dlq = clients["sqs"].get_queue_url(QueueName=names(name, d).dlq)["QueueUrl"]
            created[name] = {"queue_url": url, "dlq_url": dlq}
        elif isinstance(d, BatchDeployment):
            ensure_bucket(clients["s3"], names(name, d).bucket)
            created[name] = {}
    return created
