"""Who may do what in local mode: the credentials each function and container runs with, and the IAM checks
on every call, glued to local up's pieces (the emulator's WSGI app, the AWS front, the HTTP API fronts).

The engine (policy evaluation, SigV4, request-to-action mapping, AWS-shaped denials) is
servestack/local/iam/. This module decides what local up asks of it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from servestack.local.cloudformation import ACCOUNT
from servestack.local.http_server import Reply, Request

WsgiApp = Callable[..., Any]
DEVELOPER_KEY = "local"
DEVELOPER_SECRET = "local"  # noqa: S105 - a documented local-only credential, like LocalStack's `test`


@dataclass(frozen=True)
class Credentials:
    """Keys standing for one identity, as a process gets them in its environment."""

    arn: str
    access_key_id: str
    secret_access_key: str
    session_token: str | None = None

    def environment(self) -> dict[str, str]:
        env = {"AWS_ACCESS_KEY_ID": self.access_key_id, "AWS_SECRET_ACCESS_KEY": self.secret_access_key}
        if self.session_token:
            env["AWS_SESSION_TOKEN"] = self.session_token
        return env

    def to_dict(self) -> dict[str, str]:
        return {"arn": self.arn, **self.environment()}


def _stable(seed: str, length: int, alphabet: str) -> str:
    digest = hashlib.sha256(seed.encode()).digest()
    return "".join(alphabet[b % len(alphabet)] for b in digest[:length])


DEVELOPER = Credentials(f"arn:aws:iam::{ACCOUNT}:user/developer", DEVELOPER_KEY, DEVELOPER_SECRET)


def role_credentials(role_arn: str) -> Credentials:
    """Stable temporary-style keys for a role (`ASIA...`), so a role keeps its keys across restarts and a
    user can replay a call as that function with the keys from the state file."""
    upper = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
    mixed = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
    session = f"arn:aws:sts::{ACCOUNT}:assumed-role/{role_arn.rsplit('/', 1)[-1]}/local"
    return Credentials(
        session,
        "ASIA" + _stable(f"key/{role_arn}", 16, upper),
        _stable(f"secret/{role_arn}", 40, mixed),
        _stable(f"token/{role_arn}", 64, mixed),
    )


class OpenAccess:
    """`--no-iam`: every identity may do everything (the calls are still signed with each role's keys)."""

    enabled = False

    def __init__(self) -> None:
        self.developer = DEVELOPER
        self.denials: list[str] = []

    def credentials_for(self, role_arn: str, policies: tuple[dict[str, Any], ...]) -> Credentials:
        return role_credentials(role_arn)

    def add_resource_policies(self, policies: dict[str, list[dict[str, Any]]]) -> None:
        return None

    def middleware(self, app: WsgiApp) -> WsgiApp:
        return app

    def check(self, request: Request, service: str, resource: str | None = None) -> dict[str, Any] | Reply:
        return {"userArn": self.developer.arn, "accountId": ACCOUNT, "accessKey": self.developer.access_key_id}

    def authorize(self, caller_arn: str, action: str, resource: str) -> str | None:
        return None

    def may_send(self, queue_arn: str, service: str, source_arn: str, source_account: str) -> bool:
        return True


class EnforcedAccess:
    """The templates' IAM, enforced by servestack/local/iam on every call: the emulator's (WSGI middleware),
    the AWS front's and the HTTP APIs' (SigV4 + authorization), and the calls local up makes for a service
    (a schedule invoking its target as its role)."""

    enabled = True

    def __init__(self, log: Callable[[str], None] = print, region: str = "us-east-1") -> None:
        from servestack.local.iam import IamEnforcer, IdentityStore, ResourcePolicies

        self.store = IdentityStore(ACCOUNT)
        self.policies = ResourcePolicies()
        self.enforcer = IamEnforcer(self.store, self.policies, log=lambda line: log(line), region=region)
        identity = self.store.developer(DEVELOPER_KEY, DEVELOPER_SECRET)
        self.developer = Credentials(identity.arn, identity.access_key_id, identity.secret_access_key)
        self._by_role: dict[str, Any] = {}

    @property
    def denials(self) -> list[str]:
        return [denial.line() for denial in self.enforcer.denials]

    def credentials_for(self, role_arn: str, policies: tuple[dict[str, Any], ...]) -> Credentials:
        """The keys a process running as `role_arn` gets (a role session named `local`)."""
        named = {f"policy-{i}": document for i, document in enumerate(policies)}
        identity = self.store.role(role_arn, named, session_name="local")
        self._by_role[role_arn] = identity
        return Credentials(identity.arn, identity.access_key_id, identity.secret_access_key, identity.session_token)

    def add_resource_policies(self, policies: dict[str, list[dict[str, Any]]]) -> None:
        for arn, documents in policies.items():
            statements = [s for document in documents for s in _statements(document)]
            self.policies.put(arn, {"Version": "2012-10-17", "Statement": statements})

    def middleware(self, app: WsgiApp) -> WsgiApp:
        wrapped: WsgiApp = self.enforcer.wsgi(app)
        return wrapped

    def check(self, request: Request, service: str, resource: str | None = None) -> dict[str, Any] | Reply:
        """SigV4 + authorization of a request to one of local up's fronts; for an HTTP API (`execute-api`),
        `resource` is the route's ARN, whose API id the check needs."""
        from servestack.local.iam import ExecuteApi

        api = None
        if service == "execute-api" and resource is not None:
            api = ExecuteApi(resource.split(":", 5)[5].split("/", 1)[0])
        verdict = self.enforcer.check_request(request, service, api=api)
        if isinstance(verdict, Reply) or verdict is None:
            return verdict if verdict is not None else {}
        # What API Gateway puts in requestContext.authorizer.iam for an IAM-authorized route.
        return {
            "accessKey": verdict.access_key_id,
            "accountId": verdict.account,
            "callerId": verdict.user_id,
            "cognitoIdentity": None,
            "principalOrgId": None,
            "userArn": verdict.arn,
            "userId": verdict.user_id,
        }

    def authorize(self, caller_arn: str, action: str, resource: str) -> str | None:
        """A call local up makes as a role (a schedule invoking its target): None when allowed, else why not."""
        identity = self._by_role.get(caller_arn)
        if identity is None:
            return f"{caller_arn} is not a role of the templates"
        decision = self.enforcer.authorize(identity, action, resource)
        if decision.allowed:
            return None
        return (
            f"User: {identity.arn} is not authorized to perform: {action} on resource: {resource} ({decision.reason})"
        )

    def may_send(self, queue_arn: str, service: str, source_arn: str, source_account: str) -> bool:
        from servestack.local.iam import evaluate_service_principal

        policy = self.policies.get(queue_arn)
        if policy is None:
            return False
        decision = evaluate_service_principal(
            policy, service=service, action="sqs:SendMessage", resource=queue_arn,
            context={"aws:SourceArn": source_arn, "aws:SourceAccount": source_account},
        )  # fmt: skip
        return bool(decision.allowed)


def _statements(document: dict[str, Any]) -> list[dict[str, Any]]:
    statements = document.get("Statement", [])
    return list(statements) if isinstance(statements, list) else [statements]
