"""The one form of a request the enforcer authorizes and forwards (servestack/local/iam/canonical.py)."""

from __future__ import annotations

import gzip
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


# ------------------------------------------------------------------------------ one reading by moto (issue 37)


def moto_querystring(request: HttpRequest) -> dict[str, list[str]]:
    """`self.querystring` as moto 5.2's `BaseResponse.setup_class` builds it from a forwarded request: the form
    (form content type), else the URL's query, else the body read as a form, else the headers."""
    content_type = (request.header("content-type") or "").lower()
    text = request.body.decode(errors="replace")
    form = urllib.parse.parse_qs(text, keep_blank_values=True)
    if content_type.startswith("application/x-www-form-urlencoded") and form:
        return form
    if request.raw_query:
        return urllib.parse.parse_qs(request.raw_query, keep_blank_values=True)
    if text:
        return {key: [value] for key, value in urllib.parse.parse_qsl(text, keep_blank_values=True)}
    return {key.title(): [value] for key, value in request.headers.items()}


@pytest.mark.parametrize(
    ("service", "target", "params"),
    [
        ("sqs", "AmazonSQS.SendMessage", {"QueueUrl": "jobs", "MessageBody": '{"note": "a&Action=DeleteQueue&b"}'}),
        ("dynamodb", "DynamoDB_20120810.GetItem", {"TableName": "t", "Key": {"id": {"S": "x&Action=DeleteTable&y"}}}),
        ("logs", "Logs_20140328.PutLogEvents", {"logGroupName": "g", "logEvents": [{"message": "&logGroupName=o"}]}),
        ("events", "AWSEvents.ListRules", {}),
    ],
)
@pytest.mark.parametrize("content_type", ["application/x-amz-json-1.0", "application/x-www-form-urlencoded", ""])
def test_a_json_body_is_forwarded_so_that_no_form_reading_finds_a_parameter(
    service: str, target: str, params: dict[str, object], content_type: str
) -> None:
    headers = {"host": "localhost:4566", "x-amz-target": target, "content-type": content_type}
    forwarded = canonical(HttpRequest("POST", "/", "", headers, json.dumps(params).encode()), service)
    # THEN moto's querystring is one name, the whole body (no Action, no parameter), under a JSON content type
    assert list(moto_querystring(forwarded)) == [forwarded.body.decode()]
    assert b"&" not in forwarded.body
    assert b"=" not in forwarded.body
    assert forwarded.header("content-type") in ("application/x-amz-json-1.0", "application/x-amz-json-1.1")
    # AND it is the JSON the enforcer read, with the same target
    expected = dict(params)
    if service == "sqs":
        expected["QueueUrl"] = f"http://127.0.0.1:4566/{ACCOUNT}/jobs"
    assert json.loads(forwarded.body) == expected
    assert forwarded.header("x-amz-target") == target


def test_an_empty_json_body_is_forwarded_as_an_empty_object_not_as_nothing() -> None:
    # (moto reads the headers as parameters when the body, the form and the query string are all empty)
    headers = {"host": "localhost:4566", "x-amz-target": "DynamoDB_20120810.ListTables", "action": "DeleteTable"}
    forwarded = canonical(HttpRequest("POST", "/", "", headers, b""), "dynamodb")
    assert forwarded.body == b"{}"
    assert "Action" not in moto_querystring(forwarded)


def test_a_gzip_json_body_is_forwarded_decompressed() -> None:
    headers = {**JSON_HEADERS, "x-amz-target": "DynamoDB_20120810.GetItem", "content-encoding": "gzip"}
    body = gzip.compress(b'{"TableName": "t&Action=DeleteTable"}')
    forwarded = canonical(HttpRequest("POST", "/", "", headers, body), "dynamodb")
    assert json.loads(forwarded.body) == {"TableName": "t&Action=DeleteTable"}
    assert forwarded.header("content-encoding") is None
    assert forwarded.header("content-length") == str(len(forwarded.body))


@pytest.mark.parametrize(
    "target", ["AmazonSQS.SendMessage.DeleteQueue", "AmazonSQS.", "AmazonSQS", ".SendMessage", "AmazonSQS.Send Message"]
)
def test_a_target_that_does_not_name_one_operation_is_an_unknown_operation(target: str) -> None:
    # (moto runs a target's last dot-separated part; the enforcer would have authorized its first)
    request = HttpRequest("POST", "/", "", {**JSON_HEADERS, "x-amz-target": target}, b'{"QueueUrl": "jobs"}')
    assert refusal(request, "sqs").json_type == "UnknownOperationException"


@pytest.mark.parametrize("content_type", ["text/plain", "application/json", ""])
def test_a_query_protocol_call_whose_action_is_not_in_its_form_is_missing_its_action(content_type: str) -> None:
    # (moto would read a body that is not a form as one, and find DeleteTopic in it)
    body = b"Action=DeleteTopic&TopicArn=arn:aws:sns:us-east-1:123456789012:other"
    request = HttpRequest("POST", "/", "", {"host": "localhost", "content-type": content_type}, body)
    assert refusal(request, "sns").query_code == "MissingAction"


def test_a_query_protocol_call_is_forwarded_as_its_form_alone() -> None:
    request = HttpRequest("GET", "/", "Action=Publish&Message=a%26Action%3DDeleteTopic", {"host": "localhost"}, b"x=1")
    forwarded = canonical(request, "sns")
    assert moto_querystring(forwarded) == {"Action": ["Publish"], "Message": ["a&Action=DeleteTopic"]}


def test_a_cbor_call_is_forwarded_with_its_operation_as_the_query_string() -> None:
    path = "/service/GraniteServiceVersion20100801/operation/PutMetricData"
    headers = {"host": "localhost", "content-type": "application/cbor"}
    forwarded = canonical(HttpRequest("POST", path, "", headers, b"\xa1iNamespaceca&b"), "monitoring")
    assert moto_querystring(forwarded) == {"Action": ["PutMetricData"]}


@pytest.mark.parametrize("method", ["GET", "HEAD", "DELETE"])
def test_an_s3_call_that_takes_no_body_is_forwarded_without_one(method: str) -> None:
    headers = {"host": "localhost", "content-type": "application/x-www-form-urlencoded", "content-length": "12"}
    forwarded = canonical(HttpRequest(method, "/bucket/k", "", headers, b"versionId=v1"), "s3")
    assert forwarded.body == b""
    assert forwarded.header("content-length") == "0"


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "multipart/form-data; boundary=x"])
def test_an_s3_put_of_a_form_typed_body_is_not_emulated(content_type: str) -> None:
    request = HttpRequest("PUT", "/bucket/k", "", {"host": "localhost", "content-type": content_type}, b"acl=public")
    refused = refusal(request, "s3")
    assert (refused.s3_code, refused.s3_status) == ("NotImplemented", 501)
    # (an empty one, or data of any other type, goes on as sent)
    empty = canonical(HttpRequest("PUT", "/bucket/k", "", {"host": "localhost", "content-type": content_type}), "s3")
    assert empty.body == b""
    data = canonical(
        HttpRequest("PUT", "/bucket/k", "", {"host": "localhost", "content-type": "text/csv"}, b"a=1"), "s3"
    )
    assert data.body == b"a=1"
