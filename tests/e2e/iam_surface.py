"""The IAM surface of the four modes' templates as the running `local up` holds it, one statement at a time:
what the mutation test (tests/e2e/test_iam_surface.py) removes, the exercises that must fail without it, and
the list of statements no local run can exercise (tests/e2e/iam_unexercised.txt)."""

from __future__ import annotations

import datetime
import json
import random
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servestack.local.emulator.callers import signed
from servestack.local.iam.identities import DEVELOPER
from servestack.local.iam.roles_route import ROUTE
from servestack.local.scheduler.api import FIRE_PREFIX, FIRE_SUFFIX
from servestack.local.stack.bucket_notifications import ROUTE_PREFIX, ROUTE_SUFFIX
from tests.conftest import ARTIFACTS, REPO_ROOT
from tests.control import control
from tests.e2e.conftest import SERVESTACK, LocalUp

UNEXERCISED = Path(__file__).with_name("iam_unexercised.txt")
FULL_ENV = "SERVESTACK_IAM_MUTATION"  # "full": every statement; else a sample
SAMPLE_SIZE = 2


@dataclass(frozen=True, eq=False)  # each statement is itself (its body is a dict): keyed by identity
class Statement:
    """One Allow statement of one role: where it sits in the store, and how a reader finds it in a template."""

    role: str  # the role's physical name
    policy: str
    index: int
    body: dict[str, Any]

    @property
    def actions(self) -> tuple[str, ...]:
        raw = self.body.get("Action", [])
        return tuple(sorted(raw if isinstance(raw, list) else [raw]))

    @property
    def label(self) -> str:
        resources = self.body.get("Resource", [])
        shown = resources if isinstance(resources, list) else [resources]
        return f"{self.role} {','.join(self.actions)} on {' '.join(str(r) for r in shown)}"


def store(up: LocalUp, method: str = "GET", role: str = "", policies: dict[str, Any] | None = None) -> Any:
    url = f"{up.api}{ROUTE}" + (f"/{role}" if role else "")
    body = json.dumps({"policies": policies}).encode() if policies is not None else b""
    status, answer = signed(method, url, DEVELOPER, "us-east-1", body=body, service="iam")
    assert status == 200, answer[:500]
    return json.loads(answer)


def statements(roles: dict[str, Any]) -> list[Statement]:
    found = []
    for role, about in sorted(roles.items()):
        for policy, document in sorted(about["policies"].items()):
            listed = document.get("Statement", [])
            for index, body in enumerate(listed if isinstance(listed, list) else [listed]):
                if body.get("Effect") == "Allow":
                    found.append(Statement(role, policy, index, body))
    return found


def without(roles: dict[str, Any], statement: Statement) -> dict[str, Any]:
    """The role's documents without the statement; a document left with none goes too (IAM holds no empty
    policy: removing its only statement from a template removes the policy)."""
    policies = json.loads(json.dumps(roles[statement.role]["policies"]))
    listed = policies[statement.policy]["Statement"]
    if isinstance(listed, list) and len(listed) > 1:
        del listed[statement.index]
    else:
        del policies[statement.policy]
    return dict(policies)


@dataclass(frozen=True)
class Unexercised:
    role_fragment: str
    actions: tuple[str, ...]
    resource_fragment: str  # "" when the role and the actions say which statement it is
    reason: str

    def covers(self, statement: Statement) -> bool:
        resources = json.dumps(statement.body.get("Resource"))
        return (
            self.role_fragment in statement.role
            and self.actions == statement.actions
            and self.resource_fragment in resources
        )


def unexercised() -> list[Unexercised]:
    """`<role name fragment> <action>[,<action>...] [<resource fragment>] -- <reason>` per line; `#` starts a
    comment."""
    listed = []
    for line in UNEXERCISED.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        head, _, reason = line.partition(" -- ")
        fragment, actions, *resource = head.split()
        assert reason.strip(), f"{UNEXERCISED.name}: {line!r} gives no reason"
        assert len(resource) <= 1, f"{UNEXERCISED.name}: {line!r}: one resource fragment at most"
        listed.append(Unexercised(fragment, tuple(sorted(actions.split(","))), "".join(resource), reason.strip()))
    return listed


def sample(candidates: list[Statement]) -> list[Statement]:
    """A few statements, the same all day (UTC) and different the next: a failure reproduces on the day it
    happened, and a week's runs cover the surface."""
    seed = datetime.datetime.now(datetime.UTC).date().isoformat()
    chooser = random.Random(seed)  # noqa: S311 - a reproducible sample, not a secret
    return chooser.sample(candidates, min(SAMPLE_SIZE, len(candidates)))


# ------------------------------------------------------------------------------------------ exercises


def cli(*argv: str, timeout_sec: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SERVESTACK, *argv], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=timeout_sec, check=False)  # fmt: skip


def _ok(result: subprocess.CompletedProcess[str]) -> str | None:
    return None if result.returncode == 0 else (result.stdout + result.stderr)[-600:]


def realtime(up: LocalUp, name: str, scratch: Path) -> str | None:
    """An invocation, and a redeploy: a blue/green rehearsal of the live version, whose green fleet starts as
    AWS starts a variant (its image pulled and its model data downloaded with the execution role, its
    container's start lines written to the endpoint's log group with that role); a start refused fails it."""
    sample_file = ARTIFACTS / "digits/1/sample-request.json"
    failed = _ok(cli("invoke", name, "--data", str(sample_file), "--state", str(up.state_path)))
    if failed is not None:
        return failed
    metrics = control("GET", f"{up.deployment(name)['control_url']}/_servestack/metrics").json()
    live = next(v["model"] for v in metrics["variants"].values() if v["weight"] > 0).split("@")[1]
    outcome = scratch / f"deploy-{name}.json"
    outcome.unlink(missing_ok=True)  # an earlier exercise's
    # No traffic during the rehearsal: its alarms (p99 latency) would judge this machine's load, not a grant.
    failed = _ok(cli("local", "deploy", name, "--version", live, "--interval-sec", "0.1", "--bake-sec", "0",
                     "--period-sec", "1", "--evaluation-periods", "1", "--traffic-rps", "0",
                     "--state", str(up.state_path), "--output", str(outcome)))  # fmt: skip
    if failed is not None and outcome.is_file():  # the rehearsal's own account last: why green did not start
        last = json.loads(outcome.read_text())["timeline"][-1]
        failed += f"\n{last['event']}: {last.get('reason', '')}"
    return failed


def serverless(up: LocalUp, name: str, scratch: Path) -> str | None:
    """An invocation through the HTTP API, and a release through CodeDeploy (the hook, the shift)."""
    sample_file = ARTIFACTS / "digits/1/sample-request.json"
    failed = _ok(cli("invoke", name, "--data", str(sample_file), "--state", str(up.state_path)))
    if failed is not None:
        return failed
    return release(up, name, scratch)


def release(up: LocalUp, name: str, scratch: Path) -> str | None:
    outcome = scratch / f"deploy-{name}.json"
    return _ok(cli("local", "deploy", name, "--version", "1", "--interval-sec", "0.2", "--state",
                   str(up.state_path), "--output", str(outcome)))  # fmt: skip


def stack_update(up: LocalUp, name: str) -> str | None:
    """The deployment's stack updated: CloudFormation runs its bucket-notification handler again, which puts the
    bucket's notification configuration as the handler's role (servestack/local/stack/bucket_notifications.py)."""
    stack = next(stack for stack, about in up.state["stacks"].items() if about["deployment"] == name)
    status, answer = signed("POST", f"{up.api}{ROUTE_PREFIX}{stack}{ROUTE_SUFFIX}", DEVELOPER, "us-east-1",
                            service="cloudformation")  # fmt: skip
    return None if status == 200 else f"stack update of {stack}: {status} {answer[:1200]!r}"


def asynchronous(up: LocalUp, name: str, scratch: Path) -> str | None:
    """The stack's update re-applies the bucket's notification configuration; then a good job answers, inline
    and past the API's inline limit (256 KiB: the upload route, whose upload reaches the job queue through that
    notification and whose request the worker reads from S3); a job the model refuses ends `failed` with its
    message in the dead-letter queue."""
    failed = stack_update(up, name)
    if failed is not None:
        return failed
    good = ARTIFACTS / "breast-cancer/1/sample-request.json"
    rows = json.loads(good.read_text())["instances"]
    large = scratch / "large.json"
    large.write_text(json.dumps({"instances": rows * (300 * 1024 // len(json.dumps(rows)) + 1)}))
    for request in (good, large):
        failed = _ok(cli("invoke", name, "--data", str(request), "--state", str(up.state_path), "--timeout-sec", "30"))
        if failed is not None:
            return failed
    queues = up.deployment(name)["queues"]
    dead_letters = next(url for logical_id, url in queues.items() if "DeadLetter" in logical_id)
    sqs = up.emulator("sqs")
    before = _messages(sqs, dead_letters)
    bad = scratch / "bad.json"
    bad.write_text(json.dumps({"instances": [[1.0, 2.0]]}))
    cli("invoke", name, "--data", str(bad), "--state", str(up.state_path), "--timeout-sec", "30")
    deadline = time.monotonic() + 30
    while _messages(sqs, dead_letters) <= before:
        if time.monotonic() > deadline:
            return "the refused job's message never reached the dead-letter queue"
        time.sleep(0.3)
    return None


def _messages(sqs: Any, url: str) -> int:
    attributes = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(attributes["ApproximateNumberOfMessagesNotVisible"])


def batch(up: LocalUp, name: str) -> str | None:
    for _ in range(2):  # the second run reads back and reuses the first one's parts: that needs its grants too
        failed = _ok(cli("local", "run-batch", name, "--state", str(up.state_path)))
        if failed is not None:
            return failed
    return scheduled_failure_is_dead_lettered(up, name)


def scheduled_failure_is_dead_lettered(up: LocalUp, name: str, wait_sec: float = 30) -> str | None:
    """The schedule fired while its role may not invoke the target (the exercise takes its role's
    lambda:InvokeFunction away for that run: a refused invocation is what Scheduler's dead-letter queue
    catches): past its retry policy, the schedule sends the event to its dead-letter queue as its role
    (within `wait_sec`)."""
    entry = up.deployment(name)
    role = str(entry["schedule_role"]).rsplit("/", 1)[-1]
    dead_letters = next(url for logical_id, url in entry["queues"].items() if "DeadLetter" in logical_id)
    sqs = up.emulator("sqs")
    before = _messages(sqs, dead_letters)
    held = store(up)["roles"][role]["policies"]  # as the running store holds them now (a mutation may be in)
    store(up, "PUT", role, _without_action(held, "lambda:InvokeFunction"))
    try:
        url = f"{up.api}{FIRE_PREFIX}{entry['schedule_name']}{FIRE_SUFFIX}"
        status, answer = signed("POST", url, DEVELOPER, "us-east-1", service="sagemaker", timeout_sec=120)
    finally:
        store(up, "PUT", role, held)
    if status != 200 or json.loads(answer) != {"invoked": False}:
        return f"firing {entry['schedule_name']} without its invoke statement: {status} {answer[:300]!r}"
    deadline = time.monotonic() + wait_sec
    while _messages(sqs, dead_letters) <= before:
        if time.monotonic() > deadline:
            return "the schedule's refused invocation never reached its dead-letter queue"
        time.sleep(0.3)
    return None


def _without_action(policies: dict[str, Any], action: str) -> dict[str, Any]:
    """The documents without any Allow statement naming `action` (a document left empty goes too)."""
    kept: dict[str, Any] = {}
    for name, document in policies.items():
        listed = document.get("Statement", [])
        listed = listed if isinstance(listed, list) else [listed]
        remaining = [
            s for s in listed if action not in (s["Action"] if isinstance(s["Action"], list) else [s["Action"]])
        ]
        if remaining:
            kept[name] = {**document, "Statement": remaining}
    return kept


def log_groups(up: LocalUp, deployment: str) -> list[str]:
    """The deployment's functions' log groups on the emulator (named after its stack), and its endpoint's
    (`/aws/sagemaker/Endpoints/...`): the realtime exercise starts a container, which writes lines at start."""
    stack = next(name for name, about in up.state["stacks"].items() if about["deployment"] == deployment)
    pages = up.emulator("logs").get_paginator("describe_log_groups").paginate()
    names = [g["logGroupName"] for page in pages for g in page["logGroups"]]
    about = up.deployment(deployment)
    groups = about.get("log_groups", {}).values() if about["mode"] == "realtime" else ()
    endpoints = [g for g in groups if g.startswith("/aws/sagemaker/")]
    return sorted({name for name in names if stack in name and not name.startswith("/aws/sagemaker/")} | set(endpoints))


def logged_since(
    up: LocalUp, groups: list[str], start_ms: int, wait_sec: float = 20, expected: set[str] | None = None
) -> set[str]:
    """The groups that received a log event since `start_ms`, waiting up to `wait_sec` for them (the shippers
    batch) or, with `expected`, only until those have."""
    logs = up.emulator("logs")
    deadline = time.monotonic() + wait_sec
    while True:
        fresh = {g for g in groups if logs.filter_log_events(logGroupName=g, startTime=start_ms).get("events")}
        if fresh == set(groups) or (expected is not None and expected <= fresh) or time.monotonic() > deadline:
            return fresh
        time.sleep(0.5)


Exercise = Callable[[LocalUp, str, Path], "str | None"]
EXERCISES: dict[str, Exercise] = {
    "realtime": realtime,
    "serverless": serverless,
    "async": asynchronous,
    "batch": lambda up, name, _: batch(up, name),
}
