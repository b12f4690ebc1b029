"""The plug points: `IamEnforcer.wsgi(app)` in front of moto's server, `.check(...)` for servestack's own HTTP
fronts (SageMaker Runtime, Lambda Invoke, the HTTP API), `.authorize(...)` for calls local up makes on a
role's behalf without HTTP (the scheduler invoking a function, the SQS poller acting as the function role).

Every request: authenticate (servestack/local/iam/sigv4.py), put in its canonical form (canonical.py),
describe that form (operations.py), evaluate each check against the caller's identity policies and the
resource's policy (policy.py), then pass the canonical form on to moto or answer the refusal in the
service's protocol (replies.py). Each decision is one log line; denials are also
kept in `.denials` for local up's summary.

Request context every evaluation gets, besides the operation's own keys:
- `aws:SecureTransport` = `true`. Local endpoints speak plain HTTP where AWS speaks HTTPS; the stacks' TLS-only
  bucket, queue and topic policies (`Deny ... Bool aws:SecureTransport false`, CDK's `enforce_ssl`) would
  otherwise deny every local call, although the same calls go over TLS in the cloud.
- `aws:CurrentTime`, `aws:EpochTime`, `aws:SourceIp` (the client address), `aws:RequestedRegion`,
  `aws:PrincipalArn`, `aws:PrincipalAccount`, `aws:PrincipalType` (`AssumedRole` / `User`), `aws:userid`,
  `aws:username` (users), `aws:PrincipalIsAWSService` = `aws:ViaAWSService` = `false`; for S3 also
  `s3:authType` (`REST-HEADER` / `REST-QUERY-STRING`), `s3:signatureversion` and `s3:signatureAge`.

Behaviour copied from AWS besides plain denials:
- STS GetCallerIdentity is answered here (the caller's ARN, user id and account; it is never denied);
  AssumeRole of a role the store knows is answered here with credentials the store mints, after the
  caller's identity policy and the role's trust policy (its resource policy) are both consulted.
- S3 DeleteObjects decides each key on its own: denied keys come back as `<Error>` entries with
  `AccessDenied` in the 200 reply, the others are deleted.
- S3 GetObject/HeadObject of a missing key by a caller without `s3:ListBucket` on the bucket is 403
  AccessDenied, not 404 (Amazon S3 API Reference, GetObject: "If you don't have the s3:ListBucket
  permission, Amazon S3 returns an HTTP status code 403 Access Denied error"). The ListBucket check is made
  without `s3:prefix`; AWS does not document that check's context.
Passed through unchecked: moto's own `/moto-api` endpoints (its admin API; AWS has none; refused unless
`--allow-reset` as moto routes them, after these rewrites: servestack/local/emulator/moto_server.py) and CORS
preflight `OPTIONS` requests (never signed; S3 answers them from the bucket's CORS rules).
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any
from xml.sax.saxutils import escape

from servestack.local.hosting import Reply, request_id
from servestack.local.hosting import Request as LocalRequest
from servestack.local.iam.canonical import (
    DEFAULT_HOST_NAMES,
    Endpoint,
    Malformed,
    canonical_front_request,
    canonical_request,
)
from servestack.local.iam.conditions import normalise_context
from servestack.local.iam.identities import Identity, IdentityStore
from servestack.local.iam.operations import Check, ExecuteApi, Where, describe, s3_arn
from servestack.local.iam.policy import Caller, Decision, evaluate
from servestack.local.iam.replies import access_denied, authentication_failed, malformed
from servestack.local.iam.resource_policies import ResourcePolicies
from servestack.local.iam.sigv4 import AuthFailure, Failure, Signature, authenticate, check_scope, parse_signature
from servestack.local.iam.verdicts import Denial, Verdict
from servestack.local.iam.wire import HttpRequest
from servestack.local.iam.wsgi import (
    StartResponse,
    WsgiApp,
    _forward_as,
    _send,
    guess_service,
    partial_delete,
    request_from_environ,
)

logger = logging.getLogger("servestack.local.iam")


def disabled_warning(why: str) -> str:
    """The one warning local mode prints when IAM is not enforced, saying why (`--no-iam`, an external emulator)."""
    return (
        f"iam: ENFORCEMENT IS OFF ({why}): every AWS call is allowed whatever the templates' policies say, so a "
        "green local run proves nothing about permissions. Turn it back on before trusting a result."
    )


DISABLED_WARNING = disabled_warning("--no-iam")
STS_NAMESPACE = "https://sts.amazonaws.com/doc/2011-06-15/"
ASSUMED_SESSION_SEC = 3600
MAX_DENIALS = 10_000
CONTEXT_CACHE_LIMIT = 1024  # request contexts remembered for the current second, per caller and address


class IamEnforcer:
    """IAM's answer to every AWS call of a local deployment."""

    def __init__(
        self,
        store: IdentityStore,
        resource_policies: ResourcePolicies | None = None,
        *,
        enabled: bool = True,
        disabled_because: str = "--no-iam",
        log: Callable[[str], None] = print,
        region: str = "us-east-1",
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        host_names: Iterable[str] = DEFAULT_HOST_NAMES,
    ) -> None:
        self.store = store
        self.host_names = frozenset(name.lower() for name in host_names)
        self.resource_policies = resource_policies if resource_policies is not None else ResourcePolicies()
        self.enabled = enabled
        self.log = log
        self.region = region
        self.clock = clock
        self._denials: collections.deque[Denial] = collections.deque(maxlen=MAX_DENIALS)
        self._warned = False
        self._disabled_because = disabled_because
        self._lock = threading.Lock()
        self._contexts: dict[tuple[Any, ...], dict[str, tuple[str, ...]]] = {}
        if not enabled:  # said once, when the setting is made, before any call it lets through
            self._warn_disabled()

    @property
    def denials(self) -> list[Denial]:
        return list(self._denials)

    def _warn_disabled(self) -> None:
        with self._lock:
            if self._warned:
                return
            self._warned = True
        self.log(disabled_warning(self._disabled_because))

    # -------------------------------------------------------------------------------- decisions

    def _context(
        self,
        caller: Caller,
        identity: Identity | None,
        region: str,
        *,
        source_ip: str = "127.0.0.1",
        signature: Signature | None = None,
        service: str = "",
    ) -> dict[str, tuple[str, ...]]:
        now = self.clock()
        second = int(now.timestamp())
        presigned_v4 = service == "s3" and signature is not None and signature.presigned and signature.version == 4
        cache_key = (
            caller.arn,
            identity.access_key_id if identity is not None else "",
            region,
            source_ip,
            service == "s3" and signature is not None and (signature.presigned, signature.version),
            second,
        )
        cached = None if presigned_v4 else self._contexts.get(cache_key)
        if cached is not None:
            return cached
        context: dict[str, str | tuple[str, ...]] = {
            "aws:SecureTransport": "true",
            "aws:CurrentTime": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "aws:EpochTime": str(second),
            "aws:SourceIp": source_ip,
            "aws:RequestedRegion": region,
            "aws:PrincipalIsAWSService": "false",
            "aws:ViaAWSService": "false",
        }
        if identity is not None:
            context |= {
                "aws:PrincipalArn": identity.principal_arn,
                "aws:PrincipalAccount": identity.account,
                "aws:PrincipalType": "AssumedRole" if identity.kind == "role" else "User",
                "aws:userid": identity.user_id,
            }
            if identity.kind == "user":
                context["aws:username"] = identity.name
            if identity.session_token:
                context["aws:TokenIssueTime"] = identity.issued_at.strftime("%Y-%m-%dT%H:%M:%SZ")
        elif caller.service is None:
            context["aws:PrincipalType"] = "Anonymous"
        if service == "s3" and signature is not None:
            context["s3:authType"] = "REST-QUERY-STRING" if signature.presigned else "REST-HEADER"
            context["s3:signatureversion"] = "AWS4-HMAC-SHA256" if signature.version == 4 else "AWS"
            if presigned_v4:
                signed = datetime.strptime(signature.amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
                context["s3:signatureAge"] = str(max(0, int((now - signed).total_seconds() * 1000)))
        normalised = normalise_context(context)
        if not presigned_v4:
            if len(self._contexts) >= CONTEXT_CACHE_LIMIT:
                self._contexts.clear()
            self._contexts[cache_key] = normalised
        return normalised

    def _decide(
        self,
        caller: Caller,
        identity: Identity | None,
        check: Check,
        base: Mapping[str, tuple[str, ...]],
        *,
        trust: bool = False,
    ) -> Decision:
        context = {**base, **normalise_context(check.context)} if check.context else base
        return evaluate(
            caller,
            check.action,
            check.resource,
            context,
            identity_policies=identity.compiled if identity is not None else None,
            resource_policy=self.resource_policies.for_resource(check.resource),
            trust=trust,
        )

    def _record(self, caller_arn: str, decision: Decision, operation: str = "", note: str = "") -> None:
        reason = decision.reason + (f"; the call was not recognised: {note}" if note else "")
        if decision.allowed:
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug("iam: ALLOW %s %s %s (%s)", caller_arn, decision.action, decision.resource, reason)
            return
        denial = Denial(self.clock(), caller_arn, decision.action, decision.resource, reason, operation)
        self._denials.append(denial)
        self.log(denial.line())

    def authorize(
        self,
        identity: Identity,
        action: str,
        resource: str,
        context: Mapping[str, str | list[str] | tuple[str, ...]] | None = None,
    ) -> Decision:
        """The decision for a call made on `identity`'s behalf without HTTP (logged and kept like any other)."""
        if not self.enabled:
            self._warn_disabled()
            return Decision(True, action, resource, "IAM enforcement is off")
        region = resource.split(":")[3] if resource.count(":") >= 5 and resource.split(":")[3] else self.region
        base = self._context(identity.caller, identity, region)
        check = Check(
            action,
            resource,
            {key: value if isinstance(value, str) else tuple(value) for key, value in (context or {}).items()},
        )
        decision = self._decide(identity.caller, identity, check, base, trust=action.lower() == "sts:assumerole")
        self._record(identity.arn, decision)
        return decision

    # -------------------------------------------------------------------------------- requests

    def evaluate_request(
        self,
        request: HttpRequest,
        *,
        service_hint: str | None = None,
        api: ExecuteApi | None = None,
        endpoint: Endpoint | None = None,
    ) -> Verdict:
        """Authenticate, put in canonical form, describe and authorize one request. `endpoint`: the emulator
        the request reached (its canonical form is what moto is then given); servestack's own fronts pass
        `service_hint` instead."""
        if not self.enabled:
            self._warn_disabled()
            return Verdict(None)
        try:
            signature = parse_signature(request)
        except AuthFailure as failure:
            service = service_hint or guess_service(request)
            return self._refuse_authentication(request, service, failure)
        service = service_hint or (signature.service if signature is not None else guess_service(request))
        identity: Identity | None = None
        if signature is not None:
            try:
                check_scope(signature, self.region, service_hint)
                authenticated = authenticate(request, self.store, self.clock(), signature=signature)
            except AuthFailure as failure:
                return self._refuse_authentication(request, service, failure)
            assert authenticated is not None
            identity = authenticated[0]
        elif service not in ("s3",):
            # Only S3 evaluates anonymous requests (against bucket policies); every other API wants a signature.
            unsigned = AuthFailure(Failure.MISSING, "the request is not signed")
            return self._refuse_authentication(request, service, unsigned)
        region = signature.region if signature is not None else self.region
        where = Where(region, identity.account if identity is not None else self.store.account_id)
        caller = identity.caller if identity is not None else Caller.anonymous()
        try:
            if endpoint is not None:
                request = canonical_request(request, service, endpoint, region, where.account)
            else:
                canonical_front_request(request, service, region, where.account)
        except Malformed as error:
            return self._refuse_malformed(request, service, caller.arn, error)
        operation = describe(request, service, where, api=api)
        verdict = Verdict(identity, operation, caller_arn=caller.arn, service=service, canonical=request)
        if operation.always_allowed:
            return verdict
        base = self._context(
            caller, identity, region, source_ip=request.source_ip, signature=signature, service=service
        )
        note = "" if operation.recognised else operation.note
        if operation.delete_keys:
            return self._delete_objects(verdict, caller, identity, base)
        trust = operation.name == "AssumeRole" and operation.service == "sts"
        for check in operation.checks:
            decision = self._decide(caller, identity, check, base, trust=trust)
            self._record(caller.arn, decision, operation.name, note)
            if not decision.allowed:
                verdict.reply = access_denied(
                    service, request, caller.arn, decision, note=note, anonymous=identity is None
                )
                return verdict
        if service == "s3" and operation.name in ("GetObject", "HeadObject") and operation.bucket:
            bucket = operation.bucket

            def list_bucket() -> Decision:
                return self._decide(caller, identity, Check("s3:ListBucket", s3_arn(bucket)), base)

            verdict.list_bucket = list_bucket
        return verdict

    def _refuse_authentication(self, request: HttpRequest, service: str, failure: AuthFailure) -> Verdict:
        who = failure.access_key_id or "anonymous"
        denial = Denial(
            self.clock(),
            who,
            f"{service}:-",
            request.path,
            f"authentication: {failure.failure.value}: {failure.message}",
        )
        self._denials.append(denial)
        self.log(denial.line())
        return Verdict(None, reply=authentication_failed(service, request, failure), service=service)

    def _refuse_malformed(self, request: HttpRequest, service: str, caller_arn: str, error: Malformed) -> Verdict:
        denial = Denial(self.clock(), caller_arn, f"{service}:-", request.path, f"malformed request: {error.message}")
        self._denials.append(denial)
        self.log(denial.line())
        return Verdict(None, reply=malformed(service, request, error), service=service)

    def _delete_objects(
        self, verdict: Verdict, caller: Caller, identity: Identity | None, base: Mapping[str, tuple[str, ...]]
    ) -> Verdict:
        assert verdict.operation is not None
        denied = []
        for (key, version), check in zip(verdict.operation.delete_keys, verdict.operation.checks, strict=True):
            decision = self._decide(caller, identity, check, base)
            self._record(caller.arn, decision, "DeleteObjects")
            if not decision.allowed:
                denied.append((key, version))
        verdict.denied_keys = tuple(denied)
        return verdict

    def check(
        self,
        method: str,
        raw_path: str,
        raw_query: str,
        headers: Mapping[str, str],
        body: bytes,
        service_hint: str,
        *,
        api: ExecuteApi | None = None,
        source_ip: str = "127.0.0.1",
    ) -> Identity | Reply | None:
        """For servestack's own HTTP fronts: the caller's identity when IAM allows the call, else the reply to
        send. `service_hint` is the SigV4 signing name the front answers for (`sagemaker`, `lambda`,
        `execute-api` with `api`). None only when enforcement is off."""
        request = HttpRequest(method, raw_path, raw_query, {k.lower(): v for k, v in headers.items()}, body, source_ip)
        verdict = self.evaluate_request(request, service_hint=service_hint, api=api)
        if verdict.reply is not None:
            return verdict.reply
        return verdict.identity

    def check_request(
        self, request: LocalRequest, service_hint: str, *, api: ExecuteApi | None = None, source_ip: str = "127.0.0.1"
    ) -> Identity | Reply | None:
        """`check` for a front built on servestack.local.hosting.http_server (its `Request` keeps the raw query)."""
        return self.check(
            request.method,
            request.path,
            request.raw_query,
            request.headers,
            request.body,
            service_hint,
            api=api,
            source_ip=source_ip,
        )

    # -------------------------------------------------------------------------------- WSGI

    def wsgi(self, app: WsgiApp) -> WsgiApp:
        """A WSGI middleware for moto's server app: refused calls are answered here, the rest reach `app`
        with their body still readable."""

        def middleware(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
            if not self.enabled:
                self._warn_disabled()
                return app(environ, start_response)
            request = request_from_environ(environ)
            if request.path.startswith("/moto-api"):  # the emulator's own admin API; AWS has none
                return app(environ, start_response)
            if request.method.upper() == "OPTIONS":  # a CORS preflight is never signed (S3 answers it from CORS rules)
                return app(environ, start_response)
            verdict = self.evaluate_request(request, endpoint=self._endpoint(environ))
            if verdict.reply is not None:
                return _send(start_response, verdict.reply)
            if verdict.canonical is not None:
                request = verdict.canonical
                _forward_as(environ, request)
            operation = verdict.operation
            if operation is not None and operation.service == "sts" and request.header("x-amz-target") is None:
                local = self._answer_sts(request, verdict)
                if local is not None:
                    return _send(start_response, local)
            if verdict.denied_keys:
                return partial_delete(environ, start_response, app, request, verdict)
            if verdict.list_bucket is not None:
                return self._missing_object(environ, start_response, app, request, verdict)
            return app(environ, start_response)

        return middleware

    def _endpoint(self, environ: dict[str, Any]) -> Endpoint:
        """The emulator as this request reached it: its own address, and the names that mean it."""
        server = str(environ.get("SERVER_NAME") or "127.0.0.1")
        port = str(environ.get("SERVER_PORT") or "")
        authority = (f"[{server}]" if ":" in server else server) + (f":{port}" if port else "")
        return Endpoint(authority, self.host_names | {server.lower()})

    def _answer_sts(self, request: HttpRequest, verdict: Verdict) -> Reply | None:
        operation = verdict.operation
        identity = verdict.identity
        assert operation is not None
        rid = request_id()
        if operation.name == "GetCallerIdentity" and identity is not None:
            body = (
                f'<GetCallerIdentityResponse xmlns="{STS_NAMESPACE}"><GetCallerIdentityResult>'
                f"<Arn>{escape(identity.arn)}</Arn><UserId>{escape(identity.user_id)}</UserId>"
                f"<Account>{identity.account}</Account></GetCallerIdentityResult>"
                f"<ResponseMetadata><RequestId>{rid}</RequestId></ResponseMetadata></GetCallerIdentityResponse>"
            )
            return Reply(200, {"Content-Type": "text/xml", "x-amzn-RequestId": rid}, body.encode())
        if operation.name == "AssumeRole" and identity is not None:
            role_arn = operation.checks[0].resource
            policies = self.store.role_policies(role_arn)
            session = request.form.get("RoleSessionName") or "session"
            if policies is None:
                decision = Decision(
                    False, "sts:AssumeRole", role_arn, "the role is not known to local mode", None, "resource-based"
                )
                self._record(identity.arn, decision, "AssumeRole")
                return access_denied("sts", request, identity.arn, decision)
            assumed = self.store.role(role_arn, policies, session_name=session)
            expires = (
                self.clock() + timedelta(seconds=int(request.form.get("DurationSeconds") or ASSUMED_SESSION_SEC))
            ).strftime("%Y-%m-%dT%H:%M:%SZ")
            body = (
                f'<AssumeRoleResponse xmlns="{STS_NAMESPACE}"><AssumeRoleResult><Credentials>'
                f"<AccessKeyId>{assumed.access_key_id}</AccessKeyId>"
                f"<SecretAccessKey>{escape(assumed.secret_access_key)}</SecretAccessKey>"
                f"<SessionToken>{escape(assumed.session_token or '')}</SessionToken>"
                f"<Expiration>{expires}</Expiration></Credentials>"
                f"<AssumedRoleUser><AssumedRoleId>{escape(assumed.user_id)}</AssumedRoleId>"
                f"<Arn>{escape(assumed.arn)}</Arn></AssumedRoleUser></AssumeRoleResult>"
                f"<ResponseMetadata><RequestId>{rid}</RequestId></ResponseMetadata></AssumeRoleResponse>"
            )
            return Reply(200, {"Content-Type": "text/xml", "x-amzn-RequestId": rid}, body.encode())
        return None

    def _missing_object(
        self,
        environ: dict[str, Any],
        start_response: StartResponse,
        app: WsgiApp,
        request: HttpRequest,
        verdict: Verdict,
    ) -> Iterable[bytes]:
        """GetObject/HeadObject: a missing key is 403 for a caller without s3:ListBucket on the bucket. Only a
        404 is held back (and the ListBucket decision made); any other reply streams through untouched."""
        held: dict[str, Any] = {}

        def hold_404(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], Any]:
            if status.startswith("404"):
                held["status"], held["headers"] = status, headers
                return lambda data: None
            return start_response(status, headers, exc_info)  # type: ignore[no-any-return]

        result = app(environ, hold_404)
        if not held:
            return result
        try:
            body = b"".join(result)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        missing = request.method.upper() == "HEAD" or b"<Code>NoSuchKey</Code>" in body
        if missing and verdict.list_bucket is not None:
            decision = verdict.list_bucket()
            if not decision.allowed:
                self._record(verdict.caller_arn, decision, verdict.operation.name if verdict.operation else "")
                denied = access_denied("s3", request, verdict.caller_arn, decision, anonymous=verdict.identity is None)
                return _send(start_response, denied)
        start_response(held["status"], held["headers"])
        return [body]
