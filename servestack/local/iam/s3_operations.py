"""Which action on which resource an S3 call needs: bucket and object operations, their subresources, copies
and multi-object deletes, and the S3 condition keys a request fills in."""

from __future__ import annotations

import urllib.parse
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Mapping

from servestack.local.iam.calls import Check, Operation, Where, unrecognised
from servestack.local.iam.wire import HttpRequest

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
