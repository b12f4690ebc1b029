"""Who may do what in local mode, as local up asks it: the credentials each function and container runs with,
and the IAM checks on every call, glued to local up's pieces (the emulator's WSGI app, the AWS front, the
HTTP API fronts, the calls local up makes as a role).

There is one access layer, whether IAM is enforced or not: `--no-iam` (or an external emulator, which local
up cannot stand in front of) is a setting of the one enforcer, which then says so once and lets every call
through. Keys are the same either way (one derivation, servestack/local/iam/identities.py), so a state file
written with `--no-iam` names the keys an enforced run hands out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from servestack.local.hosting import Reply, Request
from servestack.local.iam.enforcer import IamEnforcer
from servestack.local.iam.identities import DEVELOPER_KEY, DEVELOPER_SECRET, Credentials, Identity, IdentityStore
from servestack.local.iam.operations import ExecuteApi
from servestack.local.iam.resource_policies import ResourcePolicies, evaluate_service_principal

WsgiApp = Callable[..., Any]


def _say(line: str) -> None:
    print(line, flush=True)


class LocalAccess:
    """The templates' IAM on every call local up serves or makes: the emulator's (WSGI middleware), the AWS
    front's and the HTTP APIs' (SigV4 + authorization), and the calls local up makes for a service (a
    schedule invoking its target as its role). `enforced=False` (`--no-iam`): every call is allowed, with one
    warning naming `disabled_because`."""

    def __init__(
        self,
        *,
        enforced: bool = True,
        disabled_because: str = "--no-iam",
        log: Callable[[str], None] = _say,
        region: str = "us-east-1",
    ) -> None:
        self.store = IdentityStore()
        self.policies = ResourcePolicies()
        self.enforcer = IamEnforcer(
            self.store, self.policies, enabled=enforced, disabled_because=disabled_because, log=log, region=region
        )
        self.developer: Credentials = self.store.developer(DEVELOPER_KEY, DEVELOPER_SECRET).credentials
        self._by_role: dict[str, Identity] = {}

    @property
    def enabled(self) -> bool:
        return self.enforcer.enabled

    @property
    def denials(self) -> list[str]:
        return [denial.line() for denial in self.enforcer.denials]

    def credentials_for(self, role_arn: str, policies: tuple[dict[str, Any], ...]) -> Credentials:
        """The keys a process running as `role_arn` gets (a role session named `local`)."""
        named = {f"policy-{i}": document for i, document in enumerate(policies)}
        identity = self.store.role(role_arn, named, session_name="local")
        self._by_role[role_arn] = identity
        return identity.credentials

    def add_resource_policies(self, policies: dict[str, list[dict[str, Any]]]) -> None:
        for arn, documents in policies.items():
            statements = [s for document in documents for s in _statements(document)]
            self.policies.put(arn, {"Version": "2012-10-17", "Statement": statements})

    def middleware(self, app: WsgiApp) -> WsgiApp:
        wrapped: WsgiApp = self.enforcer.wsgi(app)
        return wrapped

    def check(self, request: Request, service: str, resource: str | None = None) -> dict[str, Any] | Reply:
        """SigV4 + authorization of a request to one of local up's fronts: the caller's fields of
        `requestContext.authorizer.iam`, or the refusal to send. For an HTTP API (`execute-api`), `resource`
        is the route's ARN, whose API id the check needs. With enforcement off, the caller is the developer."""
        if not self.enabled:
            return _authorizer_fields(self.developer.arn, self.store.account_id, self.developer.access_key_id, "")
        api = None
        if service == "execute-api" and resource is not None:
            api = ExecuteApi(resource.split(":", 5)[5].split("/", 1)[0])
        verdict = self.enforcer.check_request(request, service, api=api, source_ip=request.source_ip)
        if isinstance(verdict, Reply):
            return verdict
        if verdict is None:
            return {}
        return _authorizer_fields(verdict.arn, verdict.account, verdict.access_key_id, verdict.user_id)

    def authorize(
        self, caller_arn: str, action: str, resource: str, context: Mapping[str, str] | None = None
    ) -> str | None:
        """A call local up makes as a role (a schedule invoking its target): None when allowed, else why not.
        `context`: the request's condition keys (`iam:PassedToService` of an iam:PassRole)."""
        if not self.enabled:
            return None
        identity = self._by_role.get(caller_arn)
        if identity is None:
            return f"{caller_arn} is not a role of the templates"
        decision = self.enforcer.authorize(identity, action, resource, context)
        if decision.allowed:
            return None
        return (
            f"User: {identity.arn} is not authorized to perform: {action} on resource: {resource} ({decision.reason})"
        )

    def may_send(self, queue_arn: str, service: str, source_arn: str, source_account: str) -> bool:
        """Whether `service` (on behalf of `source_arn`) may send to the queue, by the queue's policy."""
        if not self.enabled:
            return True
        policy = self.policies.get(queue_arn)
        if policy is None:
            return False
        decision = evaluate_service_principal(
            policy, service=service, action="sqs:SendMessage", resource=queue_arn,
            context={"aws:SourceArn": source_arn, "aws:SourceAccount": source_account},
        )  # fmt: skip
        return bool(decision.allowed)


def _authorizer_fields(arn: str, account: str, access_key_id: str, user_id: str) -> dict[str, Any]:
    """What API Gateway puts in requestContext.authorizer.iam for an IAM-authorized route."""
    return {
        "accessKey": access_key_id,
        "accountId": account,
        "callerId": user_id,
        "cognitoIdentity": None,
        "principalOrgId": None,
        "userArn": arn,
        "userId": user_id,
    }


def _statements(document: dict[str, Any]) -> list[dict[str, Any]]:
    statements = document.get("Statement", [])
    return list(statements) if isinstance(statements, list) else [statements]
