"""Which call is it: from an HTTP request to an AWS endpoint, the (action, resource ARN, context keys) that
AWS authorizes for it.

The service is the SigV4 credential scope's (its signing name: `s3`, `sqs`, `monitoring` for CloudWatch,
`sagemaker` for SageMaker Runtime). Actions and resources follow the Service Authorization Reference
("Actions, resources, and condition keys for <service>") and each service's API reference; the choices a
reader might doubt are commented where they are made. Covered, because servestack's code makes these calls:

- S3 (rest-xml, path-style `/{bucket}/{key}`, as canonical.py puts every S3 request, virtual-hosted ones
  included): object Get/Head (`s3:GetObject`, `s3:GetObjectVersion` with `versionId`), Put (`s3:PutObject`; a
  copy also needs `s3:GetObject` on the source; `x-amz-tagging`/`x-amz-acl` also need
  `s3:PutObjectTagging`/`s3:PutObjectAcl`), Delete, multipart (create/upload part/complete: `s3:PutObject`;
  abort: `s3:AbortMultipartUpload`; list parts: `s3:ListMultipartUploadParts`), DeleteObjects (POST
  `?delete`: `s3:DeleteObject` per key, each decided on its own as S3 does), List/ListV2/HeadBucket
  (`s3:ListBucket` on the bucket with `s3:prefix`, `s3:delimiter`, `s3:max-keys`), ListObjectVersions
  (`s3:ListBucketVersions`), ListBuckets, CreateBucket, DeleteBucket and the bucket subresources
  (`?notification`, `?versioning`, `?policy`, `?tagging`, `?lifecycle`, ...).
- SQS (JSON protocol, `X-Amz-Target: AmazonSQS.<Op>`, and the query protocol's `Action=`): `sqs:<Op>` on the
  queue ARN from `QueueUrl` (or `QueueName`); the `...Batch` operations authorize as their base action.
- DynamoDB (`X-Amz-Target: DynamoDB_20120810.<Op>`): `dynamodb:<Op>` on the table (an index ARN for a Query
  or Scan with `IndexName`); BatchGetItem/BatchWriteItem once per table; TransactGetItems/TransactWriteItems
  as GetItem/PutItem/UpdateItem/DeleteItem/ConditionCheckItem per item.
- SNS (query protocol): `sns:<Op>` on `TopicArn` (PublishBatch is `sns:Publish`).
- STS: GetCallerIdentity (never denied, even by an explicit Deny); AssumeRole (`sts:AssumeRole` on the role).
- CloudWatch (`monitoring`; JSON, query and CBOR protocols): PutMetricData (`cloudwatch:PutMetricData` on
  `*` with `cloudwatch:namespace`), metric reads on `*`, alarm operations on alarm ARNs.
- CloudWatch Logs (`Logs_20140328.<Op>`): log-group operations on `...:log-group:{name}:*`, log-stream
  operations on `...:log-group:{name}:log-stream:{stream}` (the CloudWatch Logs User Guide, "Overview of
  managing access permissions").
- EventBridge (`AWSEvents.<Op>`): rules and event buses.
- SageMaker Runtime (`POST /endpoints/{name}/invocations|async-invocations|invocations-response-stream`):
  `sagemaker:InvokeEndpoint`/`InvokeEndpointAsync`/`InvokeEndpointWithResponseStream` on
  `arn:aws:sagemaker:{region}:{account}:endpoint/{name lower-cased}` (SageMaker ARNs carry lower-case names);
  SageMaker's `DescribeInferenceComponent` and `UpdateInferenceComponentRuntimeConfig` (`X-Amz-Target:
  SageMaker.<Op>`) as `sagemaker:<Op>` on `...:inference-component/{name lower-cased}`; `CreateTransformJob` and
  `DescribeTransformJob` as `sagemaker:<Op>` on `...:transform-job/{TransformJobName lower-cased}` (resource
  type transform-job; iam:PassRole of the model's role is not checked here: not verified that SageMaker checks
  it at CreateTransformJob, the role having been passed at CreateModel).
- Lambda (rest-json, operations recognised from botocore's service model): Invoke and
  InvokeWithResponseStream are `lambda:InvokeFunction` on the function ARN, with the qualifier when one is
  given (`name:alias` or `?Qualifier=`); other operations naming a function are `lambda:<Op>` on it.
- EventBridge Scheduler (rest-json): `scheduler:<Op>` on the schedule (`schedule/{group}/{name}`) or group.
- API Gateway (`execute-api`), an HTTP API with IAM authorization: `execute-api:Invoke` on
  `arn:aws:execute-api:{region}:{account}:{apiId}/{stage}/{METHOD}/{path}`.

A call that is not recognised (or whose resource is not derived) is authorized as `<service>:<Operation or
UnknownOperation>` on `*` with `recognised=False`: a policy scoped to ARNs denies it (fail closed), and the
denial says the call was not recognised.
"""

from __future__ import annotations

import json
import re
import urllib.parse
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from servestack.local.iam.wire import HttpRequest

ContextValues = Mapping[str, str | tuple[str, ...]]


@dataclass(frozen=True)
class Check:
    """One authorization AWS makes for a call."""

    action: str
    resource: str
    context: ContextValues = field(default_factory=dict)


@dataclass(frozen=True)
class Operation:
    """What a request asks for: the operation and the checks it needs."""

    service: str  # the IAM service prefix (`cloudwatch`, not `monitoring`)
    name: str  # the API operation (`GetObject`), or `UnknownOperation`
    checks: tuple[Check, ...]
    recognised: bool = True
    note: str = ""  # why the call was not recognised
    always_allowed: bool = False  # sts:GetCallerIdentity needs no permission
    # S3 DeleteObjects: S3 decides each key on its own and reports the denied ones in the 200 reply.
    delete_keys: tuple[tuple[str, str | None], ...] = ()
    bucket: str | None = None
    key: str | None = None


def unrecognised(service: str, name: str | None, note: str) -> Operation:
    operation = name or "UnknownOperation"
    return Operation(service, operation, (Check(f"{service}:{operation}", "*"),), recognised=False, note=note)


@dataclass(frozen=True)
class Where:
    """The region (from the credential scope) and account the request's ARNs are built in."""

    region: str
    account: str


# ------------------------------------------------------------------------------------------ S3


# subresource -> method -> (operation, action). DELETE of a configuration is authorized as its Put action
# (the Amazon S3 API reference, "Permissions" of each Delete<Configuration> operation).
S3_BUCKET_SUBRESOURCES: dict[str, dict[str, tuple[str, str]]] = {
    "acl": {"GET": ("GetBucketAcl", "s3:GetBucketAcl"), "PUT": ("PutBucketAcl", "s3:PutBucketAcl")},
    "policy": {
        "GET": ("GetBucketPolicy", "s3:GetBucketPolicy"),
        "PUT": ("PutBucketPolicy", "s3:PutBucketPolicy"),
        "DELETE": ("DeleteBucketPolicy", "s3:DeleteBucketPolicy"),
    },
    "policyStatus": {"GET": ("GetBucketPolicyStatus", "s3:GetBucketPolicyStatus")},
    "notification": {
        "GET": ("GetBucketNotificationConfiguration", "s3:GetBucketNotification"),
        "PUT": ("PutBucketNotificationConfiguration", "s3:PutBucketNotification"),
    },
    "versioning": {
        "GET": ("GetBucketVersioning", "s3:GetBucketVersioning"),
        "PUT": ("PutBucketVersioning", "s3:PutBucketVersioning"),
    },
    "location": {"GET": ("GetBucketLocation", "s3:GetBucketLocation")},
    "tagging": {
        "GET": ("GetBucketTagging", "s3:GetBucketTagging"),
        "PUT": ("PutBucketTagging", "s3:PutBucketTagging"),
        "DELETE": ("DeleteBucketTagging", "s3:PutBucketTagging"),
    },
    "lifecycle": {
        "GET": ("GetBucketLifecycleConfiguration", "s3:GetLifecycleConfiguration"),
        "PUT": ("PutBucketLifecycleConfiguration", "s3:PutLifecycleConfiguration"),
        "DELETE": ("DeleteBucketLifecycle", "s3:PutLifecycleConfiguration"),
    },
    "cors": {
        "GET": ("GetBucketCors", "s3:GetBucketCORS"),
        "PUT": ("PutBucketCors", "s3:PutBucketCORS"),
        "DELETE": ("DeleteBucketCors", "s3:PutBucketCORS"),
    },
    "encryption": {
        "GET": ("GetBucketEncryption", "s3:GetEncryptionConfiguration"),
        "PUT": ("PutBucketEncryption", "s3:PutEncryptionConfiguration"),
        "DELETE": ("DeleteBucketEncryption", "s3:PutEncryptionConfiguration"),
    },
    "publicAccessBlock": {
        "GET": ("GetPublicAccessBlock", "s3:GetBucketPublicAccessBlock"),
        "PUT": ("PutPublicAccessBlock", "s3:PutBucketPublicAccessBlock"),
        "DELETE": ("DeletePublicAccessBlock", "s3:PutBucketPublicAccessBlock"),
    },
    "ownershipControls": {
        "GET": ("GetBucketOwnershipControls", "s3:GetBucketOwnershipControls"),
        "PUT": ("PutBucketOwnershipControls", "s3:PutBucketOwnershipControls"),
        "DELETE": ("DeleteBucketOwnershipControls", "s3:PutBucketOwnershipControls"),
    },
    "logging": {"GET": ("GetBucketLogging", "s3:GetBucketLogging"), "PUT": ("PutBucketLogging", "s3:PutBucketLogging")},
    "website": {
        "GET": ("GetBucketWebsite", "s3:GetBucketWebsite"),
        "PUT": ("PutBucketWebsite", "s3:PutBucketWebsite"),
        "DELETE": ("DeleteBucketWebsite", "s3:DeleteBucketWebsite"),
    },
    "replication": {
        "GET": ("GetBucketReplication", "s3:GetReplicationConfiguration"),
        "PUT": ("PutBucketReplication", "s3:PutReplicationConfiguration"),
        "DELETE": ("DeleteBucketReplication", "s3:PutReplicationConfiguration"),
    },
    "object-lock": {
        "GET": ("GetObjectLockConfiguration", "s3:GetBucketObjectLockConfiguration"),
        "PUT": ("PutObjectLockConfiguration", "s3:PutBucketObjectLockConfiguration"),
    },
    "accelerate": {
        "GET": ("GetBucketAccelerateConfiguration", "s3:GetAccelerateConfiguration"),
        "PUT": ("PutBucketAccelerateConfiguration", "s3:PutAccelerateConfiguration"),
    },
    "requestPayment": {
        "GET": ("GetBucketRequestPayment", "s3:GetBucketRequestPayment"),
        "PUT": ("PutBucketRequestPayment", "s3:PutBucketRequestPayment"),
    },
    "intelligent-tiering": {
        "GET": ("GetBucketIntelligentTieringConfiguration", "s3:GetIntelligentTieringConfiguration"),
        "PUT": ("PutBucketIntelligentTieringConfiguration", "s3:PutIntelligentTieringConfiguration"),
        "DELETE": ("DeleteBucketIntelligentTieringConfiguration", "s3:PutIntelligentTieringConfiguration"),
    },
    "analytics": {
        "GET": ("GetBucketAnalyticsConfiguration", "s3:GetAnalyticsConfiguration"),
        "PUT": ("PutBucketAnalyticsConfiguration", "s3:PutAnalyticsConfiguration"),
        "DELETE": ("DeleteBucketAnalyticsConfiguration", "s3:PutAnalyticsConfiguration"),
    },
    "metrics": {
        "GET": ("GetBucketMetricsConfiguration", "s3:GetMetricsConfiguration"),
        "PUT": ("PutBucketMetricsConfiguration", "s3:PutMetricsConfiguration"),
        "DELETE": ("DeleteBucketMetricsConfiguration", "s3:PutMetricsConfiguration"),
    },
    "inventory": {
        "GET": ("GetBucketInventoryConfiguration", "s3:GetInventoryConfiguration"),
        "PUT": ("PutBucketInventoryConfiguration", "s3:PutInventoryConfiguration"),
        "DELETE": ("DeleteBucketInventoryConfiguration", "s3:PutInventoryConfiguration"),
    },
    "uploads": {"GET": ("ListMultipartUploads", "s3:ListBucketMultipartUploads")},
    "versions": {"GET": ("ListObjectVersions", "s3:ListBucketVersions")},
    "delete": {"POST": ("DeleteObjects", "s3:DeleteObject")},
}
# object subresource -> method -> (operation, action, action when a versionId is given)
S3_OBJECT_SUBRESOURCES: dict[str, dict[str, tuple[str, str, str]]] = {
    "acl": {
        "GET": ("GetObjectAcl", "s3:GetObjectAcl", "s3:GetObjectVersionAcl"),
        "PUT": ("PutObjectAcl", "s3:PutObjectAcl", "s3:PutObjectVersionAcl"),
    },
    "tagging": {
        "GET": ("GetObjectTagging", "s3:GetObjectTagging", "s3:GetObjectVersionTagging"),
        "PUT": ("PutObjectTagging", "s3:PutObjectTagging", "s3:PutObjectVersionTagging"),
        "DELETE": ("DeleteObjectTagging", "s3:DeleteObjectTagging", "s3:DeleteObjectVersionTagging"),
    },
    "attributes": {"GET": ("GetObjectAttributes", "s3:GetObjectAttributes", "s3:GetObjectVersionAttributes")},
    "retention": {
        "GET": ("GetObjectRetention", "s3:GetObjectRetention", "s3:GetObjectRetention"),
        "PUT": ("PutObjectRetention", "s3:PutObjectRetention", "s3:PutObjectRetention"),
    },
    "legal-hold": {
        "GET": ("GetObjectLegalHold", "s3:GetObjectLegalHold", "s3:GetObjectLegalHold"),
        "PUT": ("PutObjectLegalHold", "s3:PutObjectLegalHold", "s3:PutObjectLegalHold"),
    },
    "torrent": {"GET": ("GetObjectTorrent", "s3:GetObjectTorrent", "s3:GetObjectVersionTorrent")},
    "restore": {"POST": ("RestoreObject", "s3:RestoreObject", "s3:RestoreObject")},
    "select": {"POST": ("SelectObjectContent", "s3:GetObject", "s3:GetObject")},
}
S3_HEADER_CONTEXT = (
    "x-amz-acl",
    "x-amz-server-side-encryption",
    "x-amz-server-side-encryption-aws-kms-key-id",
    "x-amz-storage-class",
    "x-amz-copy-source",
    "x-amz-metadata-directive",
    "x-amz-grant-read",
    "x-amz-grant-write",
    "x-amz-grant-full-control",
    "x-amz-object-lock-mode",
)


def s3_arn(bucket: str, key: str | None = None) -> str:
    return f"arn:aws:s3:::{bucket}" + (f"/{key}" if key is not None else "")


def _s3_location(request: HttpRequest) -> tuple[str | None, str | None]:
    """Bucket and key of a path-style request: servestack/local/iam/canonical.py has already moved a
    virtual-hosted bucket from the `Host` into the path (and refused a host that names none)."""
    path = request.path
    parts = path[1:].split("/", 1)
    bucket = parts[0] or None
    key = parts[1] if len(parts) == 2 and parts[1] != "" else None
    return bucket, key


def _s3_header_context(request: HttpRequest) -> dict[str, str | tuple[str, ...]]:
    context: dict[str, str | tuple[str, ...]] = {}
    for name in S3_HEADER_CONTEXT:
        value = request.header(name)
        if value is not None:
            context[f"s3:{name}"] = value
    tagging = request.header("x-amz-tagging")
    if tagging:
        tags = urllib.parse.parse_qsl(tagging, keep_blank_values=True)
        context["s3:RequestObjectTagKeys"] = tuple(key for key, _ in tags)
        for key, value in tags:
            context[f"s3:RequestObjectTag/{key}"] = value
    return context


def _s3_list_context(query: Mapping[str, str]) -> dict[str, str | tuple[str, ...]]:
    context: dict[str, str | tuple[str, ...]] = {}
    for param, key in (("prefix", "s3:prefix"), ("delimiter", "s3:delimiter"), ("max-keys", "s3:max-keys")):
        if param in query:
            context[key] = query[param]
    return context


def _copy_source(header: str) -> tuple[str, str, str | None] | None:
    """`x-amz-copy-source: /bucket/key?versionId=v` (URL-encoded) -> (bucket, key, version)."""
    source, _, query = header.partition("?")
    source = urllib.parse.unquote(source).lstrip("/")
    bucket, _, key = source.partition("/")
    if not bucket or not key:
        return None
    version = urllib.parse.parse_qs(query).get("versionId", [None])[-1]
    return bucket, key, version


def _delete_objects(body: bytes) -> list[tuple[str, str | None]] | None:
    """The keys (and versions) of a DeleteObjects body, None when it is not the expected XML.

    The stdlib parser is safe here: it never resolves external entities, and the expat it ships (2.4.1 and
    later) limits entity amplification (Python docs, "XML vulnerabilities")."""
    try:
        root = ElementTree.fromstring(body)  # noqa: S314 - see the docstring
    except ElementTree.ParseError:
        return None
    keys = []
    for element in root.iter():
        if element.tag.rsplit("}", 1)[-1] != "Object":
            continue
        key = version = None
        for child in element:
            name = child.tag.rsplit("}", 1)[-1]
            if name == "Key":
                key = child.text or ""
            elif name == "VersionId":
                version = child.text
        if key is not None:
            keys.append((key, version))
    return keys


def describe_s3(request: HttpRequest, where: Where) -> Operation:
    bucket, key = _s3_location(request)
    method = request.method.upper()
    query = request.query
    if bucket is None:
        if method == "GET":
            return Operation("s3", "ListBuckets", (Check("s3:ListAllMyBuckets", "*"),))
        return unrecognised("s3", None, f"{method} / is no S3 operation")
    if key is None:
        return _describe_s3_bucket(request, method, query, bucket)
    return _describe_s3_object(request, method, query, bucket, key)


def _describe_s3_bucket(request: HttpRequest, method: str, query: Mapping[str, str], bucket: str) -> Operation:
    arn = s3_arn(bucket)
    subresource = next((name for name in query if name in S3_BUCKET_SUBRESOURCES), None)
    if subresource is not None:
        entry = S3_BUCKET_SUBRESOURCES[subresource].get(method)
        if entry is None:
            return unrecognised("s3", None, f"{method} ?{subresource} on a bucket")
        name, action = entry
        if subresource == "delete":
            keys = _delete_objects(request.body)
            if keys is None:
                return unrecognised("s3", "DeleteObjects", "the DeleteObjects body is not a <Delete> document")
            checks = tuple(
                Check(
                    "s3:DeleteObjectVersion" if version else "s3:DeleteObject",
                    s3_arn(bucket, object_key),
                    {"s3:VersionId": version} if version else {},
                )
                for object_key, version in keys
            )
            return Operation("s3", name, checks, delete_keys=tuple(keys), bucket=bucket)
        context = _s3_list_context(query) if subresource == "versions" else {}
        return Operation("s3", name, (Check(action, arn, context),), bucket=bucket)
    if method == "GET":
        name = "ListObjectsV2" if query.get("list-type") == "2" else "ListObjects"
        return Operation("s3", name, (Check("s3:ListBucket", arn, _s3_list_context(query)),), bucket=bucket)
    if method == "HEAD":
        return Operation("s3", "HeadBucket", (Check("s3:ListBucket", arn),), bucket=bucket)
    if method == "PUT":
        return Operation(
            "s3", "CreateBucket", (Check("s3:CreateBucket", arn, _s3_header_context(request)),), bucket=bucket
        )
    if method == "DELETE":
        return Operation("s3", "DeleteBucket", (Check("s3:DeleteBucket", arn),), bucket=bucket)
    return unrecognised(
        "s3", None, f"{method} on a bucket without a known subresource (browser POST uploads are not emulated)"
    )


def _describe_s3_object(
    request: HttpRequest, method: str, query: Mapping[str, str], bucket: str, key: str
) -> Operation:
    arn = s3_arn(bucket, key)
    version = query.get("versionId") or None
    context: dict[str, str | tuple[str, ...]] = {"s3:VersionId": version} if version else {}

    def op(name: str, *checks: Check) -> Operation:
        return Operation("s3", name, checks, bucket=bucket, key=key)

    subresource = next((name for name in query if name in S3_OBJECT_SUBRESOURCES), None)
    if subresource is not None:
        entry = S3_OBJECT_SUBRESOURCES[subresource].get(method)
        if entry is None:
            return unrecognised("s3", None, f"{method} ?{subresource} on an object")
        name, action, versioned_action = entry
        return op(name, Check(versioned_action if version else action, arn, context))
    if "uploadId" in query:
        if method == "GET":
            return op("ListParts", Check("s3:ListMultipartUploadParts", arn))
        if method == "DELETE":
            return op("AbortMultipartUpload", Check("s3:AbortMultipartUpload", arn))
        if method == "POST":
            return op("CompleteMultipartUpload", Check("s3:PutObject", arn))
        if method == "PUT" and "partNumber" in query:
            return _s3_put(request, "UploadPart", arn, op)
        return unrecognised("s3", None, f"{method} ?uploadId on an object")
    if method == "POST" and "uploads" in query:
        return _s3_put(request, "CreateMultipartUpload", arn, op)
    if method in ("GET", "HEAD"):
        name = "GetObject" if method == "GET" else "HeadObject"
        return op(name, Check("s3:GetObjectVersion" if version else "s3:GetObject", arn, context))
    if method == "PUT":
        return _s3_put(request, "PutObject", arn, op)
    if method == "DELETE":
        return op("DeleteObject", Check("s3:DeleteObjectVersion" if version else "s3:DeleteObject", arn, context))
    return unrecognised("s3", None, f"{method} on an object")


def _s3_put(request: HttpRequest, name: str, arn: str, op: Callable[..., Operation]) -> Operation:
    context = _s3_header_context(request)
    checks = [Check("s3:PutObject", arn, context)]
    if request.header("x-amz-tagging"):
        checks.append(Check("s3:PutObjectTagging", arn, context))
    if any(request.header(name) for name in ("x-amz-acl", "x-amz-grant-read", "x-amz-grant-full-control")):
        checks.append(Check("s3:PutObjectAcl", arn, context))
    copy_header = request.header("x-amz-copy-source")
    if copy_header:
        source = _copy_source(copy_header)
        if source is None:
            return unrecognised("s3", name, f"x-amz-copy-source {copy_header!r} is not /bucket/key")
        source_bucket, source_key, source_version = source
        checks.append(
            Check(
                "s3:GetObjectVersion" if source_version else "s3:GetObject",
                s3_arn(source_bucket, source_key),
                {"s3:VersionId": source_version} if source_version else {},
            )
        )
        name = {"PutObject": "CopyObject", "UploadPart": "UploadPartCopy"}.get(name, name)
    return op(name, *checks)


# ------------------------------------------------------------------------------------------ JSON and query protocols


def _json_body(request: HttpRequest) -> dict[str, Any]:
    if not request.body:
        return {}
    try:
        parsed = json.loads(request.content)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _target_operation(request: HttpRequest, prefix: str) -> str | None:
    target = request.header("x-amz-target") or ""
    service, _, operation = target.partition(".")
    return operation if service == prefix and operation else None


def _rpc_call(request: HttpRequest, target_prefix: str) -> tuple[str | None, dict[str, Any], str]:
    """(operation, parameters, protocol) of a call in the JSON protocol (X-Amz-Target), the query protocol
    (`Action=`) or the RPC v2 CBOR protocol (`/service/<Service>/operation/<Op>`)."""
    operation = _target_operation(request, target_prefix)
    if operation is not None:
        return operation, _json_body(request), "json"
    cbor = re.fullmatch(r"/service/[^/]+/operation/([A-Za-z0-9]+)", request.path)
    if cbor:
        return cbor.group(1), _cbor_body(request.content), "cbor"
    params: dict[str, Any] = dict(request.form)
    return params.get("Action"), params, "query"


def _cbor_body(body: bytes) -> dict[str, Any]:
    """A CBOR request body, decoded by botocore's CBOR reader (the one it uses for responses)."""
    if not body:
        return {}
    from botocore.parsers import RpcV2CBORParser

    parser = RpcV2CBORParser()
    try:
        decoded = parser.parse_data_item(parser.get_peekable_stream_from_bytes(body))
    except Exception:  # a malformed body: the operation is still known, its parameters are not
        return {}
    return decoded if isinstance(decoded, dict) else {}


# ------------------------------------------------------------------------------------------ SQS

SQS_BATCH = {
    "SendMessageBatch": "SendMessage",
    "DeleteMessageBatch": "DeleteMessage",
    "ChangeMessageVisibilityBatch": "ChangeMessageVisibility",
}
SQS_NO_RESOURCE = frozenset({"ListQueues"})
SQS_HOST_REGION = re.compile(r"^(?:sqs\.(?P<a>[a-z0-9-]+)\.amazonaws\.com|(?P<b>[a-z0-9-]+)\.queue\.amazonaws\.com)$")


def sqs_queue_arn(queue_url: str, where: Where) -> str | None:
    """`http(s)://host/{account}/{name}` -> `arn:aws:sqs:{region}:{account}:{name}` (the region from an AWS
    host name, else the request's)."""
    split = urllib.parse.urlsplit(queue_url)
    parts = [part for part in split.path.split("/") if part]
    if len(parts) != 2:
        return None
    host_region = SQS_HOST_REGION.match(split.hostname or "")
    region = (host_region.group("a") or host_region.group("b")) if host_region else where.region
    return f"arn:aws:sqs:{region}:{parts[0]}:{parts[1]}"


def describe_sqs(request: HttpRequest, where: Where) -> Operation:
    operation, params, _ = _rpc_call(request, "AmazonSQS")
    if not operation:
        return unrecognised("sqs", None, "no X-Amz-Target and no Action parameter")
    action = f"sqs:{SQS_BATCH.get(operation, operation)}"
    if operation in SQS_NO_RESOURCE:
        return Operation("sqs", operation, (Check(action, "*"),))
    arn = None
    if isinstance(params.get("QueueUrl"), str):
        arn = sqs_queue_arn(params["QueueUrl"], where)
    elif isinstance(params.get("QueueName"), str):
        owner = params.get("QueueOwnerAWSAccountId") or where.account
        arn = f"arn:aws:sqs:{where.region}:{owner}:{params['QueueName']}"
    elif re.fullmatch(r"/\d{12}/[^/]+", request.path):  # the query protocol may post to the queue URL itself
        arn = sqs_queue_arn(f"http://host{request.path}", where)
    if arn is None:
        return unrecognised("sqs", operation, "no QueueUrl or QueueName to name the queue")
    return Operation("sqs", operation, (Check(action, arn),))


# ------------------------------------------------------------------------------------------ DynamoDB

DYNAMODB_NO_RESOURCE = frozenset(
    {
        "ListTables",
        "DescribeLimits",
        "DescribeEndpoints",
        "ListBackups",
        "ListGlobalTables",
        "ListExports",
        "ListImports",
    }
)
TRANSACT_ACTIONS = {
    "Put": "dynamodb:PutItem",
    "Update": "dynamodb:UpdateItem",
    "Delete": "dynamodb:DeleteItem",
    "ConditionCheck": "dynamodb:ConditionCheckItem",
    "Get": "dynamodb:GetItem",
}
DYNAMODB_CONTEXT = {
    "ReturnValues": "dynamodb:ReturnValues",
    "Select": "dynamodb:Select",
    "ReturnConsumedCapacity": "dynamodb:ReturnConsumedCapacity",
}


def dynamodb_table_arn(table: str, where: Where) -> str:
    return table if table.startswith("arn:") else f"arn:aws:dynamodb:{where.region}:{where.account}:table/{table}"


def describe_dynamodb(request: HttpRequest, where: Where) -> Operation:
    operation = _target_operation(request, "DynamoDB_20120810")
    streams = _target_operation(request, "DynamoDBStreams_20120810")
    params = _json_body(request)
    if streams:
        stream = params.get("StreamArn")
        if streams == "ListStreams":
            return Operation("dynamodb", streams, (Check("dynamodb:ListStreams", "*"),))
        if isinstance(stream, str):
            return Operation("dynamodb", streams, (Check(f"dynamodb:{streams}", stream),))
        if streams == "GetRecords" and isinstance(params.get("ShardIterator"), str):
            return unrecognised("dynamodb", streams, "a shard iterator does not name its stream")
        return unrecognised("dynamodb", streams, "no StreamArn")
    if not operation:
        return unrecognised("dynamodb", None, "no DynamoDB_20120810 X-Amz-Target")
    context = {key: str(params[name]) for name, key in DYNAMODB_CONTEXT.items() if isinstance(params.get(name), str)}
    if operation in DYNAMODB_NO_RESOURCE:
        return Operation("dynamodb", operation, (Check(f"dynamodb:{operation}", "*"),))
    if operation in ("BatchGetItem", "BatchWriteItem"):
        tables = params.get("RequestItems")
        if not isinstance(tables, dict) or not tables:
            return unrecognised("dynamodb", operation, "no RequestItems")
        checks = tuple(Check(f"dynamodb:{operation}", dynamodb_table_arn(table, where), context) for table in tables)
        return Operation("dynamodb", operation, checks)
    if operation in ("TransactWriteItems", "TransactGetItems"):
        items = params.get("TransactItems")
        checks_list: list[Check] = []
        for item in items if isinstance(items, list) else []:
            for kind, request_item in item.items() if isinstance(item, dict) else ():
                if (
                    kind in TRANSACT_ACTIONS
                    and isinstance(request_item, dict)
                    and isinstance(request_item.get("TableName"), str)
                ):
                    checks_list.append(
                        Check(TRANSACT_ACTIONS[kind], dynamodb_table_arn(request_item["TableName"], where), context)
                    )
        if not checks_list:
            return unrecognised("dynamodb", operation, "no TransactItems naming a table")
        unique = {(check.action, check.resource): check for check in checks_list}
        return Operation("dynamodb", operation, tuple(unique.values()))
    if operation in ("ExecuteStatement", "BatchExecuteStatement", "ExecuteTransaction"):
        return unrecognised("dynamodb", operation, "PartiQL statements are not parsed")
    table = params.get("TableName") or params.get("ResourceArn") or params.get("TableArn")
    if not isinstance(table, str):
        return unrecognised("dynamodb", operation, "no TableName")
    arn = dynamodb_table_arn(table, where)
    index = params.get("IndexName")
    if operation in ("Query", "Scan") and isinstance(index, str):
        arn = f"{arn}/index/{index}"
    return Operation("dynamodb", operation, (Check(f"dynamodb:{operation}", arn, context),))


# ------------------------------------------------------------------------------ SNS, STS, CloudWatch, Logs, EventBridge


SNS_NO_RESOURCE = frozenset(
    {
        "ListTopics",
        "ListSubscriptions",
        "CreatePlatformApplication",
        "ListPlatformApplications",
        "CheckIfPhoneNumberIsOptedOut",
        "ListPhoneNumbersOptedOut",
        "OptInPhoneNumber",
        "GetSMSAttributes",
        "SetSMSAttributes",
    }
)


def describe_sns(request: HttpRequest, where: Where) -> Operation:
    operation, params, _ = _rpc_call(request, "SNS")
    if not operation:
        return unrecognised("sns", None, "no Action parameter")
    action = "sns:Publish" if operation == "PublishBatch" else f"sns:{operation}"
    if operation in SNS_NO_RESOURCE:
        return Operation("sns", operation, (Check(action, "*"),))
    if operation == "CreateTopic" and isinstance(params.get("Name"), str):
        return Operation(
            "sns", operation, (Check(action, f"arn:aws:sns:{where.region}:{where.account}:{params['Name']}"),)
        )
    arn = params.get("TopicArn") or params.get("TargetArn") or params.get("ResourceArn")
    if not arn and isinstance(params.get("SubscriptionArn"), str):
        arn = params["SubscriptionArn"].rsplit(":", 1)[0]
    if operation == "Publish" and not arn and params.get("PhoneNumber"):
        arn = "*"  # an SMS to a phone number has no resource (Service Authorization Reference)
    if not isinstance(arn, str) or not arn:
        return unrecognised("sns", operation, "no TopicArn")
    return Operation("sns", operation, (Check(action, arn),))


def describe_sts(request: HttpRequest, where: Where) -> Operation:
    operation, params, _ = _rpc_call(request, "AWSSecurityTokenServiceV20110615")
    if operation == "GetCallerIdentity":
        # "No permissions are required to perform this operation" (STS API reference, GetCallerIdentity).
        return Operation("sts", operation, (), always_allowed=True)
    if operation == "AssumeRole":
        role = params.get("RoleArn")
        if not isinstance(role, str):
            return unrecognised("sts", operation, "no RoleArn")
        return Operation("sts", operation, (Check("sts:AssumeRole", role),))
    if operation in ("GetSessionToken", "GetAccessKeyInfo", "DecodeAuthorizationMessage", "GetFederationToken"):
        return Operation("sts", operation, (Check(f"sts:{operation}", "*"),))
    return unrecognised("sts", operation, "not an STS operation servestack uses")


CLOUDWATCH_NO_RESOURCE = frozenset(
    {
        "PutMetricData",
        "GetMetricData",
        "GetMetricStatistics",
        "ListMetrics",
        "DescribeAlarms",
        "DescribeAlarmsForMetric",
        "ListDashboards",
        "GetMetricWidgetImage",
        "DescribeAlarmHistory",
    }
)
CLOUDWATCH_ALARM_OPERATIONS = frozenset(
    {
        "PutMetricAlarm",
        "DeleteAlarms",
        "SetAlarmState",
        "EnableAlarmActions",
        "DisableAlarmActions",
        "PutCompositeAlarm",
    }
)


def describe_cloudwatch(request: HttpRequest, where: Where) -> Operation:
    operation, params, protocol = _rpc_call(request, "GraniteServiceVersion20100801")
    if not operation:
        return unrecognised("cloudwatch", None, "no X-Amz-Target, RPC v2 path or Action parameter")
    action = f"cloudwatch:{operation}"
    if operation in CLOUDWATCH_NO_RESOURCE:
        context: dict[str, str | tuple[str, ...]] = {}
        if operation == "PutMetricData" and isinstance(params.get("Namespace"), str):
            context["cloudwatch:namespace"] = params["Namespace"]
        return Operation("cloudwatch", operation, (Check(action, "*", context),))
    if operation in CLOUDWATCH_ALARM_OPERATIONS:
        names: list[str] = []
        if isinstance(params.get("AlarmName"), str):
            names.append(params["AlarmName"])
        listed = params.get("AlarmNames")
        if isinstance(listed, list):
            names.extend(name for name in listed if isinstance(name, str))
        elif protocol == "query":  # AlarmNames.member.1=...
            names.extend(value for key, value in sorted(params.items()) if key.startswith("AlarmNames.member."))
        if names:
            checks = tuple(
                Check(action, f"arn:aws:cloudwatch:{where.region}:{where.account}:alarm:{name}") for name in names
            )
            return Operation("cloudwatch", operation, checks)
    return unrecognised("cloudwatch", operation, "resource not derived for this CloudWatch operation")


LOGS_STREAM_OPERATIONS = frozenset({"PutLogEvents", "GetLogEvents", "CreateLogStream", "DeleteLogStream"})
LOGS_NO_RESOURCE = frozenset(
    {
        "DescribeLogGroups",
        "DescribeDestinations",
        "DescribeQueries",
        "DescribeResourcePolicies",
        "StopQuery",
        "GetQueryResults",
    }
)


def describe_logs(request: HttpRequest, where: Where) -> Operation:
    operation = _target_operation(request, "Logs_20140328")
    if not operation:
        return unrecognised("logs", None, "no Logs_20140328 X-Amz-Target")
    params = _json_body(request)
    action = f"logs:{operation}"
    if operation in LOGS_NO_RESOURCE:
        return Operation("logs", operation, (Check(action, "*"),))
    group = params.get("logGroupName")
    if not isinstance(group, str) and isinstance(params.get("logGroupIdentifier"), str):
        group = params["logGroupIdentifier"]
        if group.startswith("arn:"):
            group = group.split(":log-group:", 1)[-1].removesuffix(":*")
    if not isinstance(group, str):
        return unrecognised("logs", operation, "no logGroupName")
    group_arn = f"arn:aws:logs:{where.region}:{where.account}:log-group:{group}"
    stream = params.get("logStreamName")
    if operation in LOGS_STREAM_OPERATIONS and isinstance(stream, str):
        return Operation("logs", operation, (Check(action, f"{group_arn}:log-stream:{stream}"),))
    return Operation("logs", operation, (Check(action, f"{group_arn}:*"),))


EVENTS_NO_RESOURCE = frozenset({"ListRules", "ListEventBuses", "TestEventPattern", "ListRuleNamesByTarget"})


def describe_events(request: HttpRequest, where: Where) -> Operation:
    operation = _target_operation(request, "AWSEvents")
    if not operation:
        return unrecognised("events", None, "no AWSEvents X-Amz-Target")
    params = _json_body(request)
    action = f"events:{operation}"
    base = f"arn:aws:events:{where.region}:{where.account}"

    def bus_name(value: Any) -> str:
        name = value if isinstance(value, str) and value else "default"
        return name.rsplit("/", 1)[-1] if name.startswith("arn:") else name

    if operation in EVENTS_NO_RESOURCE:
        return Operation("events", operation, (Check(action, "*"),))
    if operation == "PutEvents":
        entries = params.get("Entries")
        buses = (
            {bus_name(entry.get("EventBusName")) for entry in entries if isinstance(entry, dict)}
            if isinstance(entries, list)
            else set()
        )
        checks = tuple(Check(action, f"{base}:event-bus/{bus}") for bus in sorted(buses or {"default"}))
        return Operation("events", operation, checks)
    rule = params.get("Rule") or params.get("Name")
    if operation in ("CreateEventBus", "DeleteEventBus", "DescribeEventBus"):
        return Operation("events", operation, (Check(action, f"{base}:event-bus/{bus_name(params.get('Name'))}"),))
    if isinstance(rule, str):
        bus = bus_name(params.get("EventBusName"))
        rule_arn = f"{base}:rule/{rule}" if bus == "default" else f"{base}:rule/{bus}/{rule}"
        return Operation("events", operation, (Check(action, rule_arn),))
    return unrecognised("events", operation, "resource not derived for this EventBridge operation")


# ------------------------------------------------------------------------------ REST services from botocore's models


@dataclass(frozen=True)
class RestRoute:
    operation: str
    method: str
    pattern: re.Pattern[str]
    required_query: tuple[str, ...]
    specificity: tuple[int, int]


@cache
def rest_routes(service_name: str) -> tuple[RestRoute, ...]:
    """Each operation's `http.method` and `http.requestUri` from botocore's service model, as a matcher."""
    import botocore.session

    model = botocore.session.get_session().get_service_model(service_name)
    routes = []
    for name in model.operation_names:
        http = model.operation_model(name).http
        path, _, query = http["requestUri"].partition("?")
        regex = ""
        literal = 0
        for piece in re.split(r"(\{[^}]+\})", path):
            if piece.startswith("{") and piece.endswith("}"):
                greedy = piece.endswith("+}")
                label = piece[1:-2] if greedy else piece[1:-1]
                regex += f"(?P<{label}>{'.+' if greedy else '[^/]+'})"
            else:
                regex += re.escape(piece)
                literal += len(piece)
        required = tuple(part.split("=", 1)[0] for part in query.split("&") if part)
        routes.append(RestRoute(name, http["method"], re.compile(regex + "/?"), required, (len(required), literal)))
    return tuple(sorted(routes, key=lambda route: route.specificity, reverse=True))


def match_rest(service_name: str, request: HttpRequest) -> tuple[str, dict[str, str]] | None:
    """(operation, decoded path parameters) of a REST request, None when no operation matches."""
    method = request.method.upper()
    for route in rest_routes(service_name):
        if route.method != method or any(key not in request.query for key in route.required_query):
            continue
        matched = route.pattern.fullmatch(request.raw_path)
        if matched:
            return route.operation, {key: urllib.parse.unquote(value) for key, value in matched.groupdict().items()}
    return None


SAGEMAKER_RUNTIME_ACTIONS = {
    "InvokeEndpoint": "sagemaker:InvokeEndpoint",
    "InvokeEndpointAsync": "sagemaker:InvokeEndpointAsync",
    "InvokeEndpointWithResponseStream": "sagemaker:InvokeEndpointWithResponseStream",
}


# The control-plane calls local up answers for inference components
# (servestack/local/sagemaker/inference_components.py):
# `sagemaker:<Operation>` on the component's ARN (Service Authorization Reference: resource type
# inference-component).
SAGEMAKER_COMPONENT_OPERATIONS = frozenset({"DescribeInferenceComponent", "UpdateInferenceComponentRuntimeConfig"})
# The transform-job calls local up answers (servestack/local/sagemaker/transform_jobs.py), on the job's ARN.
SAGEMAKER_TRANSFORM_JOB_OPERATIONS = frozenset({"CreateTransformJob", "DescribeTransformJob"})


def sagemaker_endpoint_arn(name: str, where: Where) -> str:
    return f"arn:aws:sagemaker:{where.region}:{where.account}:endpoint/{name.lower()}"


def describe_sagemaker(request: HttpRequest, where: Where) -> Operation:
    matched = match_rest("sagemaker-runtime", request) if request.path.startswith("/endpoints/") else None
    if matched is not None:
        operation, params = matched
        arn = sagemaker_endpoint_arn(params["EndpointName"], where)
        return Operation("sagemaker", operation, (Check(SAGEMAKER_RUNTIME_ACTIONS[operation], arn),))
    control_plane = _target_operation(request, "SageMaker")
    if control_plane in SAGEMAKER_COMPONENT_OPERATIONS:
        name = _json_body(request).get("InferenceComponentName")
        if isinstance(name, str) and name:
            arn = f"arn:aws:sagemaker:{where.region}:{where.account}:inference-component/{name.lower()}"
            return Operation("sagemaker", control_plane, (Check(f"sagemaker:{control_plane}", arn),))
    if control_plane in SAGEMAKER_TRANSFORM_JOB_OPERATIONS:
        name = _json_body(request).get("TransformJobName")
        if isinstance(name, str) and name:
            arn = f"arn:aws:sagemaker:{where.region}:{where.account}:transform-job/{name.lower()}"
            return Operation("sagemaker", control_plane, (Check(f"sagemaker:{control_plane}", arn),))
    return unrecognised(
        "sagemaker",
        control_plane,
        "only SageMaker Runtime's invocations, inference component and transform job calls are recognised",
    )


LAMBDA_ACTIONS = {
    "Invoke": "lambda:InvokeFunction",
    "InvokeWithResponseStream": "lambda:InvokeFunction",
    "InvokeAsync": "lambda:InvokeAsync",
}
LAMBDA_NO_RESOURCE = frozenset(
    {"ListFunctions", "GetAccountSettings", "ListLayers", "ListCodeSigningConfigs", "ListEventSourceMappings"}
)
FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,140}$")


def lambda_function_arn(raw: str, qualifier: str | None, where: Where) -> str | None:
    """A function name as Lambda accepts it (`name`, `name:qualifier`, `account:function:name[:qualifier]`,
    or a full ARN) -> the function ARN, qualified when a qualifier is given; None when malformed."""
    region, account = where.region, where.account
    parts = raw.split(":")
    if parts[0] == "arn":
        if len(parts) not in (7, 8) or parts[2] != "lambda" or parts[5] != "function":
            return None
        region, account, parts = parts[3], parts[4], parts[6:]
    elif len(parts) in (3, 4) and parts[1] == "function":
        account, parts = parts[0], parts[2:]
    if not 1 <= len(parts) <= 2 or not FUNCTION_NAME.match(parts[0]):
        return None
    name_qualifier = parts[1] if len(parts) == 2 else None
    final = name_qualifier or qualifier
    return f"arn:aws:lambda:{region}:{account}:function:{parts[0]}" + (f":{final}" if final else "")


def describe_lambda(request: HttpRequest, where: Where) -> Operation:
    matched = match_rest("lambda", request)
    if matched is None:
        return unrecognised("lambda", None, f"{request.method} {request.path} is no Lambda API operation")
    operation, params = matched
    action = LAMBDA_ACTIONS.get(operation, f"lambda:{operation}")
    if operation in LAMBDA_NO_RESOURCE:
        return Operation("lambda", operation, (Check(action, "*"),))
    raw = params.get("FunctionName")
    if raw is None:
        return unrecognised("lambda", operation, "resource not derived for this Lambda operation")
    arn = lambda_function_arn(raw, request.query.get("Qualifier") or None, where)
    if arn is None:
        return unrecognised("lambda", operation, f"{raw!r} is not a function name, name:qualifier or function ARN")
    return Operation("lambda", operation, (Check(action, arn),))


def describe_scheduler(request: HttpRequest, where: Where) -> Operation:
    """EventBridge Scheduler (rest-json): an operation naming a schedule is `scheduler:<Op>` on
    `arn:aws:scheduler:{region}:{account}:schedule/{groupName, default "default"}/{Name}` (Service Authorization
    Reference, resource type schedule); one naming a group, on `...:schedule-group/{Name}`; lists on `*`."""
    matched = match_rest("scheduler", request)
    if matched is None:
        return unrecognised("scheduler", None, f"{request.method} {request.path} is no Scheduler API operation")
    operation, params = matched
    action = f"scheduler:{operation}"
    name = params.get("Name")
    if name is None:
        return Operation("scheduler", operation, (Check(action, "*"),))
    prefix = f"arn:aws:scheduler:{where.region}:{where.account}"
    if "ScheduleGroup" in operation:
        return Operation("scheduler", operation, (Check(action, f"{prefix}:schedule-group/{name}"),))
    group = request.query.get("groupName") or "default"
    return Operation("scheduler", operation, (Check(action, f"{prefix}:schedule/{group}/{name}"),))


@dataclass(frozen=True)
class ExecuteApi:
    """The HTTP API a request to servestack's API front is for."""

    api_id: str
    stage: str = "$default"


def describe_execute_api(request: HttpRequest, where: Where, api: ExecuteApi) -> Operation:
    """`execute-api:Invoke` on `arn:aws:execute-api:{region}:{account}:{apiId}/{stage}/{METHOD}/{path}`
    (API Gateway Developer Guide, "Control access to an HTTP API with IAM authorization"). A named stage is
    the first path segment; `$default` has none."""
    path = request.path
    if api.stage != "$default":
        prefix = f"/{api.stage}"
        path = path[len(prefix) :] if path == prefix or path.startswith(prefix + "/") else path
    route = f"{api.api_id}/{api.stage}/{request.method.upper()}/{path.lstrip('/')}"
    arn = f"arn:aws:execute-api:{where.region}:{where.account}:{route}"
    return Operation("execute-api", "Invoke", (Check("execute-api:Invoke", arn),))


# ------------------------------------------------------------------------------------------ dispatch


SIGNING_TO_PREFIX = {"monitoring": "cloudwatch"}
DESCRIBERS: dict[str, Callable[[HttpRequest, Where], Operation]] = {
    "s3": describe_s3,
    "sqs": describe_sqs,
    "dynamodb": describe_dynamodb,
    "sns": describe_sns,
    "sts": describe_sts,
    "monitoring": describe_cloudwatch,
    "logs": describe_logs,
    "events": describe_events,
    "sagemaker": describe_sagemaker,
    "lambda": describe_lambda,
    "scheduler": describe_scheduler,
}


def describe(request: HttpRequest, service: str, where: Where, *, api: ExecuteApi | None = None) -> Operation:
    """The operation `request` asks `service` (a SigV4 signing name) for, and the checks AWS makes."""
    if service == "execute-api":
        if api is None:
            return unrecognised("execute-api", "Invoke", "no API id was given for this execute-api request")
        return describe_execute_api(request, where, api)
    describer = DESCRIBERS.get(service)
    prefix = SIGNING_TO_PREFIX.get(service, service)
    if describer is None:
        target = request.header("x-amz-target") or ""
        name = target.partition(".")[2] or request.form.get("Action")
        return unrecognised(prefix, name, f"servestack does not describe {service} calls")
    return describer(request, where)
