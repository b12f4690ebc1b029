"""Who is calling: SigV4 (header and presigned), S3's SigV2 presigned URLs, session tokens, expiry."""

from __future__ import annotations

import hashlib
import urllib.parse
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from botocore.auth import HmacV1QueryAuth, S3SigV4Auth, S3SigV4QueryAuth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from servestack.local.iam.identities import IdentityStore
from servestack.local.iam.sigv4 import AuthFailure, Failure, authenticate
from servestack.local.iam.wire import HttpRequest

LAMBDA_URL = "http://127.0.0.1:9000/2015-03-31/functions/arn%3Aaws%3Alambda%3Aus-east-1%3A123456789012%3Afunction%3Afn/invocations"
S3_URL = "http://127.0.0.1:9000/jobs/in/a%20b%2Bc%3Ad~e"
POLICIES = {"inline": {"Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}}


@pytest.fixture
def store() -> IdentityStore:
    return IdentityStore()


def over_the_wire(signed: AWSRequest, body: bytes = b"", **header_changes: str) -> HttpRequest:
    """What the server receives for a request botocore signed."""
    split = urllib.parse.urlsplit(signed.url)
    headers = {
        name.lower(): value.decode() if isinstance(value, bytes) else value for name, value in signed.headers.items()
    }
    headers.setdefault("host", split.netloc)
    headers.update({name.replace("_", "-"): value for name, value in header_changes.items()})
    return HttpRequest(signed.method, split.path, split.query, headers, body)


def signed(
    credentials: Credentials, service: str, url: str, body: bytes = b"", method: str = "POST", **headers: str
) -> AWSRequest:
    request = AWSRequest(method=method, url=url, data=body, headers={"Content-Type": "application/json", **headers})
    signer = S3SigV4Auth if service == "s3" else SigV4Auth
    if service == "s3" and "X-Amz-Content-SHA256" not in headers:
        request.headers["X-Amz-Content-SHA256"] = hashlib.sha256(body).hexdigest()
    signer(credentials, service, "us-east-1").add_auth(request)
    return request


def failure_of(request: HttpRequest, store: IdentityStore, **kwargs: Any) -> Failure:
    with pytest.raises(AuthFailure) as raised:
        authenticate(request, store, **kwargs)
    return raised.value.failure


def test_a_role_signed_request_is_that_roles_session(store: IdentityStore) -> None:
    # GIVEN role credentials minted by the store, and requests signed with them by botocore
    role = store.role("Worker", POLICIES, session_name="worker-fn")
    credentials = Credentials(role.access_key_id, role.secret_access_key, role.session_token)
    body = b'{"instances": [[1, 2]]}'
    for service, url in (("lambda", LAMBDA_URL), ("s3", S3_URL)):
        request = over_the_wire(signed(credentials, service, url, body), body)
        # WHEN authenticated
        authenticated = authenticate(request, store)
        # THEN the caller is the role's session, as AWS prints it
        assert authenticated is not None
        identity, signature = authenticated
        assert identity.arn == "arn:aws:sts::123456789012:assumed-role/Worker/worker-fn"
        assert signature.service == service


def test_an_unsigned_request_is_anonymous(store: IdentityStore) -> None:
    assert authenticate(HttpRequest("GET", "/jobs/k", "", {"host": "localhost"}), store) is None


def test_the_canonical_uri_is_encoded_twice_except_for_s3(store: IdentityStore) -> None:
    # GIVEN the same escaped path signed once as S3 (single-encoded) and once as Lambda (double-encoded)
    user = store.developer()
    credentials = Credentials(user.access_key_id, user.secret_access_key)
    s3_request = over_the_wire(signed(credentials, "s3", S3_URL))
    lambda_request = over_the_wire(signed(credentials, "lambda", LAMBDA_URL))
    assert authenticate(s3_request, store) is not None
    assert authenticate(lambda_request, store) is not None
    # WHEN each is signed with the other service's rule for the path (and its own scope)
    single = AWSRequest(method="POST", url=LAMBDA_URL, data=b"", headers={"Content-Type": "application/json"})
    S3SigV4Auth(credentials, "lambda", "us-east-1").add_auth(single)
    double = AWSRequest(method="POST", url=S3_URL, data=b"", headers={"Content-Type": "application/json"})
    double.headers["X-Amz-Content-SHA256"] = hashlib.sha256(b"").hexdigest()
    SigV4Auth(credentials, "s3", "us-east-1").add_auth(double)
    # THEN neither verifies
    assert failure_of(over_the_wire(single), store) is Failure.BAD_SIGNATURE
    assert failure_of(over_the_wire(double), store) is Failure.BAD_SIGNATURE


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"body": b'{"instances": [[9, 9]]}'}, Failure.BAD_SIGNATURE),
        ({"path": "/2015-03-31/functions/other/invocations"}, Failure.BAD_SIGNATURE),
        ({"query": "Qualifier=live"}, Failure.BAD_SIGNATURE),
        ({"header": ("content-type", "text/csv")}, Failure.BAD_SIGNATURE),
        ({"header": ("x-amz-date", "20200101T000000Z")}, Failure.BAD_SIGNATURE),
    ],
)
def test_a_tampered_request_is_refused(store: IdentityStore, change: dict[str, Any], expected: Failure) -> None:
    # GIVEN a signed request, then one part of it changed in transit
    role = store.role("Worker", POLICIES, session_name="worker-fn")
    body = b'{"instances": [[1, 2]]}'
    request = over_the_wire(
        signed(Credentials(role.access_key_id, role.secret_access_key, role.session_token), "lambda", LAMBDA_URL, body),
        body,
    )
    headers = dict(request.headers)
    if "header" in change:
        headers[change["header"][0]] = change["header"][1]
    tampered = HttpRequest(
        request.method,
        change.get("path", request.raw_path),
        change.get("query", request.raw_query),
        headers,
        change.get("body", request.body),
    )
    # THEN it is refused as a signature mismatch
    assert failure_of(tampered, store) is expected


def test_s3_checks_the_declared_payload_hash_against_the_body(store: IdentityStore) -> None:
    user = store.developer()
    credentials = Credentials(user.access_key_id, user.secret_access_key)
    request = over_the_wire(signed(credentials, "s3", S3_URL, b"original", method="PUT"), b"changed")
    with pytest.raises(AuthFailure) as raised:
        authenticate(request, store)
    assert raised.value.failure is Failure.CONTENT_SHA256_MISMATCH
    assert raised.value.details["ClientComputedContentSHA256"] == hashlib.sha256(b"original").hexdigest()


@pytest.mark.parametrize(
    "payload", ["UNSIGNED-PAYLOAD", "STREAMING-UNSIGNED-PAYLOAD-TRAILER", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"]
)
def test_unsigned_and_streaming_payloads_sign_the_declared_value(store: IdentityStore, payload: str) -> None:
    # GIVEN an S3 upload whose payload is not hashed (aws-chunked framing in the body)
    user = store.developer()
    credentials = Credentials(user.access_key_id, user.secret_access_key)
    body = b"5\r\nhello\r\n0\r\n\r\n"
    request = over_the_wire(
        signed(credentials, "s3", S3_URL, body, method="PUT", **{"X-Amz-Content-SHA256": payload}), body
    )
    # THEN the seed signature, made over the declared value, verifies
    assert authenticate(request, store) is not None


def test_a_wrong_secret_is_a_signature_mismatch(store: IdentityStore) -> None:
    role = store.role("Worker", POLICIES, session_name="worker-fn")
    forged = Credentials(role.access_key_id, "not-the-secret", role.session_token)
    assert failure_of(over_the_wire(signed(forged, "lambda", LAMBDA_URL)), store) is Failure.BAD_SIGNATURE


def test_an_unknown_key_is_refused(store: IdentityStore) -> None:
    stranger = Credentials("AKIAUNKNOWNUNKNOWN00", "secret")
    with pytest.raises(AuthFailure) as raised:
        authenticate(over_the_wire(signed(stranger, "lambda", LAMBDA_URL)), store)
    assert raised.value.failure is Failure.UNKNOWN_KEY
    assert raised.value.access_key_id == "AKIAUNKNOWNUNKNOWN00"


def test_a_session_token_must_be_the_one_issued_with_the_key(store: IdentityStore) -> None:
    role = store.role("Worker", POLICIES, session_name="worker-fn")
    other = store.role("Other", POLICIES, session_name="other-fn")
    # GIVEN the role's key signed with another session's token, and with no token at all
    wrong_token = Credentials(role.access_key_id, role.secret_access_key, other.session_token)
    no_token = Credentials(role.access_key_id, role.secret_access_key)
    assert failure_of(over_the_wire(signed(wrong_token, "lambda", LAMBDA_URL)), store) is Failure.INVALID_TOKEN
    assert failure_of(over_the_wire(signed(no_token, "lambda", LAMBDA_URL)), store) is Failure.UNKNOWN_KEY
    # AND a long-term key with a token is refused too
    user = store.developer()
    assert (
        failure_of(
            over_the_wire(
                signed(Credentials(user.access_key_id, user.secret_access_key, "token"), "lambda", LAMBDA_URL)
            ),
            store,
        )
        is Failure.INVALID_TOKEN
    )


def presigned_get(credentials: Credentials, url: str, expires: int, *, v2: bool = False) -> HttpRequest:
    request = AWSRequest(method="GET", url=url)
    if v2:
        HmacV1QueryAuth(credentials, expires=expires).add_auth(request)
    else:
        S3SigV4QueryAuth(credentials, "s3", "us-east-1", expires=expires).add_auth(request)
    split = urllib.parse.urlsplit(request.url)
    return HttpRequest("GET", split.path, split.query, {"host": split.netloc})


@pytest.mark.parametrize("v2", [False, True], ids=["sigv4", "sigv2"])
def test_a_presigned_url_works_until_it_expires(store: IdentityStore, v2: bool) -> None:
    # GIVEN a role's presigned GET valid for 60 s
    role = store.role("Worker", POLICIES, session_name="worker-fn")
    request = presigned_get(
        Credentials(role.access_key_id, role.secret_access_key, role.session_token), S3_URL, 60, v2=v2
    )
    # WHEN used now, and two minutes later
    now = datetime.now(UTC)
    authenticated = authenticate(request, store, now)
    # THEN it is the role's now, and expired later
    assert authenticated is not None
    assert authenticated[0].principal_arn == role.principal_arn
    assert authenticated[1].presigned
    assert failure_of(request, store, now=now + timedelta(minutes=2)) is Failure.EXPIRED


def test_a_presigned_url_for_another_key_does_not_verify(store: IdentityStore) -> None:
    role = store.role("Worker", POLICIES, session_name="worker-fn")
    request = presigned_get(Credentials(role.access_key_id, role.secret_access_key, role.session_token), S3_URL, 60)
    other_path = HttpRequest("GET", "/jobs/secret", request.raw_query, request.headers)
    assert failure_of(other_path, store) is Failure.BAD_SIGNATURE


@pytest.mark.parametrize(
    ("authorization", "expected"),
    [
        ("AWS AKIAEXAMPLE:c2lnbmF0dXJl", Failure.UNSUPPORTED),  # Signature Version 2 in a header
        ("AWS4-HMAC-SHA256 Credential=AKID/20261130/us-east-1/s3/aws4_request", Failure.MALFORMED),
        ("AWS4-HMAC-SHA256 Credential=AKID/us-east-1/s3, SignedHeaders=host, Signature=00", Failure.MALFORMED),
    ],
)
def test_a_malformed_authorization_header_is_refused(
    store: IdentityStore, authorization: str, expected: Failure
) -> None:
    headers = {"host": "localhost", "authorization": authorization, "x-amz-date": "20261130T000000Z"}
    assert failure_of(HttpRequest("GET", "/jobs/k", "", headers), store) is expected


def test_role_keys_are_the_same_for_the_same_seed_and_differ_across_seeds() -> None:
    # GIVEN two stores with the same seed (a restart) and one with another seed
    first = IdentityStore(seed="project-a").role("Worker", POLICIES, session_name="worker-fn")
    again = IdentityStore(seed="project-a").role("Worker", POLICIES, session_name="worker-fn")
    other = IdentityStore(seed="project-b").role("Worker", POLICIES, session_name="worker-fn")
    # THEN a role keeps its keys across restarts, and nothing else shares them
    assert (first.access_key_id, first.secret_access_key, first.session_token) == (
        again.access_key_id,
        again.secret_access_key,
        again.session_token,
    )
    assert first.access_key_id != other.access_key_id
    assert first.access_key_id.startswith("ASIA")
    assert len(first.access_key_id) == 20
    assert len(first.secret_access_key) == 40
    assert first.user_id.startswith("AROA")
    assert first.user_id.endswith(":worker-fn")
    assert first.environment()["AWS_SESSION_TOKEN"] == first.session_token


def test_the_developer_is_an_administrator_with_local_keys(store: IdentityStore) -> None:
    developer = store.developer()
    assert (developer.access_key_id, developer.secret_access_key) == ("local", "local")
    assert developer.arn == "arn:aws:iam::123456789012:user/developer"
    assert store.lookup("local") is developer
    with pytest.raises(ValueError, match="already stands for"):
        store.user("someone-else", POLICIES, access_key_id="local", secret_access_key="x")


@pytest.mark.parametrize(
    ("service", "url"),
    [
        ("lambda", "http://127.0.0.1:9000/2015-03-31/functions/fn/./x/../invocations"),
        ("lambda", "http://127.0.0.1:9000//2015-03-31//functions/fn%3Alive/invocations?Qualifier=%24LATEST"),
        ("s3", "http://127.0.0.1:9000/jobs/dir/./k%2Fslash%20space"),
        ("s3", "http://127.0.0.1:9000/jobs/%D0%BA%D0%BB%D1%8E%D1%87?b=2&a=1&a=0&uploads="),
        ("sagemaker", "http://127.0.0.1:9000/endpoints/Digits-Realtime/invocations"),
    ],
)
def test_the_canonical_request_agrees_with_botocore_on_awkward_requests(
    store: IdentityStore, service: str, url: str
) -> None:
    # GIVEN botocore signing requests with dot segments, double slashes, encoded characters, repeated query
    # names and a header value with runs of spaces
    user = store.developer()
    request = signed(
        Credentials(user.access_key_id, user.secret_access_key),
        service,
        url,
        b"body",
        **{"X-Amz-Meta-Note": "  spaced   out  value ", "X-Amz-Target": "T"},
    )
    # THEN the server side builds the same canonical request (the signature verifies)
    assert authenticate(over_the_wire(request, b"body"), store) is not None
