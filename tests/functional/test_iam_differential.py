"""Differential property: for every request variant, the resource the enforcer authorized is the resource the
backend touched.

Hypothesis draws variants of the same few calls (path, query string, body, `Host` and header forms: queue URLs
with `?`/`#` tails, a queue named by path, by URL and by name, parameters in the query string and the body or
repeated, virtual-hosted and dotted hosts, encoded keys, table ARNs, SNS targets, Lambda ARNs of other
regions, endpoint names in other cases). Each is signed by botocore's signer as the developer (whom every
policy allows, so each well-formed variant reaches the backend) and sent as raw HTTP (http.client sends the
request target as written) to:
- the enforced moto server (S3, SQS, DynamoDB, SNS): what moto changed is read back (a new object, message,
  item or published notification, marked with the example's own token) and must sit at the ARN the enforcer
  authorized; an S3 listing's `<Name>`/`<Prefix>` must be the bucket and `s3:prefix` it authorized;
- local up's AWS front (SageMaker Runtime, Lambda Invoke) with no endpoint or function behind it: the front's
  own "not found" answer names the endpoint or function it looked up, which must be the one authorized.

The authorized checks are recorded by an `IamEnforcer` whose `_decide` notes each check before deciding it as
usual. A refused variant must have changed nothing. Example counts: `EXAMPLES` per service (six services).
JSON bodies holding form-like text, in every JSON service local mode plays: test_iam_differential_json.py.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import urllib.parse
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from xml.etree import ElementTree

import boto3
import pytest
from botocore.auth import S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from hypothesis import given, settings
from hypothesis import strategies as st

from servestack.local.iam import IamEnforcer, IdentityStore
from servestack.local.iam.access import LocalAccess
from servestack.local.iam.operations import Check
from servestack.local.iam.policy import Caller, Decision
from servestack.local.iam.server import EnforcedMotoServer
from servestack.local.lambda_.service import LambdaService
from servestack.local.sagemaker.runtime_front import SageMakerRuntime
from servestack.local.up.aws_front import AwsFront

ACCOUNT = "123456789012"
REGION = "us-east-1"
EXAMPLES = 150
FORM = "application/x-www-form-urlencoded; charset=utf-8"


class RecordingEnforcer(IamEnforcer):
    """The enforcer, unchanged, noting every check it decides (one request at a time in these tests)."""

    checks: list[Check]

    def _decide(self, caller: Caller, identity: Any, check: Check, base: Mapping[str, Any], **kw: Any) -> Decision:
        self.checks.append(check)
        return super()._decide(caller, identity, check, base, **kw)


@dataclass
class Rig:
    moto: str  # host:port of the enforced moto server
    front: str  # host:port of the AWS front
    enforcer: RecordingEnforcer
    front_enforcer: RecordingEnforcer
    credentials: Credentials
    admin: boto3.Session
    names: dict[str, str] = field(default_factory=dict)

    def client(self, service: str) -> Any:
        config = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1})
        return self.admin.client(service, endpoint_url=f"http://{self.moto}", config=config)


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    store = IdentityStore()
    developer = store.developer()
    enforcer = RecordingEnforcer(store, log=lambda line: None)
    enforcer.checks = []
    server = EnforcedMotoServer(enforcer).start()
    access = LocalAccess(log=lambda line: None)
    front_enforcer = RecordingEnforcer(access.store, access.policies, log=lambda line: None)
    front_enforcer.checks = []
    access.enforcer = front_enforcer
    lambdas = LambdaService([])
    front = AwsFront(SageMakerRuntime({}, {}, None), lambdas, access).serve_in_background()
    admin = boto3.Session(
        aws_access_key_id=developer.access_key_id, aws_secret_access_key=developer.secret_access_key, region_name=REGION
    )
    rig = Rig(
        f"{server.host}:{server.port}",
        front.url.removeprefix("http://"),
        enforcer,
        front_enforcer,
        Credentials(developer.access_key_id, developer.secret_access_key),
        admin,
    )
    tag = uuid.uuid4().hex[:8]
    rig.names = {"a": f"diff-a-{tag}", "b": f"diff-b-{tag}"}
    s3, sqs, ddb, sns = rig.client("s3"), rig.client("sqs"), rig.client("dynamodb"), rig.client("sns")
    for name in rig.names.values():
        s3.create_bucket(Bucket=name)
        sqs.create_queue(QueueName=name)
        sns.create_topic(Name=name)
        ddb.create_table(
            TableName=name,
            KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
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
) -> tuple[int, bytes, list[Check]]:
    """Sign `target` (raw path and query, as written) as the developer and send it; the status, the body and
    the checks the enforcer decided for it."""
    recorder = rig.front_enforcer if authority == rig.front else rig.enforcer
    sent_headers = {"Host": authority, **(headers or {})}
    request = AWSRequest(method=method, url=f"http://{authority}{target}", data=body, headers=dict(sent_headers))
    if service == "s3":
        request.headers["X-Amz-Content-SHA256"] = "UNSIGNED-PAYLOAD"
        S3SigV4Auth(rig.credentials, "s3", REGION).add_auth(request)
    else:
        SigV4Auth(rig.credentials, service, REGION).add_auth(request)
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


def resources(checks: list[Check], action: str) -> set[str]:
    return {check.resource for check in checks if check.action == action}


# ------------------------------------------------------------------------------------------ S3

S3_KEYS = st.sampled_from(["k", "a/b", "a%2Fb", "a%20b", "x/../y", "%41", "dir/", "a+b", "%C3%A9", "a;b", "%2e%2e"])
S3_HOSTS = st.sampled_from(["moto", "localhost", "vhost-localhost", "vhost-other", "vhost-ip", "dotted"])
S3_QUERIES = st.sampled_from(["", "x=1", "x=1&x=2", "prefix=a", "versionId=", "acl=&acl="])


def s3_objects(rig: Rig, token: str) -> set[str]:
    """`arn:aws:s3:::bucket/key` of every object whose body is `token` (read from moto's store)."""
    from moto.s3.models import s3_backends

    buckets = s3_backends[ACCOUNT]["aws"].buckets  # S3 keeps one backend per partition
    return {
        f"arn:aws:s3:::{bucket}/{key}"
        for bucket in rig.names.values()
        for key, stored in buckets[bucket].keys.items()
        if stored.value == token.encode()
    }


def s3_target(rig: Rig, host_form: str, path_bucket: str, host_bucket: str, key: str) -> tuple[str, str]:
    """(Host, raw path) of one addressing form."""
    port = rig.moto.rsplit(":", 1)[1]
    hosts = {
        "moto": rig.moto,
        "localhost": f"localhost:{port}",
        "vhost-localhost": f"{host_bucket}.localhost:{port}",
        "vhost-other": f"{host_bucket}.anything:{port}",
        "vhost-ip": f"{host_bucket}.127.0.0.1:{port}",
        "dotted": f"{host_bucket}.s3.amazonaws.com",
    }
    virtual = host_form.startswith("vhost") or host_form == "dotted"
    path = f"/{key}" if virtual else f"/{path_bucket}/{key}"
    return hosts[host_form], path


@settings(max_examples=EXAMPLES)
@given(
    host_form=S3_HOSTS,
    path_bucket=st.sampled_from(["a", "b"]),
    host_bucket=st.sampled_from(["a", "b"]),
    key=S3_KEYS,
    query=S3_QUERIES,
)
def test_s3_put_lands_where_it_was_authorized(
    rig: Rig, host_form: str, path_bucket: str, host_bucket: str, key: str, query: str
) -> None:
    token = uuid.uuid4().hex
    host, path = s3_target(rig, host_form, rig.names[path_bucket], rig.names[host_bucket], key)
    target = path + (f"?{query}" if query else "")
    status, answer, checks = send(rig, rig.moto, "s3", "PUT", target, token.encode(), {"Host": host})
    touched = s3_objects(rig, token)
    authorized = resources(checks, "s3:PutObject")
    assert touched <= authorized, (target, host, status, answer[:300])
    if status == 200 and "acl" not in query:
        assert touched == authorized, (target, host, answer[:300])


@settings(max_examples=EXAMPLES)
@given(
    host_form=S3_HOSTS,
    path_bucket=st.sampled_from(["a", "b"]),
    host_bucket=st.sampled_from(["a", "b"]),
    prefixes=st.lists(st.sampled_from(["in/", "out/", "", "in%2F", "a+b"]), max_size=3),
    list_type=st.sampled_from(["", "list-type=2&"]),
)
def test_s3_list_answers_the_bucket_and_prefix_it_authorized(
    rig: Rig, host_form: str, path_bucket: str, host_bucket: str, prefixes: list[str], list_type: str
) -> None:
    host, path = s3_target(rig, host_form, rig.names[path_bucket], rig.names[host_bucket], "")
    query = list_type + "&".join(f"prefix={prefix}" for prefix in prefixes)
    target = path + (f"?{query.strip('&')}" if query.strip("&") else "")
    status, answer, checks = send(rig, rig.moto, "s3", "GET", target, headers={"Host": host})
    if status != 200:
        return
    listed = ElementTree.fromstring(answer)  # noqa: S314 - the answer of the test's own moto server
    members = {child.tag.rsplit("}", 1)[-1]: child.text or "" for child in listed}
    (check,) = [check for check in checks if check.action == "s3:ListBucket"]
    assert check.resource == f"arn:aws:s3:::{members['Name']}", (target, host)
    assert check.context.get("s3:prefix", "") == members.get("Prefix", ""), (target, host)


# ------------------------------------------------------------------------------------------ SQS

QUEUE_URL_FORMS = st.sampled_from(["none", "a", "b", "a?x=/b", "a#/b", "a/", "other-account", "bare-name", "a/b"])


def queue_url(rig: Rig, form: str) -> str | None:
    base = f"http://{rig.moto}/{ACCOUNT}"
    a, b = rig.names["a"], rig.names["b"]
    return {
        "none": None,
        "a": f"{base}/{a}",
        "b": f"{base}/{b}",
        "a?x=/b": f"{base}/{a}?x=/{b}",
        "a#/b": f"{base}/{a}#/{b}",
        "a/": f"{base}/{a}/",
        "other-account": f"http://{rig.moto}/210987654321/{a}",
        "bare-name": a,
        "a/b": f"{base}/{a}/{b}",
    }[form]


def messages(rig: Rig) -> dict[str, list[str]]:
    from moto.sqs.models import sqs_backends

    backend = sqs_backends[ACCOUNT][REGION]
    return {
        f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}": [message.body for message in backend.queues[name]._messages]
        for name in rig.names.values()
    }


@settings(max_examples=EXAMPLES)
@given(
    json_protocol=st.booleans(),
    body_url=QUEUE_URL_FORMS,
    query_url=st.sampled_from(["none", "a", "b"]),
    path=st.sampled_from(["/", "a", "b"]),
    queue_name=st.sampled_from(["none", "a", "b"]),
)
def test_sqs_send_lands_in_the_queue_it_was_authorized_for(
    rig: Rig, json_protocol: bool, body_url: str, query_url: str, path: str, queue_name: str
) -> None:
    token = uuid.uuid4().hex
    params: dict[str, str] = {"MessageBody": token}
    url = queue_url(rig, body_url)
    if url is not None:
        params["QueueUrl"] = url
    if queue_name != "none":
        params["QueueName"] = rig.names[queue_name]
    raw_path = path if path == "/" else f"/{ACCOUNT}/{rig.names[path]}"
    query = "" if query_url == "none" else urllib.parse.urlencode({"QueueUrl": queue_url(rig, query_url)})
    target = raw_path + (f"?{query}" if query else "")
    if json_protocol:
        headers = {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.SendMessage"}
        body = json.dumps(params).encode()
    else:
        headers = {"Content-Type": FORM}
        body = urllib.parse.urlencode({"Action": "SendMessage", "Version": "2012-11-05", **params}).encode()
    status, answer, checks = send(rig, rig.moto, "sqs", "POST", target, body, headers)
    touched = {queue for queue, bodies in messages(rig).items() if token in bodies}
    authorized = resources(checks, "sqs:SendMessage")
    assert touched <= authorized, (target, params, status, answer[:300])
    if status == 200:
        assert touched == authorized, (target, params, answer[:300])


# ------------------------------------------------------------------------------------------ DynamoDB


@settings(max_examples=EXAMPLES)
@given(
    table=st.sampled_from(["a", "b", "arn-a", "arn-b", "arn-a-other-region", "arn-a-other-account"]),
    twice=st.sampled_from(["none", "a", "b"]),
    query=st.sampled_from(["", "TableName=a", "TableName=b"]),
    path=st.sampled_from(["/", "/x", "/?"]),
)
def test_dynamodb_put_item_lands_in_the_table_it_was_authorized_for(
    rig: Rig, table: str, twice: str, query: str, path: str
) -> None:
    token = uuid.uuid4().hex
    names = {key: rig.names[key] for key in ("a", "b")}
    forms = {
        "a": names["a"],
        "b": names["b"],
        "arn-a": f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{names['a']}",
        "arn-b": f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{names['b']}",
        "arn-a-other-region": f"arn:aws:dynamodb:eu-west-1:{ACCOUNT}:table/{names['a']}",
        "arn-a-other-account": f"arn:aws:dynamodb:{REGION}:210987654321:table/{names['a']}",
    }
    item = json.dumps({"id": {"S": token}})
    # a JSON object naming TableName twice is written by hand (json.dumps cannot)
    extra = f'"TableName": {json.dumps(names[twice])}, ' if twice != "none" else ""
    body = f'{{{extra}"TableName": {json.dumps(forms[table])}, "Item": {item}}}'.encode()
    query_text = "" if not query else f"TableName={names[query[-1]]}"
    target = path.rstrip("?") + (f"?{query_text}" if query_text else "")
    headers = {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "DynamoDB_20120810.PutItem"}
    status, answer, checks = send(rig, rig.moto, "dynamodb", "POST", target, body, headers)
    ddb = rig.client("dynamodb")
    touched = {
        f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{name}"
        for name in names.values()
        if "Item" in ddb.get_item(TableName=name, Key={"id": {"S": token}})
    }
    authorized = resources(checks, "dynamodb:PutItem")
    assert touched <= authorized, (target, body, status, answer[:300])
    if status == 200:
        assert touched == authorized, (target, body, answer[:300])


# ------------------------------------------------------------------------------------------ SNS


def notifications(rig: Rig) -> dict[str, list[str]]:
    from moto.sns.models import sns_backends

    backend = sns_backends[ACCOUNT][REGION]
    found: dict[str, list[str]] = {}
    for name in rig.names.values():
        arn = f"arn:aws:sns:{REGION}:{ACCOUNT}:{name}"
        found[arn] = [str(sent[1]) for sent in backend.topics[arn].sent_notifications]
    return found


@settings(max_examples=EXAMPLES)
@given(
    topic=st.sampled_from(["none", "a", "b"]),
    target=st.sampled_from(["none", "a", "b"]),
    in_query=st.sampled_from(["none", "TopicArn=a", "TopicArn=b", "TargetArn=b"]),
    repeat=st.booleans(),
)
def test_sns_publish_reaches_the_topic_it_was_authorized_for(
    rig: Rig, topic: str, target: str, in_query: str, repeat: bool
) -> None:
    token = uuid.uuid4().hex
    arn = {key: f"arn:aws:sns:{REGION}:{ACCOUNT}:{rig.names[key]}" for key in ("a", "b")}
    pairs = [("Action", "Publish"), ("Version", "2010-03-31"), ("Message", token)]
    if topic != "none":
        pairs.append(("TopicArn", arn[topic]))
    if target != "none":
        pairs.append(("TargetArn", arn[target]))
    if repeat and topic != "none":
        pairs.append(("TopicArn", arn["b" if topic == "a" else "a"]))
    query = ""
    if in_query != "none":
        member, which = in_query.split("=")
        query = urllib.parse.urlencode({member: arn[which]})
    body = urllib.parse.urlencode(pairs).encode()
    status, answer, checks = send(
        rig, rig.moto, "sns", "POST", "/" + (f"?{query}" if query else ""), body, {"Content-Type": FORM}
    )
    touched = {name for name, sent in notifications(rig).items() if token in sent}
    authorized = resources(checks, "sns:Publish")
    assert touched <= authorized, (pairs, query, status, answer[:300])
    if status == 200:
        assert touched == authorized, (pairs, query, answer[:300])


# ------------------------------------------------------------------------------------------ servestack's fronts

NOT_FOUND_FUNCTION = re.compile(r"Function not found: (arn:aws:lambda:[^\"]+)")
NOT_FOUND_ENDPOINT = re.compile(r"Endpoint (\S+) of account \d+ not found")


@settings(max_examples=EXAMPLES)
@given(
    name=st.sampled_from(
        [
            "fn-a",
            "fn-a:live",
            f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:fn-a",
            f"arn:aws:lambda:eu-west-1:{ACCOUNT}:function:fn-a",
            f"arn:aws:lambda:{REGION}:210987654321:function:fn-a:live",
            f"{ACCOUNT}:function:fn-a",
            "210987654321:function:fn-a",
        ]
    ),
    encode_colons=st.booleans(),
    qualifier=st.sampled_from(["", "Qualifier=live", "Qualifier=live&Qualifier=dev", "Qualifier=dev"]),
)
def test_lambda_invoke_runs_the_function_it_was_authorized_for(
    rig: Rig, name: str, encode_colons: bool, qualifier: str
) -> None:
    raw = urllib.parse.quote(name, safe="" if encode_colons else ":")
    target = f"/2015-03-31/functions/{raw}/invocations" + (f"?{qualifier}" if qualifier else "")
    status, answer, checks = send(rig, rig.front, "lambda", "POST", target, b"{}", {"Content-Type": "application/json"})
    authorized = resources(checks, "lambda:InvokeFunction")
    looked_up = NOT_FOUND_FUNCTION.search(answer.decode())
    if not authorized:
        assert status >= 400
        return
    if looked_up is not None:  # the Lambda service looked for this function: the one authorized
        assert {looked_up.group(1)} == authorized, (target, answer[:300])


@settings(max_examples=EXAMPLES)
@given(
    name=st.sampled_from(["ep-a", "EP-A", "ep%2Da", "ep-a%2Fx", "ep.a", "ep-b"]),
    operation=st.sampled_from(["invocations", "async-invocations", "invocations/", "x/invocations"]),
    query=st.sampled_from(["", "x=1", "x=1&x=2"]),
)
def test_sagemaker_invoke_looks_up_the_endpoint_it_was_authorized_for(
    rig: Rig, name: str, operation: str, query: str
) -> None:
    target = f"/endpoints/{name}/{operation}" + (f"?{query}" if query else "")
    headers = {"Content-Type": "application/json", "X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD"}
    if operation == "async-invocations":
        headers["X-Amzn-SageMaker-InputLocation"] = "s3://bucket/in.json"
    status, answer, checks = send(rig, rig.front, "sagemaker", "POST", target, b"{}", headers)
    authorized = {check.resource for check in checks if check.action.startswith("sagemaker:InvokeEndpoint")}
    looked_up = NOT_FOUND_ENDPOINT.search(answer.decode())
    if looked_up is not None:  # the front looked this endpoint up: the one authorized (SageMaker ARNs are lower-case)
        assert authorized == {f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:endpoint/{looked_up.group(1).lower()}"}, target
    if not authorized:
        assert status >= 400
