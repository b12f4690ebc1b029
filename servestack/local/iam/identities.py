"""Who is calling: the identities local mode knows, looked up by access key id.

Each Lambda function and realtime container gets credentials standing for its IAM role: an `ASIA...` key
id, a secret and a session token, as `sts:AssumeRole` hands them out, derived from a seed string so that a
role keeps its keys across `local up` restarts (the state file can record them, a user can replay a call as
the function). The *developer* identity stands for the developer's own AWS identity (an administrator):
`local`/`local` by default, so that a shell with those keys and `AWS_ENDPOINT_URL` set can do anything.

Lookups are one dict read. Writers (adding or removing identities) copy the dict and swap it under a lock,
so readers on request threads never take the lock.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from servestack.local.cloudformation import ACCOUNT
from servestack.local.iam.policy import Caller, PolicySet, compile_policy

DEVELOPER_KEY = "local"
DEVELOPER_SECRET = "local"  # noqa: S105 - a well-known local default, like moto's "testing" or LocalStack's "test"
ADMIN_POLICY: Mapping[str, Any] = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
}

IdentityKind = Literal["role", "user"]


@dataclass(frozen=True)
class Credentials:
    """Keys standing for one caller, as a process gets them in its environment and the state file records
    them. `arn` is the caller as AWS prints it (`...:assumed-role/{Role}/{session}` for a role session,
    `...:user/{name}` for a user)."""

    arn: str
    access_key_id: str
    secret_access_key: str
    session_token: str | None = None

    def environment(self) -> dict[str, str]:
        """The variables a process needs to act as this caller (boto3 reads them)."""
        env = {"AWS_ACCESS_KEY_ID": self.access_key_id, "AWS_SECRET_ACCESS_KEY": self.secret_access_key}
        if self.session_token:
            env["AWS_SESSION_TOKEN"] = self.session_token
        return env

    def to_dict(self) -> dict[str, str]:
        return {"arn": self.arn, **self.environment()}

    @classmethod
    def from_dict(cls, keys: Mapping[str, str]) -> Credentials:
        """The inverse of `to_dict` (a state file's `developer` or one of its `identities`)."""
        return cls(keys["arn"], keys["AWS_ACCESS_KEY_ID"], keys["AWS_SECRET_ACCESS_KEY"], keys.get("AWS_SESSION_TOKEN"))


# The developer's own keys, as `IdentityStore.developer()` registers them by default.
DEVELOPER = Credentials(f"arn:aws:iam::{ACCOUNT}:user/developer", DEVELOPER_KEY, DEVELOPER_SECRET)


@dataclass(frozen=True)
class Identity:
    """A caller the store knows: its credentials, the role or user it stands for (`principal_arn`) and that
    principal's policies."""

    credentials: Credentials
    principal_arn: str
    policies: Mapping[str, Mapping[str, Any]] = field(compare=False)  # name -> resolved document (no Fn::)
    kind: IdentityKind = "role"
    user_id: str = ""  # aws:userid: "AROA...:session" for a role session, "AIDA..." for a user
    issued_at: datetime = field(default_factory=lambda: datetime.now(UTC), compare=False)
    compiled: PolicySet = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        compiled = PolicySet(
            compile_policy(document, name=f"{self.principal_arn}:{name}") for name, document in self.policies.items()
        )
        object.__setattr__(self, "compiled", compiled)

    @property
    def arn(self) -> str:
        return self.credentials.arn

    @property
    def access_key_id(self) -> str:
        return self.credentials.access_key_id

    @property
    def secret_access_key(self) -> str:
        return self.credentials.secret_access_key

    @property
    def session_token(self) -> str | None:
        return self.credentials.session_token

    @property
    def account(self) -> str:
        return self.principal_arn.split(":")[4]

    @property
    def name(self) -> str:
        """The role or user name."""
        return self.principal_arn.rsplit("/", 1)[-1]

    @property
    def caller(self) -> Caller:
        return Caller(self.arn, self.principal_arn, self.account)

    def environment(self) -> dict[str, str]:
        """The variables a process needs to act as this identity (boto3 reads them)."""
        return self.credentials.environment()


def _derive(seed: str, *parts: str) -> bytes:
    """The one derivation of local mode's keys: HMAC-SHA256 of the parts under the store's seed, so a role
    keeps its keys across restarts and a user can replay a call with the keys the state file records."""
    return hmac.new(seed.encode(), "\n".join(parts).encode(), hashlib.sha256).digest()


def _key_id(prefix: str, digest: bytes, length: int = 16) -> str:
    return prefix + base64.b32encode(digest).decode()[:length]


class IdentityStore:
    """The identities of one local deployment, by access key id (thread-safe)."""

    def __init__(self, account_id: str = ACCOUNT, *, seed: str = "servestack-local") -> None:
        self.account_id = account_id
        self.seed = seed
        self._by_key: dict[str, Identity] = {}
        self._roles: dict[str, Mapping[str, Mapping[str, Any]]] = {}  # role ARN -> its policies
        self._lock = threading.Lock()

    # -------------------------------------------------------------------------------- lookups

    def lookup(self, access_key_id: str) -> Identity | None:
        return self._by_key.get(access_key_id)

    def __iter__(self) -> Iterator[Identity]:
        return iter(list(self._by_key.values()))

    def __len__(self) -> int:
        return len(self._by_key)

    def role_policies(self, role_arn: str) -> Mapping[str, Mapping[str, Any]] | None:
        """The policies of a role this store knows (for `sts:AssumeRole`), or None."""
        return self._roles.get(role_arn)

    # -------------------------------------------------------------------------------- writes

    def add(self, identity: Identity) -> Identity:
        with self._lock:
            existing = self._by_key.get(identity.access_key_id)
            if existing is not None and existing.principal_arn != identity.principal_arn:
                raise ValueError(
                    f"access key {identity.access_key_id} already stands for {existing.arn}; "
                    f"it cannot also stand for {identity.arn}"
                )
            self._by_key = {**self._by_key, identity.access_key_id: identity}
            if identity.kind == "role":
                self._roles = {**self._roles, identity.principal_arn: identity.policies}
        return identity

    def remove(self, access_key_id: str) -> None:
        with self._lock:
            self._by_key = {key: value for key, value in self._by_key.items() if key != access_key_id}

    def role(
        self,
        role: str,
        policies: Mapping[str, Mapping[str, Any]],
        *,
        session_name: str,
    ) -> Identity:
        """Credentials for a session of `role` (a role name or ARN), the same for the same seed, role and
        session name. The identity is added to the store and returned."""
        role_arn = role if role.startswith("arn:") else f"arn:aws:iam::{self.account_id}:role/{role}"
        role_name = role_arn.rsplit("/", 1)[-1]
        account = role_arn.split(":")[4]
        key_digest = _derive(self.seed, "access-key", role_arn, session_name)
        secret = base64.b64encode(_derive(self.seed, "secret", role_arn, session_name)).decode()[:40]
        token = base64.b64encode(
            b"".join(_derive(self.seed, "token", role_arn, session_name, str(n)) for n in range(3))
        ).decode()
        role_id = _key_id("AROA", _derive(self.seed, "role-id", role_arn), 17)
        identity = Identity(
            Credentials(
                f"arn:aws:sts::{account}:assumed-role/{role_name}/{session_name}",
                _key_id("ASIA", key_digest),
                secret,
                token,
            ),
            principal_arn=role_arn,
            policies=dict(policies),
            kind="role",
            user_id=f"{role_id}:{session_name}",
        )
        return self.add(identity)

    def user(
        self,
        name: str,
        policies: Mapping[str, Mapping[str, Any]],
        *,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
    ) -> Identity:
        """An IAM user with long-term keys (`AKIA...` derived from the seed unless given)."""
        user_arn = f"arn:aws:iam::{self.account_id}:user/{name}"
        identity = Identity(
            Credentials(
                user_arn,
                access_key_id or _key_id("AKIA", _derive(self.seed, "user-key", user_arn)),
                secret_access_key or base64.b64encode(_derive(self.seed, "user-secret", user_arn)).decode()[:40],
            ),
            principal_arn=user_arn,
            policies=dict(policies),
            kind="user",
            user_id=_key_id("AIDA", _derive(self.seed, "user-id", user_arn), 17),
        )
        return self.add(identity)

    def developer(
        self,
        access_key_id: str = DEVELOPER_KEY,
        secret_access_key: str = DEVELOPER_SECRET,
        *,
        name: str = "developer",
    ) -> Identity:
        """The developer's own identity: an administrator (`Allow * on *`), `local`/`local` by default."""
        return self.user(
            name,
            {"AdministratorAccess": ADMIN_POLICY},
            access_key_id=access_key_id,
            secret_access_key=secret_access_key,
        )
