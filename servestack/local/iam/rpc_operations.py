"""Which action on which resource a call to a JSON or query protocol service needs: SQS, DynamoDB, SNS, STS,
CloudWatch, CloudWatch Logs and EventBridge."""

from __future__ import annotations

import re
import urllib.parse
from typing import Any

from servestack.local.iam.calls import Check, Operation, Where, json_body, rpc_call, target_operation, unrecognised
from servestack.local.iam.wire import HttpRequest

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
    operation, params, _ = rpc_call(request, "AmazonSQS")
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
    operation = target_operation(request, "DynamoDB_20120810")
    streams = target_operation(request, "DynamoDBStreams_20120810")
    params = json_body(request)
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
    operation, params, _ = rpc_call(request, "SNS")
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
    operation, params, _ = rpc_call(request, "AWSSecurityTokenServiceV20110615")
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
        "DescribeAlarms",  # on the alarms it names; with none, on `*` (below)
    }
)


def describe_cloudwatch(request: HttpRequest, where: Where) -> Operation:
    operation, params, protocol = rpc_call(request, "GraniteServiceVersion20100801")
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
        if operation == "DescribeAlarms":  # no names: every alarm (or a prefix, a state): `*`
            return Operation("cloudwatch", operation, (Check(action, "*"),))
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
    operation = target_operation(request, "Logs_20140328")
    if not operation:
        return unrecognised("logs", None, "no Logs_20140328 X-Amz-Target")
    params = json_body(request)
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


ECR_NO_RESOURCE = frozenset({"GetAuthorizationToken", "DescribeRegistry", "GetRegistryPolicy"})


def describe_ecr(request: HttpRequest, where: Where) -> Operation:
    operation = target_operation(request, "AmazonEC2ContainerRegistry_V20150921")
    if not operation:
        return unrecognised("ecr", None, "no AmazonEC2ContainerRegistry_V20150921 X-Amz-Target")
    action = f"ecr:{operation}"
    if operation in ECR_NO_RESOURCE:
        return Operation("ecr", operation, (Check(action, "*"),))
    params = json_body(request)
    repository = params.get("repositoryName")
    if not isinstance(repository, str):
        return unrecognised("ecr", operation, "no repositoryName")
    registry = params.get("registryId")
    account = registry if isinstance(registry, str) and registry else where.account
    arn = f"arn:aws:ecr:{where.region}:{account}:repository/{repository}"
    return Operation("ecr", operation, (Check(action, arn),))


def describe_ecs(request: HttpRequest, where: Where) -> Operation:
    operation = target_operation(request, "AmazonEC2ContainerServiceV20141113")
    if operation != "RunTask":
        return unrecognised("ecs", operation, "only ECS RunTask is described")
    definition = json_body(request).get("taskDefinition")
    if not isinstance(definition, str) or not definition:
        return unrecognised("ecs", operation, "RunTask without a taskDefinition")
    if not definition.startswith("arn:"):
        definition = f"arn:aws:ecs:{where.region}:{where.account}:task-definition/{definition}"
    return Operation("ecs", operation, (Check("ecs:RunTask", definition),))


EVENTS_NO_RESOURCE = frozenset({"ListRules", "ListEventBuses", "TestEventPattern", "ListRuleNamesByTarget"})


def describe_events(request: HttpRequest, where: Where) -> Operation:
    operation = target_operation(request, "AWSEvents")
    if not operation:
        return unrecognised("events", None, "no AWSEvents X-Amz-Target")
    params = json_body(request)
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
