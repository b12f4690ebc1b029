"""The differential property of tests/functional/test_iam_differential.py (the resource the enforcer authorized
is the resource the backend touched), for JSON bodies that hold form-like text (issue 37, finding 1): a
message, a key value, a log line, a payload reading `a&Action=DeleteQueue&b` or `&QueueUrl=<the other
queue>&`, in every JSON service local mode plays: SQS, DynamoDB and CloudWatch Logs on the enforced moto
server (also gzip bodies and form or missing content types), SNS (query protocol, whose messages are JSON),
and on local up's AWS front Scheduler's GetSchedule, Lambda Invoke, SageMaker (InvokeEndpoint and the
inference components' control plane) and ECS RunTask.

Each example is signed as the developer (ECS RunTask: as a role allowed it, since RunTask checks the caller's
role), sent as raw HTTP, and checked three ways: what the backend changed or looked up (found by the
example's own token, or named in its answer) is what the enforcer authorized; on a 200 it is all of it; and
no resource of the rig was deleted or created.
"""

from __future__ import annotations

import gzip
import http.client
import json
import threading
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import boto3
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from hypothesis import given, settings
from hypothesis import strategies as st

from servestack.local.ecs import EcsRunTask, TaskLaunch
from servestack.local.iam import IdentityStore
from servestack.local.iam.access import LocalAccess
from servestack.local.iam.operations import Check
from servestack.local.iam.server import EnforcedMotoServer
from servestack.local.lambda_.service import LambdaService
from servestack.local.sagemaker import ComponentState, InferenceComponents
from servestack.local.sagemaker.runtime_front import SageMakerRuntime
from servestack.local.scheduler import SchedulerApi
from servestack.local.scheduler.definitions import ScheduleDef
from servestack.local.up.aws_front import AwsFront
from tests.functional.test_iam_differential import NOT_FOUND_ENDPOINT, NOT_FOUND_FUNCTION, RecordingEnforcer

ACCOUNT = "123456789012"
REGION = "us-east-1"
EXAMPLES = 60
FORM = "application/x-www-form-urlencoded; charset=utf-8"
JSON_1_0, JSON_1_1 = "application/x-amz-json-1.0", "application/x-amz-json-1.1"


def form_like(action: str, member: str, other: str) -> st.SearchStrategy[str]:
    """Text a form reader would take for `Action=<action>` and `<member>=<other>`, in the shapes a payload may
    hold them (bare, percent-encoded, plus-spaced, after `?` or `;`), joined by chance."""
    pieces = [
        f"&Action={action}&",
        f"a&Action={action}&b",
        f"&{member}={other}&",
        f"{member}={other}",
        f"Action={action}",
        f"%26Action%3D{action}",
        f"+&+Action={action}+",
        f"?Action={action}",
        f";Action={action}",
        "&",
        "=",
        "&&==",
    ]
    return st.lists(st.sampled_from(pieces), min_size=1, max_size=4).map("".join)


@dataclass
class Rig:
    moto: str
    front: str
    enforcer: RecordingEnforcer
    front_enforcer: RecordingEnforcer
    developer: Credentials
    runner: Credentials  # a role allowed ecs:RunTask and iam:PassRole (RunTask authorizes the caller's role)
    admin: boto3.Session
    names: dict[str, str] = field(default_factory=dict)
    scaled: list[tuple[str, int]] = field(default_factory=list)

    def client(self, service: str) -> Any:
        return self.admin.client(
            service, endpoint_url=f"http://{self.moto}", config=Config(retries={"max_attempts": 1})
        )

    def arn(self, service: str, key: str) -> str:
        name = self.names[key]
        return {
            "sqs": f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}",
            "dynamodb": f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{name}",
            "logs": f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/{name}:log-stream:s",
            "sns": f"arn:aws:sns:{REGION}:{ACCOUNT}:{name}",
            "scheduler": f"arn:aws:scheduler:{REGION}:{ACCOUNT}:schedule/default/{name}",
            "component": f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:inference-component/{name}",
            "task": f"arn:aws:ecs:{REGION}:{ACCOUNT}:task-definition/{name}:1",
        }[service]


def create_moto_resources(rig: Rig, key: str) -> None:
    name = rig.names[key]
    rig.client("sqs").create_queue(QueueName=name)
    rig.client("sns").create_topic(Name=name)
    logs = rig.client("logs")
    if not logs.describe_log_groups(logGroupNamePrefix=f"/{name}")["logGroups"]:
        logs.create_log_group(logGroupName=f"/{name}")
        logs.create_log_stream(logGroupName=f"/{name}", logStreamName="s")
    ddb = rig.client("dynamodb")
    if name not in ddb.list_tables()["TableNames"]:
        ddb.create_table(
            TableName=name,
            KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    tag = uuid.uuid4().hex[:8]
    names = {"a": f"dj-a-{tag}", "b": f"dj-b-{tag}"}
    store = IdentityStore()
    developer = store.developer()
    enforcer = RecordingEnforcer(store, log=lambda line: None)
    enforcer.checks = []
    server = EnforcedMotoServer(enforcer).start()
    access = LocalAccess(log=lambda line: None)
    front_enforcer = RecordingEnforcer(access.store, access.policies, log=lambda line: None)
    front_enforcer.checks = []
    access.enforcer = front_enforcer
    runner_role = f"arn:aws:iam::{ACCOUNT}:role/dj-runner-{tag}"
    allow = {"Effect": "Allow", "Action": ["ecs:RunTask", "iam:PassRole"], "Resource": "*"}
    runner = access.credentials_for(runner_role, ({"Version": "2012-10-17", "Statement": [allow]},))
    scaled: list[tuple[str, int]] = []
    components = {
        name: ComponentState(
            name,
            f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:inference-component/{name}",
            "ep",
            f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:endpoint/ep",
            "AllTraffic",
            "m",
            {},
            1,
            1,
        )
        for name in names.values()
    }
    schedules = [
        ScheduleDef(
            name, name, "rate(1 day)", "UTC", True, "arn:aws:lambda:::function:f", runner_role, None, 0, 60, None
        )
        for name in names.values()
    ]
    launches = {
        name: TaskLaunch(
            f"arn:aws:ecs:{REGION}:{ACCOUNT}:task-definition/{name}:1", "c", ("true",), "/", {}, None, (), "tag"
        )
        for name in names.values()
    }
    lambdas = LambdaService([])
    front = AwsFront(
        SageMakerRuntime({}, {}, None), lambdas, access,
        components=InferenceComponents(components, lambda component, copies: scaled.append((component.name, copies))),
        scheduler=SchedulerApi(schedules, REGION, ACCOUNT),
        ecs=EcsRunTask(launches, access, REGION, ACCOUNT),
    ).serve_in_background()  # fmt: skip
    admin = boto3.Session(
        aws_access_key_id=developer.access_key_id, aws_secret_access_key=developer.secret_access_key, region_name=REGION
    )
    rig = Rig(
        f"{server.host}:{server.port}",
        front.url.removeprefix("http://"),
        enforcer,
        front_enforcer,
        Credentials(developer.access_key_id, developer.secret_access_key),
        Credentials(runner.access_key_id, runner.secret_access_key, runner.session_token),
        admin,
        names,
        scaled,
    )
    for key in names:
        create_moto_resources(rig, key)
    yield rig
    front.close()
    lambdas.close()
    server.stop()


_lock = threading.Lock()


def send(
    rig: Rig,
    authority: str,
    service: str,
    method: str,
    target: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    *,
    credentials: Credentials | None = None,
) -> tuple[int, bytes, list[Check]]:
    """Sign `target` as the developer (or `credentials`) and send it as written; the status, the body and the
    checks the enforcer decided for it."""
    recorder = rig.front_enforcer if authority == rig.front else rig.enforcer
    request = AWSRequest(
        method=method, url=f"http://{authority}{target}", data=body, headers={"Host": authority, **(headers or {})}
    )
    SigV4Auth(credentials or rig.developer, service, REGION).add_auth(request)
    with _lock:
        recorder.checks = []
        connection = http.client.HTTPConnection(authority, timeout=30)
        try:
            connection.request(method, target, body=body, headers=dict(request.headers.items()))
            response = connection.getresponse()
            answer = response.read()
        finally:
            connection.close()
        return response.status, answer, list(recorder.checks)


def authorized(checks: list[Check], action: str) -> set[str]:
    return {check.resource for check in checks if check.action == action}


def json_call(target: str, params: dict[str, Any], content_type: str, compressed: bool) -> tuple[bytes, dict[str, str]]:
    body = json.dumps(params).encode()
    headers = {"X-Amz-Target": target}
    if content_type:
        headers["Content-Type"] = content_type
    if compressed:
        body = gzip.compress(body)
        headers["Content-Encoding"] = "gzip"
    return body, headers


def assert_moto_resources_intact(rig: Rig) -> None:
    """Both queues, tables, log groups and topics are there, and no other with the rig's tag; a missing one is
    made again (for the next example), then reported."""
    tag = rig.names["a"].rsplit("-", 1)[1]
    found = {
        "sqs": sorted(u.rsplit("/", 1)[1] for u in rig.client("sqs").list_queues().get("QueueUrls", []) if tag in u),
        "dynamodb": sorted(t for t in rig.client("dynamodb").list_tables()["TableNames"] if tag in t),
        "logs": sorted(
            g["logGroupName"].lstrip("/")
            for g in rig.client("logs").describe_log_groups()["logGroups"]
            if tag in g["logGroupName"]
        ),
        "sns": sorted(
            t["TopicArn"].rsplit(":", 1)[1] for t in rig.client("sns").list_topics()["Topics"] if tag in t["TopicArn"]
        ),
    }
    expected = sorted(rig.names.values())
    if any(names != expected for names in found.values()):
        for key in rig.names:
            create_moto_resources(rig, key)
        raise AssertionError(f"the rig's resources changed: {found}")


CONTENT_TYPES = st.sampled_from([JSON_1_0, JSON_1_1, FORM, ""])


# ------------------------------------------------------------------------------------------ on the emulator


@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.data(), content_type=CONTENT_TYPES, compressed=st.booleans())
def test_sqs_a_message_holding_form_text_lands_in_the_queue_authorized(
    rig: Rig, data: st.DataObject, content_type: str, compressed: bool
) -> None:
    token = uuid.uuid4().hex
    other = f"http://{rig.moto}/{ACCOUNT}/{rig.names['b']}"
    text = data.draw(
        form_like(data.draw(st.sampled_from(["DeleteQueue", "PurgeQueue", "SendMessage"])), "QueueUrl", other)
    )
    params = {
        "QueueUrl": f"http://{rig.moto}/{ACCOUNT}/{rig.names['a']}",
        "MessageBody": json.dumps({"t": token, "note": text}),
    }
    body, headers = json_call("AmazonSQS.SendMessage", params, content_type, compressed)
    status, answer, checks = send(rig, rig.moto, "sqs", "POST", "/", body, headers)
    from moto.sqs.models import sqs_backends

    queues = sqs_backends[ACCOUNT][REGION].queues
    touched = {rig.arn("sqs", k) for k in ("a", "b") if any(token in m.body for m in queues[rig.names[k]]._messages)}
    assert touched <= authorized(checks, "sqs:SendMessage"), (text, status, answer[:300])
    if status == 200:
        assert touched == authorized(checks, "sqs:SendMessage") == {rig.arn("sqs", "a")}, (text, answer[:300])
    assert_moto_resources_intact(rig)


@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.data(), content_type=CONTENT_TYPES, compressed=st.booleans(), in_key=st.booleans())
def test_dynamodb_an_item_holding_form_text_lands_in_the_table_authorized(
    rig: Rig, data: st.DataObject, content_type: str, compressed: bool, in_key: bool
) -> None:
    token = uuid.uuid4().hex
    text = data.draw(
        form_like(data.draw(st.sampled_from(["DeleteTable", "DeleteItem", "PutItem"])), "TableName", rig.names["b"])
    )
    key = f"{token}{text}" if in_key else token
    params = {"TableName": rig.names["a"], "Item": {"id": {"S": key}, "note": {"S": text}}}
    body, headers = json_call("DynamoDB_20120810.PutItem", params, content_type, compressed)
    status, answer, checks = send(rig, rig.moto, "dynamodb", "POST", "/", body, headers)
    assert_moto_resources_intact(rig)
    ddb = rig.client("dynamodb")
    touched = {
        rig.arn("dynamodb", k)
        for k in ("a", "b")
        if "Item" in ddb.get_item(TableName=rig.names[k], Key={"id": {"S": key}})
    }
    assert touched <= authorized(checks, "dynamodb:PutItem"), (text, status, answer[:300])
    if status == 200:
        assert touched == authorized(checks, "dynamodb:PutItem") == {rig.arn("dynamodb", "a")}, (text, answer[:300])


@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.data(), content_type=CONTENT_TYPES, compressed=st.booleans())
def test_logs_an_event_holding_form_text_lands_in_the_group_authorized(
    rig: Rig, data: st.DataObject, content_type: str, compressed: bool
) -> None:
    import time

    token = uuid.uuid4().hex
    action = data.draw(st.sampled_from(["DeleteLogGroup", "CreateLogGroup", "PutLogEvents"]))
    text = data.draw(form_like(action, "logGroupName", f"/{rig.names['b']}"))
    event = {"timestamp": int(time.time() * 1000), "message": f"{token} {text}"}
    params = {"logGroupName": f"/{rig.names['a']}", "logStreamName": "s", "logEvents": [event]}
    body, headers = json_call("Logs_20140328.PutLogEvents", params, content_type or JSON_1_1, compressed)
    status, answer, checks = send(rig, rig.moto, "logs", "POST", "/", body, headers)
    assert_moto_resources_intact(rig)
    from moto.logs.models import logs_backends

    groups = logs_backends[ACCOUNT][REGION].groups
    touched = {
        rig.arn("logs", k)
        for k in ("a", "b")
        if any(token in e.message for stream in groups[f"/{rig.names[k]}"].streams.values() for e in stream.events)
    }
    assert touched <= authorized(checks, "logs:PutLogEvents"), (text, status, answer[:300])
    if status == 200:
        assert touched == authorized(checks, "logs:PutLogEvents") == {rig.arn("logs", "a")}, (text, answer[:300])


@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.data(), content_type=st.sampled_from([FORM, "text/plain", JSON_1_0]))
def test_sns_a_json_message_holding_form_text_reaches_the_topic_authorized(
    rig: Rig, data: st.DataObject, content_type: str
) -> None:
    token = uuid.uuid4().hex
    text = data.draw(form_like(data.draw(st.sampled_from(["DeleteTopic", "Publish"])), "TopicArn", rig.arn("sns", "b")))
    message = json.dumps({"t": token, "note": text})
    pairs = {"Action": "Publish", "Version": "2010-03-31", "TopicArn": rig.arn("sns", "a"), "Message": message}
    # the query protocol's form, or (not a form by its content type) the same text raw: no Action then
    body = (
        urllib.parse.urlencode(pairs).encode() if content_type == FORM else f"Action=Publish&Message={message}".encode()
    )
    status, answer, checks = send(rig, rig.moto, "sns", "POST", "/", body, {"Content-Type": content_type})
    assert_moto_resources_intact(rig)
    from moto.sns.models import sns_backends

    topics = sns_backends[ACCOUNT][REGION].topics
    touched = {
        rig.arn("sns", k)
        for k in ("a", "b")
        if any(token in str(sent[1]) for sent in topics[rig.arn("sns", k)].sent_notifications)
    }
    assert touched <= authorized(checks, "sns:Publish"), (text, status, answer[:300])
    if status == 200:
        assert touched == authorized(checks, "sns:Publish") == {rig.arn("sns", "a")}, (text, answer[:300])
    else:
        assert content_type != FORM, (text, status, answer[:300])


# ------------------------------------------------------------------------------------------ on local up's AWS front


@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.data(), group=st.sampled_from(["", "groupName=default"]))
def test_scheduler_a_body_holding_form_text_gets_the_schedule_authorized(
    rig: Rig, data: st.DataObject, group: str
) -> None:
    text = data.draw(form_like("DeleteSchedule", "Name", rig.names["b"]))
    body = json.dumps({"Name": rig.names["b"], "note": text}).encode()
    target = f"/schedules/{rig.names['a']}" + (f"?{group}" if group else "")
    status, answer, checks = send(
        rig, rig.front, "scheduler", "GET", target, body, {"Content-Type": "application/json"}
    )
    assert status == 200, (text, answer[:300])
    assert {json.loads(answer)["Arn"]} == authorized(checks, "scheduler:GetSchedule") == {rig.arn("scheduler", "a")}


@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.data(), qualifier=st.sampled_from(["", "Qualifier=live"]))
def test_lambda_a_payload_holding_form_text_invokes_the_function_authorized(
    rig: Rig, data: st.DataObject, qualifier: str
) -> None:
    text = data.draw(form_like("DeleteFunction", "FunctionName", "fn-b"))
    target = "/2015-03-31/functions/fn-a/invocations" + (f"?{qualifier}" if qualifier else "")
    body = json.dumps({"note": text}).encode()
    status, answer, checks = send(rig, rig.front, "lambda", "POST", target, body, {"Content-Type": "application/json"})
    looked_up = NOT_FOUND_FUNCTION.search(answer.decode())
    assert looked_up is not None, (text, status, answer[:300])
    assert {looked_up.group(1)} == authorized(checks, "lambda:InvokeFunction"), (text, answer[:300])


@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.data())
def test_sagemaker_an_invocation_holding_form_text_looks_up_the_endpoint_authorized(
    rig: Rig, data: st.DataObject
) -> None:
    text = data.draw(form_like("DeleteEndpoint", "EndpointName", "ep-b"))
    body = json.dumps({"instances": [text]}).encode()
    headers = {"Content-Type": "application/json"}
    status, answer, checks = send(rig, rig.front, "sagemaker", "POST", "/endpoints/ep-a/invocations", body, headers)
    looked_up = NOT_FOUND_ENDPOINT.search(answer.decode())
    assert looked_up is not None, (text, status, answer[:300])
    assert authorized(checks, "sagemaker:InvokeEndpoint") == {f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:endpoint/ep-a"}


@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.data(), content_type=CONTENT_TYPES)
def test_sagemaker_a_control_plane_body_holding_form_text_describes_the_component_authorized(
    rig: Rig, data: st.DataObject, content_type: str
) -> None:
    text = data.draw(form_like("UpdateInferenceComponentRuntimeConfig", "InferenceComponentName", rig.names["b"]))
    params = {"InferenceComponentName": rig.names["a"], "DesiredRuntimeConfig": {"CopyCount": 0}, "note": text}
    body, headers = json_call("SageMaker.DescribeInferenceComponent", params, content_type, False)
    status, answer, checks = send(rig, rig.front, "sagemaker", "POST", "/", body, headers)
    assert status == 200, (text, answer[:300])
    described = json.loads(answer)["InferenceComponentArn"]
    assert {described} == authorized(checks, "sagemaker:DescribeInferenceComponent") == {rig.arn("component", "a")}
    assert rig.scaled == []  # no copies were set by the text


@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.data(), content_type=st.sampled_from([JSON_1_1, FORM, ""]))
def test_ecs_a_run_task_body_holding_form_text_runs_the_task_definition_authorized(
    rig: Rig, data: st.DataObject, content_type: str
) -> None:
    text = data.draw(form_like("StopTask", "taskDefinition", rig.arn("task", "b")))
    overrides = {"containerOverrides": [{"name": "c", "environment": [{"name": "NOTE", "value": text}]}]}
    params = {"taskDefinition": rig.arn("task", "a"), "overrides": overrides}
    body, headers = json_call("AmazonEC2ContainerServiceV20141113.RunTask", params, content_type, False)
    status, answer, checks = send(rig, rig.front, "ecs", "POST", "/", body, headers, credentials=rig.runner)
    assert status == 200, (text, answer[:300])
    (task,) = json.loads(answer)["tasks"]
    assert task["overrides"] == overrides
    assert {task["taskDefinitionArn"]} == authorized(checks, "ecs:RunTask") == {rig.arn("task", "a")}
