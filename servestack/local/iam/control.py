"""Local mode's own routes (anything under `/_servestack/`: local up's on its AWS API port, an endpoint router's
on its control port) answer only a request signed with the developer's keys, as `servestack local deploy`,
`local status`, `local run-batch` and local up itself sign them (`servestack.local.emulator.signed`).

These routes have no counterpart in AWS, and they change what runs: a rehearsal with `error_rate=1` shifts live
traffic to a failing fleet, a component's copies stop, a schedule fires, a role gets new statements. The check
is the one local up's AWS front made for its own routes: SigV4 authentication of the request (sigv4.py: the
key, the signature over method, raw path, query, signed headers and body, the session token, the clock) by
an identity store, then the caller must be the developer. Any service name in the credential scope is taken
(the routes are no AWS service's; the CLI signs `sagemaker`, the roles route `iam`), the region must be local
mode's. The gate does not depend on `--no-iam`: that setting turns off IAM's policy checks of AWS calls, not
who may drive local mode.

Refusals are shaped as a REST-JSON AWS service (SageMaker Runtime, Lambda) sends them, which botocore reads:
403 with `x-amzn-ErrorType` (`MissingAuthenticationTokenException` unsigned,
`UnrecognizedClientException` for keys it does not know, `InvalidSignatureException`...,
`AccessDeniedException` for a caller other than the developer) and `{"message": ...}`.

    gate = ControlGate.for_developer(developer_credentials, region="us-east-1")   # an endpoint router
    gate = ControlGate(access.store, access.developer, region=region)              # local up's AWS front
    refusal = gate.refusal(request)          # None: the developer signed it
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

from servestack.local.hosting import Reply, request_id
from servestack.local.iam.identities import Credentials, IdentityStore
from servestack.local.iam.replies import authentication_failed
from servestack.local.iam.sigv4 import AuthFailure, Failure, authenticate, check_scope, parse_signature
from servestack.local.iam.wire import HttpRequest

CONTROL_PREFIX = "/_servestack/"
SHAPE = "sagemaker"  # refusals in a REST-JSON service's shape (see the module's docstring)
logger = logging.getLogger("servestack.local.iam")


def is_control_path(path: str) -> bool:
    """Whether `path` (decoded) is one of local mode's own routes."""
    return path.startswith(CONTROL_PREFIX) or path == CONTROL_PREFIX.rstrip("/")


class ControlGate:
    """The developer's signature on local mode's own routes."""

    def __init__(
        self,
        store: IdentityStore,
        developer: Credentials | None,
        *,
        region: str,
        log: Callable[[str], None] | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.store = store
        self.developer = developer
        self.region = region
        self.log = log or logger.warning
        self.clock = clock

    @classmethod
    def for_developer(
        cls, developer: Credentials | None, *, region: str, log: Callable[[str], None] | None = None
    ) -> ControlGate:
        """A gate that knows the developer alone (a process that holds no other identity: an endpoint's router).
        None: no developer keys were given, and every request is refused."""
        store = IdentityStore()
        if developer is not None:
            store.developer(developer.access_key_id, developer.secret_access_key)
        return cls(store, developer, region=region, log=log)

    def refusal(self, request: HttpRequest) -> Reply | None:
        """None when the developer signed `request`; otherwise the 403 to send."""
        try:
            signature = parse_signature(request)
            if signature is None:
                raise AuthFailure(Failure.MISSING, "the request is not signed")
            check_scope(signature, self.region, None)
            authenticated = authenticate(request, self.store, self.clock(), signature=signature)
        except AuthFailure as failure:
            self.log(
                f"control: {request.method} {request.path[:200]} refused: {failure.failure.value}: {failure.message}"
            )
            reply = authentication_failed(SHAPE, request, failure)
            return Reply(403, reply.headers, reply.body)
        assert authenticated is not None
        caller = authenticated[0]
        if self.developer is None or caller.access_key_id != self.developer.access_key_id:
            self.log(f"control: {request.method} {request.path[:200]} refused: signed by {caller.arn}")
            message = (
                f"User: {caller.arn} is not authorized to perform: {request.method} {request.path[:200]}: local mode's "
                "own routes answer only the developer's keys (the state file's `developer`)"
            )
            return access_denied_reply(message)
        return None

    def refusal_of(
        self,
        method: str,
        raw_path: str,
        raw_query: str,
        headers: Mapping[str, str],
        body: bytes,
        source_ip: str = "127.0.0.1",
    ) -> Reply | None:
        """`refusal` of a request given in pieces (header names in any case)."""
        lowered = {name.lower(): value for name, value in headers.items()}
        return self.refusal(HttpRequest(method, raw_path, raw_query, lowered, body, source_ip))


def access_denied_reply(message: str) -> Reply:
    """403 `AccessDeniedException`, as a REST-JSON service sends it."""
    headers = {
        "Content-Type": "application/json",
        "x-amzn-ErrorType": "AccessDeniedException",
        "x-amzn-RequestId": request_id(),
    }
    return Reply(403, headers, json.dumps({"message": message}).encode())
