"""The one form of a request the enforcer authorizes and forwards (servestack/local/iam/canonical.py)."""

from __future__ import annotations

import json
import urllib.parse

import pytest

from servestack.local.iam.canonical import Endpoint, Malformed, canonical_front_request, canonical_request
from servestack.local.iam.wire import HttpRequest

ACCOUNT = "123456789012"
REGION = "us-east-1"
ENDPOINT = Endpoint("127.0.0.1:4566")
JSON_HEADERS = {"host": "localhost:4566", "content-type": "application/x-amz-json-1.0"}
FORM_HEADERS = {"host": "localhost:4566", "content-type": "application/x-www-form-urlencoded"}


def canonical(request: HttpRequest, service: str) -> HttpRequest:
    return canonical_request(request, service, ENDPOINT, REGION, ACCOUNT)


def refusal(request: HttpRequest, service: str) -> Malformed:
    with pytest.raises(Malformed) as raised:
        canonical(request, service)
    return raised.value


def test_a_query_protocol_call_becomes_one_form_body_posted_to_the_root() -> None:
    request = HttpRequest("GET", f"/{ACCOUNT}/jobs", "Action=SendMessage&MessageBody=m", FORM_HEADERS, b"")
    form = canonical(request, "sqs")
    assert (form.method, form.raw_path, form.raw_query, form.header("host")) == ("POST", "/", "", "127.0.0.1:4566")
    assert dict(urllib.parse.parse_qsl(form.body.decode())) == {
        "Action": "SendMessage",
        "MessageBody": "m",
        "QueueUrl": f"http://127.0.0.1:4566/{ACCOUNT}/jobs",
    }


def test_a_json_call_with_a_query_string_or_a_repeated_key_is_refused() -> None:
    target = {**JSON_HEADERS, "x-amz-target": "DynamoDB_20120810.PutItem"}
    with_query = HttpRequest("POST", "/", "TableName=other", target, b'{"TableName": "jobs"}')
    assert "TableName" in refusal(with_query, "dynamodb").message
    twice = HttpRequest("POST", "/", "", target, b'{"TableName": "jobs", "TableName": "other"}')
    assert refusal(twice, "dynamodb").json_type == "SerializationException"
    assert canonical(HttpRequest("POST", "/x", "", target, b'{"TableName": "jobs"}'), "dynamodb").raw_path == "/"


@pytest.mark.parametrize(
    ("url", "path", "name"),
    [
        (f"http://localhost:4566/{ACCOUNT}/jobs?x=/dlq", "/", None),
        (f"http://localhost:4566/{ACCOUNT}/jobs#/dlq", "/", None),
        (f"http://localhost:4566/{ACCOUNT}/jobs/", "/", None),
        (f"http://localhost:4566/{ACCOUNT}/jobs", f"/{ACCOUNT}/dlq", None),
        (None, f"/{ACCOUNT}/dlq", "jobs"),
        (f"https://sqs.eu-west-1.amazonaws.com/{ACCOUNT}/jobs", "/", None),
        ("jobs", f"/{ACCOUNT}/dlq", None),
    ],
)
def test_an_sqs_queue_named_two_ways_or_by_a_url_that_is_not_one_is_an_invalid_address(
    url: str | None, path: str, name: str | None
) -> None:
    params = {key: value for key, value in (("QueueUrl", url), ("QueueName", name)) if value is not None}
    headers = {**JSON_HEADERS, "x-amz-target": "AmazonSQS.SendMessage"}
    request = HttpRequest("POST", path, "", headers, json.dumps({**params, "MessageBody": "m"}).encode())
    refused = refusal(request, "sqs")
    assert (refused.query_code, refused.status) == ("InvalidAddress", 404)


def test_a_bare_queue_name_is_the_callers_queue_of_that_name() -> None:
    headers = {**JSON_HEADERS, "x-amz-target": "AmazonSQS.SendMessage"}
    request = HttpRequest("POST", "/", "", headers, json.dumps({"QueueUrl": "jobs", "MessageBody": "m"}).encode())
    assert json.loads(canonical(request, "sqs").body)["QueueUrl"] == f"http://127.0.0.1:4566/{ACCOUNT}/jobs"


def test_a_queue_of_another_account_does_not_exist_locally() -> None:
    headers = {**JSON_HEADERS, "x-amz-target": "AmazonSQS.SendMessage"}
    body = json.dumps({"QueueUrl": "http://localhost:4566/210987654321/jobs", "MessageBody": "m"}).encode()
    assert refusal(HttpRequest("POST", "/", "", headers, body), "sqs").json_type == "QueueDoesNotExist"


def test_s3_refuses_a_repeated_parameter_and_an_encoded_bucket() -> None:
    repeated = refusal(HttpRequest("GET", "/jobs", "prefix=a&prefix=b", {"host": "localhost"}), "s3")
    assert (repeated.s3_code, repeated.members["ArgumentName"]) == ("InvalidArgument", "prefix")
    encoded = refusal(HttpRequest("GET", "/jo%62s/k", "", {"host": "localhost"}), "s3")
    assert encoded.s3_code == "InvalidBucketName"


def test_sns_publish_names_one_destination() -> None:
    body = urllib.parse.urlencode(
        {"Action": "Publish", "Message": "m", "TopicArn": "arn:aws:sns:us-east-1:1:a", "TargetArn": "arn:b"}
    ).encode()
    assert refusal(HttpRequest("POST", "/", "", FORM_HEADERS, body), "sns").query_code == "InvalidParameter"


@pytest.mark.parametrize(
    ("name", "refused"),
    [
        ("fn", False),
        (f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:fn:live", False),
        (f"arn:aws:lambda:eu-west-1:{ACCOUNT}:function:fn", True),
        ("210987654321:function:fn", True),
    ],
)
def test_a_lambda_function_of_another_region_or_account_is_not_found(name: str, refused: bool) -> None:
    path = f"/2015-03-31/functions/{urllib.parse.quote(name, safe='')}/invocations"
    request = HttpRequest("POST", path, "", {"host": "localhost"}, b"{}")
    if not refused:
        canonical_front_request(request, "lambda", REGION, ACCOUNT)
        return
    with pytest.raises(Malformed) as raised:
        canonical_front_request(request, "lambda", REGION, ACCOUNT)
    assert (raised.value.json_type, raised.value.status) == ("ResourceNotFoundException", 404)


def test_an_http_api_keeps_its_repeated_query_parameters() -> None:
    canonical_front_request(HttpRequest("GET", "/items", "a=1&a=2", {"host": "x"}), "execute-api", REGION, ACCOUNT)
