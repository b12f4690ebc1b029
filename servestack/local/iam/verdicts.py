"""What the enforcer decides: a verdict on one request (its reply when refused, its canonical form when allowed,
the checks still to make), and each denial it records for `local up`'s report."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from servestack.local.hosting import Reply
from servestack.local.iam.calls import Operation
from servestack.local.iam.identities import Identity
from servestack.local.iam.policy import Decision
from servestack.local.iam.wire import HttpRequest


@dataclass(frozen=True)
class Denial:
    """One refused call, for local up's summary."""

    at: datetime
    caller: str
    action: str
    resource: str
    reason: str
    operation: str = ""

    def line(self) -> str:
        return f"iam: DENY {self.caller} {self.action} {self.resource} ({self.reason})"


@dataclass
class Verdict:
    """What to do with one request."""

    identity: Identity | None
    operation: Operation | None = None
    reply: Reply | None = None  # answer this instead of passing the request on
    denied_keys: tuple[tuple[str, str | None], ...] = ()  # S3 DeleteObjects keys the caller may not delete
    # S3 Get/HeadObject: the caller's s3:ListBucket decision, asked only when the key turns out missing
    list_bucket: Callable[[], Decision] | None = None
    caller_arn: str = "anonymous"
    service: str = ""
    extra: dict[str, str] = field(default_factory=dict)
    # the one form of the request that was authorized, and that moto is given (canonical.py)
    canonical: HttpRequest | None = None
