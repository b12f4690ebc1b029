"""Who is calling, proven: Signature Version 4 verification, from the `Authorization` header or a presigned
query string.

The canonical request follows botocore's signer rule for rule (tests/unit/test_iam_sigv4.py verifies what botocore
signs for awkward paths, queries and header values); the path normalisation is botocore's own function:
- canonical URI: S3 signs the path as sent (single-encoded); every other service normalises it and encodes
  it again (`%3A` becomes `%253A`) (AWS General Reference, "Create a canonical request for Signature
  Version 4", and botocore's `S3SigV4Auth._normalize_url_path`);
- payload: the `x-amz-content-sha256` header when present (S3 requires it: a hex SHA-256, which must match
  the body, `UNSIGNED-PAYLOAD`, or a `STREAMING-...` value for aws-chunked uploads, whose per-chunk
  signatures are not checked here, only the seed signature); the body's SHA-256 otherwise; a presigned S3
  URL signs `UNSIGNED-PAYLOAD`;
- temporary credentials: the `X-Amz-Security-Token` (header or query) must be the session token the key
  was issued with;
- presigned URLs expire `X-Amz-Expires` seconds (at most 7 days) after `X-Amz-Date`.
S3 presigned URLs in the older Signature Version 2 form (`AWSAccessKeyId`, `Signature`, `Expires`) are
verified too, with botocore's `HmacV1Auth` canonical string: boto3 still makes that form by default for
S3 in us-east-1 when no `signature_version` is configured (servestack's clients configure none).
What AWS checks besides the signature, and so does this module (`authenticate`; the enforcer checks the
scope against the endpoint it stands for):
- `host` is among the signed headers (a signature that leaves it out could be replayed to another host);
- a header-signed request's `X-Amz-Date` is within 15 minutes of the server's clock (`MAX_SKEW`);
- the credential scope names the endpoint's region and service (`check_scope`).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum

from botocore.auth import HmacV1Auth
from botocore.compat import HTTPHeaders
from botocore.credentials import Credentials
from botocore.utils import normalize_url_path

from servestack.local.iam.identities import Identity, IdentityStore
from servestack.local.iam.wire import HttpRequest

ALGORITHM = "AWS4-HMAC-SHA256"
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
MAX_PRESIGN_SEC = 7 * 24 * 3600
AMZ_DATE = "%Y%m%dT%H%M%SZ"
HEX_SHA256 = re.compile(r"^[0-9a-f]{64}$")
AUTH_FIELD = re.compile(r"(Credential|SignedHeaders|Signature)=([^,\s]+)")
MAX_SKEW = timedelta(minutes=15)  # AWS refuses a header-signed request whose time is further off


class Failure(Enum):
    """Why a request's credentials were refused; servestack/local/iam/replies.py words each per service."""

    MISSING = "missing authentication"
    MALFORMED = "malformed authorization"
    UNSUPPORTED = "unsupported signing algorithm"
    UNKNOWN_KEY = "unknown access key"
    INVALID_TOKEN = "session token does not match"  # noqa: S105 - a failure's name, not a secret
    BAD_SIGNATURE = "signature does not match"
    EXPIRED = "presigned URL expired"
    CONTENT_SHA256_MISMATCH = "x-amz-content-sha256 does not match the body"
    WRONG_REGION = "credential scoped to another region"
    WRONG_SERVICE = "credential scoped to another service"
    HOST_NOT_SIGNED = "host is not a signed header"
    SKEWED = "request time too far from the server's"


class AuthFailure(Exception):
    def __init__(self, failure: Failure, message: str, *, access_key_id: str | None = None, **details: str) -> None:
        super().__init__(message)
        self.failure = failure
        self.message = message
        self.access_key_id = access_key_id
        self.details = details


@dataclass(frozen=True)
class Signature:
    """What a signed request claims: whose key, which scope, which headers, which signature."""

    access_key_id: str
    date: str  # YYYYMMDD of the credential scope
    region: str
    service: str
    signed_headers: tuple[str, ...]
    signature: str
    amz_date: str  # X-Amz-Date
    presigned: bool
    expires_sec: int | None
    session_token: str | None
    version: int = 4  # 2: an S3 presigned URL in the Signature Version 2 form
    expires_at: int | None = None  # SigV2: the epoch second the URL expires


def _parse_credential(credential: str) -> tuple[str, str, str, str]:
    parts = credential.split("/")
    if len(parts) != 5 or parts[4] != "aws4_request" or not parts[0]:
        raise AuthFailure(
            Failure.MALFORMED,
            f"the Credential '{credential}' is not 'KEY/YYYYMMDD/region/service/aws4_request'",
        )
    return parts[0], parts[1], parts[2], parts[3]


def parse_signature(request: HttpRequest) -> Signature | None:
    """The request's SigV4 claim, None for an anonymous request; `AuthFailure` when malformed."""
    authorization = request.header("authorization")
    if authorization is not None:
        if not authorization.startswith(ALGORITHM + " "):
            raise AuthFailure(
                Failure.UNSUPPORTED,
                "The authorization mechanism you have provided is not supported. Please use AWS4-HMAC-SHA256.",
            )
        fields = dict(AUTH_FIELD.findall(authorization))
        if set(fields) != {"Credential", "SignedHeaders", "Signature"}:
            raise AuthFailure(
                Failure.MALFORMED, "the Authorization header needs Credential, SignedHeaders and Signature"
            )
        amz_date = request.header("x-amz-date") or ""
        if not amz_date:
            raise AuthFailure(Failure.MALFORMED, "a SigV4 request needs an X-Amz-Date header")
        key, date, region, service = _parse_credential(fields["Credential"])
        return Signature(
            key,
            date,
            region,
            service,
            tuple(fields["SignedHeaders"].split(";")),
            fields["Signature"],
            amz_date,
            presigned=False,
            expires_sec=None,
            session_token=request.header("x-amz-security-token"),
        )
    query = request.query
    if "AWSAccessKeyId" in query and "Signature" in query and "X-Amz-Algorithm" not in query:
        try:
            expires_at = int(query.get("Expires", ""))
        except ValueError as error:
            raise AuthFailure(Failure.MALFORMED, "Expires should be an epoch second") from error
        return Signature(
            query["AWSAccessKeyId"],
            "",
            "us-east-1",
            "s3",
            (),
            query["Signature"],
            "",
            presigned=True,
            expires_sec=None,
            session_token=query.get("x-amz-security-token"),
            version=2,
            expires_at=expires_at,
        )
    if "X-Amz-Algorithm" not in query and "X-Amz-Signature" not in query:
        return None
    if query.get("X-Amz-Algorithm") != ALGORITHM:
        raise AuthFailure(
            Failure.UNSUPPORTED,
            'X-Amz-Algorithm only supports "AWS4-HMAC-SHA256"',
        )
    missing = [
        name
        for name in ("X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires", "X-Amz-SignedHeaders", "X-Amz-Signature")
        if not query.get(name)
    ]
    if missing:
        raise AuthFailure(Failure.MALFORMED, f"the presigned URL lacks {', '.join(missing)}")
    try:
        expires = int(query["X-Amz-Expires"])
    except ValueError as error:
        raise AuthFailure(Failure.MALFORMED, "X-Amz-Expires should be a number") from error
    if not 0 < expires <= MAX_PRESIGN_SEC:
        raise AuthFailure(
            Failure.MALFORMED, f"X-Amz-Expires must be more than 0 and at most {MAX_PRESIGN_SEC} seconds (7 days)"
        )
    key, date, region, service = _parse_credential(query["X-Amz-Credential"])
    return Signature(
        key,
        date,
        region,
        service,
        tuple(query["X-Amz-SignedHeaders"].split(";")),
        query["X-Amz-Signature"],
        query["X-Amz-Date"],
        presigned=True,
        expires_sec=expires,
        session_token=query.get("X-Amz-Security-Token"),
    )


def canonical_uri(raw_path: str, service: str) -> str:
    """S3 signs the path as sent; every other service normalises it (botocore's `normalize_url_path`:
    dot segments and empty segments removed) and percent-encodes it again."""
    if service == "s3":
        return raw_path or "/"
    return urllib.parse.quote(normalize_url_path(raw_path), safe="/~")


def canonical_query(raw_query: str) -> str:
    """The query's `name=value` pairs as sent (already URI-encoded by the client), sorted (botocore's
    `SigV4Auth._canonical_query_string_url`)."""
    if not raw_query:
        return ""
    pairs = []
    for pair in raw_query.split("&"):
        name, _, value = pair.partition("=")
        pairs.append((name, value))
    return "&".join(f"{name}={value}" for name, value in sorted(pairs))


def canonical_request(
    request: HttpRequest, signature: Signature, headers: Mapping[str, str], payload_hash: str, query: str
) -> str:
    """The SigV4 canonical request. Header values are trimmed and inner runs of spaces collapsed, as
    botocore's `SigV4Auth._header_value` does; botocore's own header canonicalisation goes through
    `email.message` and costs more than the rest of the check, so this part is written out here (a unit test
    compares the whole canonical request with botocore's)."""
    lines = "\n".join(f"{name}:{' '.join(headers.get(name, '').split())}" for name in signature.signed_headers)
    return "\n".join(
        (
            request.method.upper(),
            canonical_uri(request.raw_path, signature.service),
            canonical_query(query),
            lines + "\n",
            ";".join(signature.signed_headers),
            payload_hash,
        )
    )


def _without_signature(raw_query: str) -> str:
    return "&".join(pair for pair in raw_query.split("&") if pair and not pair.startswith("X-Amz-Signature="))


_signing_keys: dict[tuple[str, str, str, str], bytes] = {}


def signing_key(secret_access_key: str, date: str, region: str, service: str) -> bytes:
    """`kSigning` (HMAC chain over date, region, service), remembered: it changes once a day per scope."""
    cache_key = (secret_access_key, date, region, service)
    key = _signing_keys.get(cache_key)
    if key is None:
        key = f"AWS4{secret_access_key}".encode()
        for part in (date, region, service, "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        if len(_signing_keys) > 1024:
            _signing_keys.clear()
        _signing_keys[cache_key] = key
    return key


class _V2Signer(HmacV1Auth):  # type: ignore[misc]  # botocore is untyped
    """botocore's SigV2 canonical string, with the URL's `Expires` where a header-signed request has `Date`."""

    def __init__(self, credentials: Credentials, expires: str) -> None:
        super().__init__(credentials)
        self._expires = expires

    def _get_date(self) -> str:
        return self._expires


def expected_signature_v2(request: HttpRequest, signature: Signature, secret_access_key: str) -> str:
    headers = HTTPHeaders()
    for name in ("content-md5", "content-type"):
        value = request.header(name)
        if value is not None:
            headers[name] = value
    for name, value in request.headers.items():
        if name.startswith("x-amz-"):
            headers[name] = value
    for name, value in request.query.items():
        if name.lower().startswith("x-amz-") and name.lower() not in request.headers:
            headers[name.lower()] = value
    split = urllib.parse.urlsplit(
        f"http://host{request.raw_path}" + (f"?{request.raw_query}" if request.raw_query else "")
    )
    signer = _V2Signer(Credentials(signature.access_key_id, secret_access_key), str(signature.expires_at))
    return str(signer.sign_string(signer.canonical_string(request.method, split, headers)))


def expected_signature(request: HttpRequest, signature: Signature, secret_access_key: str) -> str:
    """The signature `request` should carry if signed with `secret_access_key` as `signature` declares."""
    if signature.presigned:
        payload_hash = UNSIGNED_PAYLOAD if signature.service == "s3" else hashlib.sha256(request.body).hexdigest()
        query = _without_signature(request.raw_query)
    else:
        payload_hash = request.header("x-amz-content-sha256") or hashlib.sha256(request.body).hexdigest()
        query = request.raw_query
    headers = {}
    for name in signature.signed_headers:
        # A WSGI server cannot tell `x-amz-meta-a_b` from `x-amz-meta-a-b`: look for either spelling.
        value = request.headers.get(name, request.headers.get(name.replace("_", "-")))
        if value is not None:
            headers[name] = value
    if "x-amz-content-sha256" in headers:
        payload_hash = headers["x-amz-content-sha256"]
    canonical = canonical_request(request, signature, headers, payload_hash, query)
    scope = f"{signature.amz_date[:8]}/{signature.region}/{signature.service}/aws4_request"
    string_to_sign = "\n".join((ALGORITHM, signature.amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()))
    key = signing_key(secret_access_key, signature.amz_date[:8], signature.region, signature.service)
    return hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest()


def check_scope(signature: Signature, region: str, service: str | None) -> None:
    """`AuthFailure` unless the credential scope names `region` and (when given) `service`, with AWS's words
    ("Credential should be scoped to a valid region, not 'eu-west-1'. ", "... to correct service: 'lambda'. ").
    A SigV2 presigned URL names no scope."""
    if signature.version != 4:
        return
    if service is not None and signature.service != service:
        raise AuthFailure(
            Failure.WRONG_SERVICE,
            f"Credential should be scoped to correct service: '{service}'. ",
            access_key_id=signature.access_key_id,
            expected=service,
            scoped=signature.service,
        )
    if signature.region != region:
        raise AuthFailure(
            Failure.WRONG_REGION,
            f"Credential should be scoped to a valid region, not '{signature.region}'. ",
            access_key_id=signature.access_key_id,
            expected=region,
            scoped=signature.region,
        )


def _check_skew(signature: Signature, current: datetime) -> None:
    """A header-signed request more than `MAX_SKEW` off the server's clock, with the words AWS's JSON and query
    services use (S3 answers `RequestTimeTooSkewed`: servestack/local/iam/replies.py)."""
    try:
        signed_at = datetime.strptime(signature.amz_date, AMZ_DATE).replace(tzinfo=UTC)
    except ValueError as error:
        raise AuthFailure(Failure.MALFORMED, f"X-Amz-Date {signature.amz_date!r} is not YYYYMMDDTHHMMSSZ") from error
    stamp = signature.amz_date
    now = current.strftime(AMZ_DATE)
    if signed_at < current - MAX_SKEW:
        earliest = (current - MAX_SKEW).strftime(AMZ_DATE)
        message = f"Signature expired: {stamp} is now earlier than {earliest} ({now} - 15 min.)"
    elif signed_at > current + MAX_SKEW:
        latest = (current + MAX_SKEW).strftime(AMZ_DATE)
        message = f"Signature not yet current: {stamp} is still later than {latest} ({now} + 15 min.)"
    else:
        return
    raise AuthFailure(Failure.SKEWED, message, access_key_id=signature.access_key_id, RequestTime=stamp, ServerTime=now)


def authenticate(
    request: HttpRequest, store: IdentityStore, now: datetime | None = None, *, signature: Signature | None = None
) -> tuple[Identity, Signature] | None:
    """The identity that signed `request`, None for an anonymous request; `AuthFailure` otherwise.
    `signature`: the request's already parsed claim (`parse_signature`)."""
    signature = signature or parse_signature(request)
    if signature is None:
        return None
    if signature.version == 4 and "host" not in signature.signed_headers:
        raise AuthFailure(
            Failure.HOST_NOT_SIGNED,
            "'Host' or ':authority' must be a 'SignedHeader' in the AWS Authorization.",
            access_key_id=signature.access_key_id,
        )
    identity = store.lookup(signature.access_key_id)
    if identity is None:
        raise AuthFailure(Failure.UNKNOWN_KEY, "unknown access key", access_key_id=signature.access_key_id)
    if identity.session_token is None:
        if signature.session_token is not None:
            raise AuthFailure(
                Failure.INVALID_TOKEN, "a long-term key sent a session token", access_key_id=signature.access_key_id
            )
    elif signature.session_token is None:
        # Temporary keys exist only together with their token: without it AWS does not know the key.
        raise AuthFailure(
            Failure.UNKNOWN_KEY, "temporary key sent without its session token", access_key_id=signature.access_key_id
        )
    elif not hmac.compare_digest(signature.session_token, identity.session_token):
        raise AuthFailure(
            Failure.INVALID_TOKEN, "session token does not match the key", access_key_id=signature.access_key_id
        )
    declared = request.header("x-amz-content-sha256")
    if not signature.presigned and declared is not None and HEX_SHA256.match(declared):
        computed = hashlib.sha256(request.body).hexdigest()
        if computed != declared:
            raise AuthFailure(
                Failure.CONTENT_SHA256_MISMATCH,
                "The provided 'x-amz-content-sha256' header does not match what was computed.",
                ClientComputedContentSHA256=declared,
                S3ComputedContentSHA256=computed,
            )
    if signature.version == 2:
        expected = expected_signature_v2(request, signature, identity.secret_access_key)
    else:
        expected = expected_signature(request, signature, identity.secret_access_key)
    if not hmac.compare_digest(expected, signature.signature):
        raise AuthFailure(Failure.BAD_SIGNATURE, "signature does not match", access_key_id=signature.access_key_id)
    current = now or datetime.now(UTC)
    if not signature.presigned:
        _check_skew(signature, current)
    if signature.version == 2:
        assert signature.expires_at is not None
        if current.timestamp() > signature.expires_at:
            expired_at = datetime.fromtimestamp(signature.expires_at, UTC)
            raise AuthFailure(
                Failure.EXPIRED,
                "Request has expired",
                Expires=expired_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                ServerTime=current.strftime("%Y-%m-%dT%H:%M:%SZ"),
            )
        return identity, signature
    if signature.presigned:
        assert signature.expires_sec is not None
        try:
            signed_at = datetime.strptime(signature.amz_date, AMZ_DATE).replace(tzinfo=UTC)
        except ValueError as error:
            raise AuthFailure(
                Failure.MALFORMED, f"X-Amz-Date {signature.amz_date!r} is not YYYYMMDDTHHMMSSZ"
            ) from error
        expires_at = signed_at + timedelta(seconds=signature.expires_sec)
        if current > expires_at:
            raise AuthFailure(
                Failure.EXPIRED,
                "Request has expired",
                **{
                    "X-Amz-Expires": str(signature.expires_sec),
                    "Expires": expires_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                    "ServerTime": current.strftime("%Y-%m-%dT%H:%M:%SZ"),
                },
            )
    return identity, signature
