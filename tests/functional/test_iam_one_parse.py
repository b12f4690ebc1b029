"""The enforcer and moto read a request one way: each escape issue 25 found, replayed over HTTP against the
enforced moto server with requests signed by botocore's own signer, and refused as AWS refuses them.

Each test checks both halves: the refusal, and that the resource the role may not touch was left untouched.
"""

from __future__ import annotations

import hashlib
import json
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import httpx
import pytest
from botocore.auth import S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from servestack.local.iam import IamEnforcer, Identity, IdentityStore
from servestack.local.iam.server import EnforcedMotoServer

ACCOUNT = "123456789012"
REGION = "us-east-1"
FORM = "application/x-www-form-urlencoded; charset=utf-8"


@dataclass
class Emulator:
    url: str
    store: IdentityStore
    admin: Any  # a boto3 Session of the developer

    def client(self, service: str, identity: Identity | None = None, region: str = REGION) -> Any:
        session = self.admin if identity is None else session_of(identity, region)
        config = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1})
        return session.client(service, endpoint_url=self.url, config=config, region_name=region)


def session_of(identity: Identity, region: str = REGION) -> boto3.Session:
    return boto3.Session(
        aws_access_key_id=identity.access_key_id,
        aws_secret_access_key=identity.secret_access_key,
        aws_session_token=identity.session_token,
        region_name=region,
    )


@pytest.fixture(scope="module")
def emulator() -> Iterator[Emulator]:
    store = IdentityStore()
    developer = store.developer()
    server = EnforcedMotoServer(IamEnforcer(store, log=lambda line: None)).start()
    yield Emulator(server.url, store, session_of(developer))
    server.stop()


@pytest.fixture
def name() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


def role(emulator: Emulator, role_name: str, *statements: dict[str, Any]) -> Identity:
    document = {"Version": "2012-10-17", "Statement": list(statements)}
    return emulator.store.role(role_name, {"Policy": document}, session_name="fn")


def send_signed(
    identity: Identity,
    service: str,
    method: str,
    url: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    """Sign `url` (whose query is sent as written) as `identity` with botocore's signer, then send it as is;
    a `Host` in `headers` is signed and sent in place of the URL's."""
    request = AWSRequest(method=method, url=url, data=body, headers=dict(headers or {}))
    credentials = Credentials(identity.access_key_id, identity.secret_access_key, identity.session_token)
    if service == "s3":
        request.headers["X-Amz-Content-SHA256"] = hashlib.sha256(body).hexdigest()
        S3SigV4Auth(credentials, "s3", REGION).add_auth(request)
    else:
        SigV4Auth(credentials, service, REGION).add_auth(request)
    sent = dict(request.headers.items())
    return httpx.request(method, url, content=body, headers=sent)


# ------------------------------------------------------------------------------------------ SQS


@dataclass
class Queues:
    jobs: str
    dlq: str
    sender: Identity


@pytest.fixture
def queues(emulator: Emulator, name: str) -> Queues:
    sqs = emulator.client("sqs")
    jobs = sqs.create_queue(QueueName=f"{name}-jobs")["QueueUrl"]
    dlq = sqs.create_queue(QueueName=f"{name}-dlq")["QueueUrl"]
    sender = role(
        emulator,
        f"{name}-submit",
        {"Effect": "Allow", "Action": "sqs:SendMessage", "Resource": f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}-jobs"},
    )
    return Queues(jobs, dlq, sender)


def messages_in(emulator: Emulator, queue_url: str) -> int:
    attributes = emulator.client("sqs").get_queue_attributes(
        QueueUrl=queue_url, AttributeNames=["ApproximateNumberOfMessages"]
    )
    return int(attributes["Attributes"]["ApproximateNumberOfMessages"])


def json_sqs(queues: Queues, emulator: Emulator, body: dict[str, Any], query: str = "") -> httpx.Response:
    headers = {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.SendMessage"}
    url = emulator.url + "/" + (f"?{query}" if query else "")
    return send_signed(queues.sender, "sqs", "POST", url, json.dumps(body).encode(), headers)


@pytest.mark.parametrize("trick", ["?x=/{dlq}", "#/{dlq}"], ids=["query-in-url", "fragment-in-url"])
def test_a_queue_url_with_a_query_or_fragment_naming_another_queue_is_refused(
    emulator: Emulator, queues: Queues, trick: str
) -> None:
    # GIVEN a role that may send only to jobs, and a QueueUrl `…/jobs?x=/dlq` (or `#/dlq`)
    dlq_name = queues.dlq.rsplit("/", 1)[-1]
    tricked = queues.jobs + trick.format(dlq=dlq_name)
    # WHEN it sends with it (boto3, the JSON protocol)
    with pytest.raises(ClientError) as raised:
        emulator.client("sqs", queues.sender).send_message(QueueUrl=tricked, MessageBody="m")
    # THEN SQS's InvalidAddress, and the dead-letter queue holds nothing
    assert raised.value.response["Error"]["Code"] == "InvalidAddress"
    assert messages_in(emulator, queues.dlq) == 0
    assert messages_in(emulator, queues.jobs) == 0


def test_a_queue_name_sent_to_another_queues_path_is_refused(emulator: Emulator, queues: Queues) -> None:
    # GIVEN the query protocol, posted to the dead-letter queue's path, naming jobs in QueueName
    jobs_name = queues.jobs.rsplit("/", 1)[-1]
    body = urllib.parse.urlencode(
        {"Action": "SendMessage", "Version": "2012-11-05", "QueueName": jobs_name, "MessageBody": "m"}
    ).encode()
    path = urllib.parse.urlsplit(queues.dlq).path
    response = send_signed(queues.sender, "sqs", "POST", emulator.url + path, body, {"Content-Type": FORM})
    # THEN refused, and nothing reached the dead-letter queue
    assert response.status_code == 404, response.text
    assert "<Code>InvalidAddress</Code>" in response.text
    assert messages_in(emulator, queues.dlq) == 0


@pytest.mark.parametrize("protocol", ["query", "json"])
def test_a_queue_url_in_the_query_string_and_another_in_the_body_is_refused(
    emulator: Emulator, queues: Queues, protocol: str
) -> None:
    # GIVEN QueueUrl=dlq in the query string and QueueUrl=jobs in the body
    if protocol == "json":
        query = urllib.parse.urlencode({"QueueUrl": queues.dlq, "MessageBody": "m"})
        response = json_sqs(queues, emulator, {"QueueUrl": queues.jobs, "MessageBody": "m"}, query)
    else:
        query = urllib.parse.urlencode(
            {"Action": "SendMessage", "Version": "2012-11-05", "QueueUrl": queues.dlq, "MessageBody": "m"}
        )
        body = urllib.parse.urlencode({"QueueUrl": queues.jobs}).encode()
        response = send_signed(queues.sender, "sqs", "POST", f"{emulator.url}/?{query}", body, {"Content-Type": FORM})
    # THEN a 400 naming the parameter, and nothing reached the dead-letter queue
    assert response.status_code == 400, response.text
    assert "QueueUrl" in response.text
    assert messages_in(emulator, queues.dlq) == 0


# ------------------------------------------------------------------------------------------ S3


def test_an_s3_host_naming_another_bucket_is_refused(emulator: Emulator, name: str) -> None:
    # GIVEN two buckets, and a role that may read, write and delete only in the first
    s3 = emulator.client("s3")
    for bucket in (f"{name}-mine", f"{name}-other"):
        s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=f"{name}-other", Key=f"{name}-mine/k", Body=b"secret")
    owner = role(
        emulator,
        f"{name}-s3",
        {
            "Effect": "Allow",
            "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
            "Resource": f"arn:aws:s3:::{name}-mine/*",
        },
    )
    port = urllib.parse.urlsplit(emulator.url).port
    host = {"Host": f"{name}-other.anything:{port}"}
    url = f"{emulator.url}/{name}-mine/k"
    # WHEN it signs requests to its own path with `Host: <other bucket>.anything:port`
    read = send_signed(owner, "s3", "GET", url, headers=host)
    write = send_signed(owner, "s3", "PUT", f"{url}2", b"planted", headers=host)
    delete = send_signed(owner, "s3", "DELETE", url, headers=host)
    # THEN each is refused as S3 refuses a host that is not one of its names or buckets
    for response in (read, write, delete):
        assert response.status_code == 404, response.text
        assert "<Code>NoSuchBucket</Code>" in response.text
        assert f"<BucketName>{name}-other.anything</BucketName>" in response.text
    # AND the other bucket is as it was
    keys = [item["Key"] for item in s3.list_objects_v2(Bucket=f"{name}-other").get("Contents", [])]
    assert keys == [f"{name}-mine/k"]


def test_a_virtual_hosted_bucket_under_the_emulators_own_name_still_works(emulator: Emulator, name: str) -> None:
    emulator.client("s3").create_bucket(Bucket=name)
    writer = role(emulator, f"{name}-w", {"Effect": "Allow", "Action": "s3:*", "Resource": f"arn:aws:s3:::{name}/*"})
    port = urllib.parse.urlsplit(emulator.url).port
    put = send_signed(writer, "s3", "PUT", f"{emulator.url}/k", b"v", headers={"Host": f"{name}.localhost:{port}"})
    assert put.status_code == 200, put.text
    assert emulator.client("s3").get_object(Bucket=name, Key="k")["Body"].read() == b"v"


def test_a_repeated_prefix_is_refused(emulator: Emulator, name: str) -> None:
    # GIVEN a role that may list only under in/, and objects under in/ and out/
    s3 = emulator.client("s3")
    s3.create_bucket(Bucket=name)
    for key in ("in/a", "out/secret"):
        s3.put_object(Bucket=name, Key=key, Body=b"x")
    lister = role(
        emulator,
        f"{name}-list",
        {
            "Effect": "Allow",
            "Action": "s3:ListBucket",
            "Resource": f"arn:aws:s3:::{name}",
            "Condition": {"StringLike": {"s3:prefix": ["in/*"]}},
        },
    )
    # WHEN it lists with `prefix=out/&prefix=in/`
    response = send_signed(lister, "s3", "GET", f"{emulator.url}/{name}?list-type=2&prefix=out%2F&prefix=in%2F")
    # THEN S3's InvalidArgument naming the parameter, and no key under out/ in the answer
    assert response.status_code == 400, response.text
    assert "<Code>InvalidArgument</Code>" in response.text
    assert "<ArgumentName>prefix</ArgumentName>" in response.text
    assert "out/secret" not in response.text
