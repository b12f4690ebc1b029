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
