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
  `*` with `cloudwatch:namespace`), metric reads on `*`, alarm operations on alarm ARNs; DescribeAlarms on
  the ARNs of the alarms it names (`AlarmNames`), else on `*` (the CloudWatch API Reference: a DescribeAlarms
  permission scoped narrower than `*` returns no composite alarm, so it can be scoped to alarms).
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
- ECS (`X-Amz-Target: AmazonEC2ContainerServiceV20141113.RunTask`): `ecs:RunTask` on the task definition ARN
  (`taskDefinition`, or `family:revision` made an ARN); the iam:PassRole of the task's roles that ECS also
  checks needs the task definition, so local up's RunTask checks it (servestack/local/ecs/tasks.py).
- ECR (`X-Amz-Target: AmazonEC2ContainerRegistry_V20150921.<Op>`): GetAuthorizationToken on `*` (it has no
  resource-level permissions); the image and layer operations (BatchGetImage, BatchCheckLayerAvailability,
  GetDownloadUrlForLayer, PutImage...) as `ecr:<Op>` on `arn:aws:ecr:{region}:{registryId or account}:repository/
  {repositoryName}`.
- API Gateway (`execute-api`), an HTTP API with IAM authorization: `execute-api:Invoke` on
  `arn:aws:execute-api:{region}:{account}:{apiId}/{stage}/{METHOD}/{path}`.

A call that is not recognised (or whose resource is not derived) is authorized as `<service>:<Operation or
UnknownOperation>` on `*` with `recognised=False`: a policy scoped to ARNs denies it (fail closed), and the
denial says the call was not recognised.
"""

from __future__ import annotations

from collections.abc import Callable

from servestack.local.iam.calls import Check, Operation, Where, unrecognised
from servestack.local.iam.rest_operations import (
    ExecuteApi,
    describe_execute_api,
    describe_lambda,
    describe_sagemaker,
    describe_scheduler,
)
from servestack.local.iam.rpc_operations import (
    describe_cloudwatch,
    describe_dynamodb,
    describe_ecr,
    describe_ecs,
    describe_events,
    describe_logs,
    describe_sns,
    describe_sqs,
    describe_sts,
)
from servestack.local.iam.s3_operations import describe_s3, s3_arn
from servestack.local.iam.wire import HttpRequest

__all__ = ["Check", "ExecuteApi", "Operation", "Where", "describe", "s3_arn"]  # what the enforcer asks of it

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
    "ecr": describe_ecr,
    "events": describe_events,
    "sagemaker": describe_sagemaker,
    "lambda": describe_lambda,
    "scheduler": describe_scheduler,
    "ecs": describe_ecs,
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
