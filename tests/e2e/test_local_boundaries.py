"""Issue 37, findings 6 and 7, against a real `local up` (the shared one: a multi-model realtime endpoint and its
router, an async endpoint on SageMaker, Lambda functions, a Fargate task's schedule, transform jobs):

- every child of local up holds one identity's keys in its environment at most: its own role's (an endpoint's
  router, SageMaker's side of local mode, the developer's), never another's, never the developer's otherwise;
- every control route of every local server, sent unsigned, is a 403 an SDK reads: local up's own routes on its
  AWS API port, each router's admin routes on its control port, moto's admin API on the emulator (also as a
  virtual-hosted bucket);
- no answer of any of them, nor of a path that tries to reach the project's files, holds a role's key; the state
  file that holds them all is the developer's alone (mode 0600).
"""

from __future__ import annotations

import re
import stat
from pathlib import Path
from typing import Any

import httpx
import pytest

from servestack.local.sagemaker.router_admin import ADMIN_ROUTES
from servestack.local.sagemaker.router_http import ADMIN
from servestack.local.up.aws_front import CONTROL_ROUTES
from tests.e2e.conftest import LocalUp

pytestmark = pytest.mark.slow
ROUTER_MODULE = "servestack.local.sagemaker.endpoint"


@pytest.fixture(scope="module")
def up(shared_up: LocalUp) -> LocalUp:
    return shared_up


def descendants(root: int) -> list[int]:
    """Every process under `root`, from /proc (Linux)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry.name)] = int(fields[1])
    found, frontier = [], [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent]
        found += children
        frontier += children
    return found


def environment_of(pid: int) -> tuple[dict[str, str], str] | None:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:  # it exited meanwhile
        return None
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {key.decode(errors="replace"): value.decode(errors="replace") for key, value in pairs}, command


SECRET_NAMES = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def held(env: dict[str, str], secret: str | None) -> bool:
    if not secret:
        return False
    if len(secret) < 16:
        return secret in env.values()
    return any(secret in value for value in env.values())


def identities(up: LocalUp) -> dict[str, dict[str, str]]:
    """Every identity the state file holds, by name: each role's keys and the developer's."""
    state = up.state
    return {**state["identities"], "developer": state["developer"]}


def test_each_child_holds_only_its_own_roles_keys(up: LocalUp) -> None:
    known = identities(up)
    by_key = {keys["AWS_ACCESS_KEY_ID"]: name for name, keys in known.items()}
    checked = 0
    for pid in descendants(up.process.pid):
        found = environment_of(pid)
        if found is None:
            continue
        env, command = found
        # WHICH identities' secrets appear in its environment (a short one, the developer's documented `local`, only
        # as a whole value: it is a word of paths and module names too)
        holding = {name for name, keys in known.items() if any(held(env, keys.get(k)) for k in SECRET_NAMES)}
        # THEN one at most, and the one its key id names
        assert len(holding) <= 1, (command, sorted(holding))
        if "AWS_ACCESS_KEY_ID" in env:
            assert holding == {by_key.get(env["AWS_ACCESS_KEY_ID"], "?")}, (command, env["AWS_ACCESS_KEY_ID"], holding)
        # AND the developer's only in a router (SageMaker's side), no role's key there
        if ROUTER_MODULE in command:
            assert holding == {"developer"}, (command, holding)
        else:
            assert "developer" not in holding, command
        checked += 1
    assert checked >= 3, "local up's children were not found"


def assert_refused(answer: httpx.Response, what: str) -> None:
    assert answer.status_code == 403, (what, answer.status_code, answer.text[:300])
    assert answer.headers.get("x-amzn-errortype") or "AccessDenied" in answer.text, (what, answer.text[:300])


def concrete(path: str) -> str:
    return re.sub(r"\{[a-z]+\}", "x", path)


def role_secrets(up: LocalUp) -> list[str]:
    return [
        value
        for keys in up.state["identities"].values()
        for name, value in keys.items()
        if name in ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
    ]


def test_every_control_route_refuses_an_unsigned_request_and_no_answer_holds_a_key(up: LocalUp) -> None:
    answers: list[tuple[str, httpx.Response]] = []

    def send(method: str, url: str, **options: Any) -> httpx.Response:
        answer = httpx.request(method, url, timeout=30, **options)
        answers.append((f"{method} {url}", answer))
        return answer

    # local up's own routes
    for method, path in CONTROL_ROUTES:
        assert_refused(send(method, f"{up.api}{concrete(path)}", json={}), path)
    # each router's admin routes on its control port (the rehearsal with error_rate 1 of issue 37 among them)
    routers = [d["control_url"] for d in up.state["deployments"].values() if d.get("control_url")]
    assert routers, up.state["deployments"]
    for control_url in routers:
        for method, route in ADMIN_ROUTES:
            body = {"version": "1", "faults": {"error_rate": 1}} if route == "deploy" else {"copies": 0}
            assert_refused(send(method, f"{control_url}{ADMIN}{concrete(route)}", json=body), route)
    # moto's admin API, by path and as a virtual-hosted bucket
    emulator = up.state["endpoint_url"]
    port = emulator.rsplit(":", 1)[1]
    for path, host in [("/moto-api/data.json", None), ("/data.json", f"moto-api.localhost:{port}")]:
        headers = {"Host": host} if host else {}
        answer = send("GET", f"{emulator}{path}", headers=headers)
        assert answer.status_code == 403, (path, answer.text[:300])
    # paths that try the project's files, on every server
    for base in (up.api, emulator, *routers):
        for path in (
            "/../.servestack/local.json",
            "/%2e%2e/%2e%2e/.servestack/local.json",
            "/_servestack/../local.json",
        ):
            send("GET", f"{base}{path}")
    # THEN no answer holds a role's key
    secrets = role_secrets(up)
    assert secrets
    for what, answer in answers:
        assert not any(secret in answer.text for secret in secrets), what


def test_the_state_file_is_the_developers_alone(up: LocalUp) -> None:
    mode = stat.S_IMODE(up.state_path.stat().st_mode)
    assert mode == 0o600, oct(mode)
