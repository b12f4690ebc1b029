"""IAM policies: loaded (validated and compiled once) and evaluated the way AWS documents for one account.

Evaluation (IAM User Guide, "Policy evaluation logic" / "Policy evaluation for requests within a single
account"): every statement of every policy that applies to the request is considered;
1. an applicable `Deny` in an identity-based or a resource-based policy denies (explicit deny);
2. otherwise an applicable `Allow` in a resource-based policy that names the caller, or in one of the
   caller's identity-based policies, allows;
3. otherwise the request is denied (implicit deny).
A resource-based policy whose `Principal` is the whole account (`123456789012` or `arn:aws:iam::...:root`)
delegates to IAM: it does not allow on its own, the caller's identity policy must. Its `Deny` still applies.
A role trust policy (the resource policy of `sts:AssumeRole`) is required, not optional: `trust=True`.

A statement applies when its `Action`/`NotAction` matches the action (case-insensitively, `*` and `?`),
its `Resource`/`NotResource` matches the resource ARN (case-sensitively), its `Principal`/`NotPrincipal`
names the caller (resource-based policies only) and every condition holds (servestack/local/iam/conditions.py).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal

from servestack.local.iam.conditions import ConditionTest, Context, PolicyError, compile_condition_block
from servestack.local.iam.wildcards import compile_globs

__all__ = [
    "Caller",
    "Decision",
    "Policy",
    "PolicyError",
    "PolicySet",
    "compile_policy",
    "evaluate",
]

PolicyKind = Literal["identity", "resource"]
VERSIONS = ("2012-10-17", "2008-10-17")
POLICY_KEYS = frozenset({"Version", "Id", "Statement"})
STATEMENT_KEYS = frozenset(
    {"Sid", "Effect", "Action", "NotAction", "Resource", "NotResource", "Principal", "NotPrincipal", "Condition"}
)
PRINCIPAL_TYPES = frozenset({"AWS", "Service", "Federated", "CanonicalUser"})
ACTION = re.compile(r"^[A-Za-z0-9-]+:[A-Za-z0-9*?-]+$")
ACTION_CACHE_LIMIT = 4096  # distinct actions remembered per policy; unknown operation names cannot grow it past this


@dataclass(frozen=True)
class Caller:
    """Who makes a request, as policies see it.

    `arn` is what AWS prints in errors (`arn:aws:sts::123456789012:assumed-role/Role/session`,
    `arn:aws:iam::123456789012:user/name`, `anonymous`, or a service principal such as `s3.amazonaws.com`);
    `principal_arn` is the role or user ARN (`aws:PrincipalArn`)."""

    arn: str
    principal_arn: str | None
    account: str | None
    service: str | None = None

    @classmethod
    def anonymous(cls) -> Caller:
        return cls("anonymous", None, None)

    @classmethod
    def of_service(cls, service: str) -> Caller:
        return cls(service, None, None, service=service)


class PrincipalMatch(Enum):
    NONE = 0
    ACCOUNT = 1  # the statement names the caller's whole account: delegates to the caller's identity policies
    DIRECT = 2  # the statement names the caller (or everyone)


@dataclass(frozen=True)
class PrincipalSet:
    everyone: bool
    aws: frozenset[str]
    services: frozenset[str]

    def match(self, caller: Caller) -> PrincipalMatch:
        if self.everyone:
            return PrincipalMatch.DIRECT
        if caller.service is not None:
            return PrincipalMatch.DIRECT if caller.service in self.services else PrincipalMatch.NONE
        if caller.arn in self.aws or (caller.principal_arn is not None and caller.principal_arn in self.aws):
            return PrincipalMatch.DIRECT
        if caller.account is not None and (
            caller.account in self.aws or f"arn:aws:iam::{caller.account}:root" in self.aws
        ):
            return PrincipalMatch.ACCOUNT
        return PrincipalMatch.NONE


@dataclass(frozen=True)
class Statement:
    label: str  # "<policy name>#<Sid or index>"
    allow: bool
    actions: re.Pattern[str]
    not_action: bool
    resources: re.Pattern[str] | None  # None: no Resource element (a trust policy: the role itself)
    not_resource: bool
    principals: PrincipalSet | None
    not_principal: bool
    conditions: tuple[ConditionTest, ...]

    def covers_action(self, action: str) -> bool:
        return (self.actions.fullmatch(action) is not None) != self.not_action

    def covers(self, resource: str, context: Context) -> bool:
        if self.resources is not None and (self.resources.fullmatch(resource) is not None) == self.not_resource:
            return False
        return all(test.holds(context) for test in self.conditions)

    def names(self, caller: Caller) -> PrincipalMatch:
        if self.principals is None:
            return PrincipalMatch.DIRECT  # identity-based: the policy's owner is the caller
        matched = self.principals.match(caller)
        if self.not_principal:
            return PrincipalMatch.DIRECT if matched is PrincipalMatch.NONE else PrincipalMatch.NONE
        return matched


@dataclass(frozen=True)
class Policy:
    name: str
    kind: PolicyKind
    statements: tuple[Statement, ...]
    document: Mapping[str, Any] = field(repr=False, compare=False)
    _by_action: dict[str, tuple[Statement, ...]] = field(default_factory=dict, repr=False, compare=False)

    def statements_for(self, action: str) -> tuple[Statement, ...]:
        """The statements whose Action element covers `action` (remembered: one dict lookup next time)."""
        key = action.lower()
        found = self._by_action.get(key)
        if found is None:
            found = tuple(statement for statement in self.statements if statement.covers_action(action))
            if len(self._by_action) >= ACTION_CACHE_LIMIT:
                self._by_action.clear()
            self._by_action[key] = found
        return found


class PolicySet:
    """An identity's policies together; per action, the statements that could apply (remembered)."""

    def __init__(self, policies: Iterable[Policy]) -> None:
        self.policies = tuple(policies)
        self._by_action: dict[str, tuple[Statement, ...]] = {}
        self._lock = threading.Lock()

    def statements_for(self, action: str) -> tuple[Statement, ...]:
        key = action.lower()
        found = self._by_action.get(key)
        if found is None:
            found = tuple(statement for policy in self.policies for statement in policy.statements_for(action))
            with self._lock:
                if len(self._by_action) >= ACTION_CACHE_LIMIT:
                    self._by_action.clear()
                self._by_action[key] = found
        return found


# ------------------------------------------------------------------------------------------ loading


def compile_policy(document: Mapping[str, Any] | str, *, name: str, kind: PolicyKind = "identity") -> Policy:
    """Validate and compile a policy document; `PolicyError` names the statement and the element at fault."""
    if isinstance(document, str):
        text = document
        try:
            document = json.loads(text)
        except json.JSONDecodeError as error:
            raise PolicyError(f"{name}: not JSON ({error})", field=name, value=text[:80], allowed="JSON") from error
    if not isinstance(document, Mapping):
        raise PolicyError(f"{name}: a policy is a JSON object", field=name, value=document, allowed="JSON object")
    unknown = sorted(set(document) - POLICY_KEYS)
    if unknown:
        raise PolicyError(
            f"{name}: unknown policy element {unknown[0]!r}",
            field=name,
            value=unknown[0],
            allowed=", ".join(sorted(POLICY_KEYS)),
        )
    version = document.get("Version")
    if version is not None and version not in VERSIONS:
        raise PolicyError(
            f"{name}: unknown Version {version!r}", field=f"{name}.Version", value=version, allowed=", ".join(VERSIONS)
        )
    raw = document.get("Statement")
    statements = [raw] if isinstance(raw, Mapping) else raw
    if not isinstance(statements, list) or not statements:
        raise PolicyError(
            f"{name}: Statement must be an object or a non-empty list of them",
            field=f"{name}.Statement",
            value=raw,
            allowed="a statement object or a non-empty list",
        )
    compiled = tuple(
        _compile_statement(statement, name=name, index=index, kind=kind) for index, statement in enumerate(statements)
    )
    return Policy(name, kind, compiled, document)


def _compile_statement(statement: Any, *, name: str, index: int, kind: PolicyKind) -> Statement:
    if not isinstance(statement, Mapping):
        where = f"{name}#{index}"
        raise PolicyError(f"{where}: a statement is a JSON object", field=where, value=statement, allowed="JSON object")
    sid = statement.get("Sid")
    if sid is not None and not isinstance(sid, str):
        where = f"{name}#{index}"
        raise PolicyError(f"{where}: Sid must be a string", field=f"{where}.Sid", value=sid, allowed="string")
    where = f"{name}#{sid or index}"
    unknown = sorted(set(statement) - STATEMENT_KEYS)
    if unknown:
        raise PolicyError(
            f"{where}: unknown statement element {unknown[0]!r}",
            field=where,
            value=unknown[0],
            allowed=", ".join(sorted(STATEMENT_KEYS)),
        )
    effect = statement.get("Effect")
    if effect not in ("Allow", "Deny"):
        raise PolicyError(
            f"{where}: Effect must be Allow or Deny", field=f"{where}.Effect", value=effect, allowed="Allow, Deny"
        )

    action_key = _exactly_one(statement, "Action", "NotAction", where=where, required=True)
    assert action_key is not None
    actions = _strings(statement[action_key], where=f"{where}.{action_key}")
    for action in actions:
        if action != "*" and not ACTION.match(action):
            raise PolicyError(
                f"{where}: {action_key} {action!r} is not '*' or 'service:Action'",
                field=f"{where}.{action_key}",
                value=action,
                allowed="'*' or 'service:Action' with * and ? wildcards",
            )

    resource_key = _exactly_one(statement, "Resource", "NotResource", where=where, required=kind == "identity")
    resources = None
    if resource_key is not None:
        resources = compile_globs(
            _strings(statement[resource_key], where=f"{where}.{resource_key}"), case_sensitive=True
        )

    principal_key = _exactly_one(statement, "Principal", "NotPrincipal", where=where, required=kind == "resource")
    if kind == "identity" and principal_key is not None:
        raise PolicyError(
            f"{where}: an identity-based policy cannot name a {principal_key}",
            field=f"{where}.{principal_key}",
            value=statement[principal_key],
            allowed="no Principal element (the policy applies to the identity it is attached to)",
        )
    principals = None
    if principal_key is not None:
        principals = _principals(statement[principal_key], where=f"{where}.{principal_key}")

    conditions: tuple[ConditionTest, ...] = ()
    if "Condition" in statement:
        conditions = compile_condition_block(statement["Condition"], where=where)
    return Statement(
        label=where,
        allow=effect == "Allow",
        actions=compile_globs(actions, case_sensitive=False),
        not_action=action_key == "NotAction",
        resources=resources,
        not_resource=resource_key == "NotResource",
        principals=principals,
        not_principal=principal_key == "NotPrincipal",
        conditions=conditions,
    )


def _exactly_one(statement: Mapping[str, Any], first: str, second: str, *, where: str, required: bool) -> str | None:
    present = [key for key in (first, second) if key in statement]
    if len(present) == 2:
        raise PolicyError(
            f"{where}: has both {first} and {second}", field=where, value=present, allowed=f"{first} or {second}"
        )
    if not present and required:
        raise PolicyError(
            f"{where}: needs {first} or {second}", field=where, value=None, allowed=f"{first} or {second}"
        )
    return present[0] if present else None


def _strings(value: Any, *, where: str) -> list[str]:
    values = value if isinstance(value, list) else [value]
    if not values or not all(isinstance(item, str) and item for item in values):
        raise PolicyError(
            f"{where}: must be a non-empty string or a non-empty list of them (templates must be resolved: no Fn::)",
            field=where,
            value=value,
            allowed="string or list of strings",
        )
    return values


def _principals(value: Any, *, where: str) -> PrincipalSet:
    if value == "*":
        return PrincipalSet(True, frozenset(), frozenset())
    if not isinstance(value, Mapping) or not value:
        raise PolicyError(
            f'{where}: must be "*" or an object such as {{"AWS": arn}} or {{"Service": "s3.amazonaws.com"}}',
            field=where,
            value=value,
            allowed='"*" or {"AWS"|"Service"|"Federated"|"CanonicalUser": value(s)}',
        )
    unknown = sorted(set(value) - PRINCIPAL_TYPES)
    if unknown:
        raise PolicyError(
            f"{where}: unknown principal type {unknown[0]!r}",
            field=where,
            value=unknown[0],
            allowed=", ".join(sorted(PRINCIPAL_TYPES)),
        )
    aws = _strings(value["AWS"], where=f"{where}.AWS") if "AWS" in value else []
    services = _strings(value["Service"], where=f"{where}.Service") if "Service" in value else []
    for kind in ("Federated", "CanonicalUser"):
        if kind in value:
            _strings(value[kind], where=f"{where}.{kind}")  # valid, but no local caller is ever one of these
    return PrincipalSet("*" in aws, frozenset(aws), frozenset(services))


# ------------------------------------------------------------------------------------------ evaluation


PolicyType = Literal["identity-based", "resource-based"]


@dataclass(frozen=True)
class Decision:
    """Allowed or not, and why: `reason` is for logs (it names the deciding statement); `aws_clause()` is
    the clause AWS puts in its AccessDenied message."""

    allowed: bool
    action: str
    resource: str
    reason: str
    statement: str | None = None
    policy_type: PolicyType | None = None
    explicit: bool = False

    def aws_clause(self, printed_action: str | None = None) -> str:
        """`because no identity-based policy allows the s3:GetObject action` or `with an explicit deny in
        a resource-based policy`; `printed_action` is the action as the service spells it in messages."""
        if self.explicit:
            article = "an" if self.policy_type == "identity-based" else "a"
            return f"with an explicit deny in {article} {self.policy_type} policy"
        kind = self.policy_type or "identity-based"
        return f"because no {kind} policy allows the {printed_action or self.action} action"


def evaluate(
    caller: Caller,
    action: str,
    resource: str,
    context: Context,
    *,
    identity_policies: PolicySet | None,
    resource_policy: Policy | None = None,
    trust: bool = False,
) -> Decision:
    """The single-account decision for `caller` doing `action` on `resource` (see the module docstring).

    `context` holds lower-cased keys (conditions.normalise_context). `trust=True` evaluates a role trust
    policy, which must itself allow the caller (or name the account while the identity policy allows)."""
    identity_allow: str | None = None
    resource_allow: str | None = None
    account_allow: str | None = None
    if identity_policies is not None:
        for statement in identity_policies.statements_for(action):
            if not statement.covers(resource, context):
                continue
            if not statement.allow:
                return Decision(
                    False,
                    action,
                    resource,
                    f"explicit deny in {statement.label}",
                    statement.label,
                    "identity-based",
                    True,
                )
            identity_allow = identity_allow or statement.label
    if resource_policy is not None:
        for statement in resource_policy.statements_for(action):
            named = statement.names(caller)
            if named is PrincipalMatch.NONE or not statement.covers(resource, context):
                continue
            if not statement.allow:
                return Decision(
                    False,
                    action,
                    resource,
                    f"explicit deny in {statement.label}",
                    statement.label,
                    "resource-based",
                    True,
                )
            if named is PrincipalMatch.DIRECT:
                resource_allow = resource_allow or statement.label
            else:
                account_allow = account_allow or statement.label
    if resource_allow is not None:
        return Decision(True, action, resource, f"allowed by {resource_allow}", resource_allow, "resource-based")
    if trust:
        if account_allow is not None and identity_allow is not None:
            return Decision(
                True,
                action,
                resource,
                f"allowed by {account_allow} and {identity_allow}",
                identity_allow,
                "identity-based",
            )
        return Decision(
            False, action, resource, f"no resource-based policy allows the {action} action", None, "resource-based"
        )
    if identity_allow is not None:
        return Decision(True, action, resource, f"allowed by {identity_allow}", identity_allow, "identity-based")
    kind: PolicyType = "identity-based" if identity_policies is not None else "resource-based"
    return Decision(False, action, resource, f"no {kind} policy allows the {action} action", None, kind)
