"""The endpoint router's control port: its admin routes (`ADMIN_ROUTES`, under `/_servestack/`), which answer only a
request signed with the developer's keys.

Unsigned, `POST /_servestack/deploy {"error_rate": 1}` shifted live traffic to a failing green fleet and `GET
/_servestack/metrics` showed process ids and upstream URLs to anyone on the machine (issue 37). Each request on
the control port now passes the check local up's AWS front makes for its own routes (servestack/local/iam/
control.py's `ControlGate`: SigV4 by the developer's keys) before any route is looked up; the CLI (`local
deploy`, `local status`), local up (inference components' copies) and the tests sign with the developer's keys,
which local up gives the router (it is SageMaker's side: it pulls the versions a rehearsal deploys).
"""

from __future__ import annotations

from typing import Any

import orjson

from servestack.local.sagemaker.router_http import ADMIN, REFUSAL_HEADERS, Scope

# The router (servestack/local/sagemaker/router.py), which imports this module: typed loosely, no import circle.
Router = Any

# What the control port answers, as (method, path under /_servestack/ with `{name}` placeholders): the routes of
# `admin`, the 404's list of them, and what the unsigned sweep (tests/functional/test_control_routes.py) walks.
ADMIN_ROUTES = (
    ("GET", "metrics"),
    ("GET", "shadow"),
    ("POST", "deploy"),
    ("GET", "deploy"),
    ("GET", "components"),
    ("POST", "components/{name}"),
)
JSON = [(b"content-type", b"application/json")]


async def control(router: Router, scope: Scope, body: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """The answer to a request on the control port: the developer's signature checked, then the route's."""
    refused = refusal(router, scope, body)
    if refused is not None:
        return refused
    path: str = scope["path"]
    status, answer = await admin(router, scope["method"], path[len(ADMIN) :], body)
    return status, JSON, orjson.dumps(answer)


def refusal(router: Router, scope: Scope, body: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes] | None:
    """None when the developer signed the request; else the 403 (an AWS REST-JSON refusal)."""
    raw_path = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
    headers: dict[str, str] = {}
    for name, value in scope["headers"]:
        key = name.decode("latin-1").lower()
        headers[key] = f"{headers[key]},{value.decode('latin-1')}" if key in headers else value.decode("latin-1")
    client = scope.get("client")
    gate = router.control_gate
    if gate is None:  # no developer keys were given to this router: nothing may drive it
        message = "this router was started without the developer's keys: its admin routes answer no one"
        return 403, REFUSAL_HEADERS, orjson.dumps({"message": message})
    reply = gate.refusal_of(
        scope["method"],
        raw_path,
        scope.get("query_string", b"").decode("latin-1"),
        headers,
        body,
        str(client[0]) if client else "127.0.0.1",
    )
    if reply is None:
        return None
    encoded = [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in reply.headers.items()]
    return reply.status, encoded, reply.body


async def admin(router: Router, method: str, what: str, body: bytes) -> tuple[int, Any]:
    if method == "GET" and what == "metrics":
        return 200, router.metrics()
    if method == "GET" and what == "shadow":
        if router.shadow is None:
            return 404, {"error": {"type": "NoShadow", "message": f"{router.deployment} has no shadow variant"}}
        return 200, {"deployment": router.deployment, "shadow": router.shadow.model, **router.report.to_dict()}
    if what == "deploy" and method == "POST":
        if router.rehearsal is not None and not router.rehearsal.done:
            return 409, {"error": {"type": "RehearsalRunning", "message": "a rehearsal is already running"}}
        if router.rehearsal_factory is None:
            return 404, {"error": {"type": "NoRehearsal", "message": "this router runs no rehearsals"}}
        try:
            router.rehearsal = router.rehearsal_factory(router, orjson.loads(body or b"{}"))
        except ValueError as exc:
            return 400, {"error": {"type": "InvalidRehearsal", "message": str(exc)}}
        router.rehearsal.begin()
        return 202, router.rehearsal.status()
    if what == "components" and method == "GET":
        return 200, router.components()
    if what.startswith("components/") and method == "POST":
        return await scale_request(router, what.removeprefix("components/"), body)
    if what == "deploy" and method == "GET":
        if router.rehearsal is None:
            return 404, {"error": {"type": "NoRehearsal", "message": "no rehearsal has run"}}
        return 200, router.rehearsal.status()
    routes = ", ".join(f"{verb} {route}" for verb, route in ADMIN_ROUTES)
    return 404, {"error": {"type": "NotFound", "message": f"{method} {ADMIN}{what}", "allowed": routes}}


async def scale_request(router: Router, component: str, body: bytes) -> tuple[int, Any]:
    if component not in router.copies:
        allowed = ", ".join(router.copies) or "none: this endpoint hosts no inference components"
        return 404, {"error": {"type": "NotFound", "message": f"component {component!r} is not hosted here",
                               "field": "component", "value": component, "allowed": allowed}}  # fmt: skip
    try:
        copies = orjson.loads(body or b"{}").get("copies")
    except (orjson.JSONDecodeError, AttributeError):
        copies = None
    if isinstance(copies, bool) or not isinstance(copies, int) or not 0 <= copies <= 1000:
        return 400, {"error": {"type": "InvalidCopies", "message": "copies must be an integer in 0..1000",
                               "field": "copies", "value": copies, "allowed": "0..1000"}}  # fmt: skip
    rehearsal = router.rehearsal
    if rehearsal is not None and not rehearsal.done and getattr(rehearsal, "component", None) == component:
        return 409, {"error": {"type": "RehearsalRunning", "message": f"a rehearsal is updating {component}"}}
    return 200, await router.scale(component, copies)
