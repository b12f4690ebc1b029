"""Local up's own route to the roles of its running IAM store: `GET /_servestack/iam/roles` lists each role
and its policy documents (the templates' statements, resolved), `PUT /_servestack/iam/roles/{name}` with
`{"policies": {name: document}}` gives a role new documents (a role the store does not hold is added) and
answers its keys.

A role's statements are data once the templates are synthesized: a store without a statement decides every
call as the templates without that statement would. So the IAM mutation test removes statements here, from
one running `local up`, instead of synthesizing and starting again per statement; and a role of a stack local
up does not run (the pipeline's smoke step role) gets its keys here. The keys do not change with the
documents, so the processes running as the role see the change on their next call.

AWS has no such route (its IAM API is global and eventually consistent). As every route of local mode's own, it
answers only the developer's signature (servestack/local/iam/control.py, checked by local up's AWS front before
the route); the developer signs for `iam`, and IAM is asked for `iam:PutRolePolicy` (GET: `iam:GetRolePolicy`)
on the role as well. No answer holds a key but PUT's, of the role it changes.
"""

from __future__ import annotations

import json
from typing import Any

from servestack.local.cloudformation import ACCOUNT
from servestack.local.hosting import Reply, Request

ROUTE = "/_servestack/iam/roles"


def _reply(status: int, body: dict[str, Any]) -> Reply:
    return Reply(status, {"Content-Type": "application/json"}, json.dumps(body).encode())


def _refused(status: int, field: str, value: str, allowed: str) -> Reply:
    message = f"{field}: {value!r} is not allowed; {allowed}"
    return _reply(status, {"error": {"field": field, "value": value, "allowed": allowed, "message": message}})


class RolePolicies:
    """The route over one `EnforcedAccess` (its identity store)."""

    CONTROL_ROUTES = (("GET", ROUTE), ("PUT", f"{ROUTE}/{{role}}"))  # local up's own (the developer's signature)

    def __init__(self, access: Any) -> None:
        self.access = access

    @staticmethod
    def is_route(request: Request) -> bool:
        return request.path == ROUTE or request.path.startswith(ROUTE + "/")

    def handle(self, request: Request) -> Reply:
        if not getattr(self.access, "enabled", False):
            return _refused(409, "iam", "not enforced", "this local up runs with --no-iam: it holds no policies")
        name = request.path[len(ROUTE) :].strip("/")
        arn = f"arn:aws:iam::{ACCOUNT}:role/{name}" if name else "*"
        action = "iam:GetRolePolicy" if request.method == "GET" else "iam:PutRolePolicy"
        identity = self.access.enforcer.check_request(request, "iam")
        if isinstance(identity, Reply):
            return identity
        decision = self.access.enforcer.authorize(identity, action, arn)
        if not decision.allowed:
            return _reply(403, {"error": {"code": "AccessDenied", "message": f"{identity.arn}: {action} on {arn}"}})
        if request.method == "GET" and not name:
            roles = {
                who.name: {"arn": who.principal_arn, "policies": dict(who.policies)}
                for who in self.access.store
                if who.kind == "role"
            }
            return _reply(200, {"roles": roles})
        if request.method != "PUT" or not name or "/" in name:
            return _refused(405, "method", f"{request.method} {request.path}", f"GET {ROUTE} or PUT {ROUTE}/<role>")
        try:
            body = json.loads(request.body or b"{}")
        except ValueError:
            return _refused(400, "body", request.body[:80].decode(errors="replace"), 'JSON {"policies": {...}}')
        policies = body.get("policies") if isinstance(body, dict) else None
        if not isinstance(policies, dict) or not all(isinstance(d, dict) for d in policies.values()):
            return _refused(400, "policies", str(policies)[:80], "an object of policy name -> policy document")
        from servestack.local.iam.conditions import PolicyError

        try:
            keys = self.access.credentials_for(arn, tuple(policies.values()))
        except PolicyError as error:  # a document IAM would refuse
            return _refused(400, "policies", str(error)[:200], "documents IAM accepts")
        return _reply(200, {"arn": arn, **keys.to_dict()})
