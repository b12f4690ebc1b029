"""The AWS services local up plays around the functions and containers: HTTP API route matching, the
Lambda service's names and qualifiers, schedules (retries, DLQ, the role's permission), the supervisor's
restarts, the synth cache, and the paths that map the cloud's to this machine's."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from servestack.local.apigateway.definitions import RouteDef
from servestack.local.apigateway.http_api import CompiledRoute, lambda_response
from servestack.local.cloudformation.synth import inputs_digest
from servestack.local.lambda_.definitions import FunctionDef
from servestack.local.lambda_.service import HostedFunction, LambdaService
from servestack.local.scheduler.definitions import ScheduleDef
from servestack.local.scheduler.schedules import ScheduleRunner
from servestack.local.up.children import Child, Supervisor
from servestack.local.up.environment import map_paths
from tests.waiting import wait_for

# ------------------------------------------------------------------------------------------ HTTP API


def route(key: str) -> CompiledRoute:
    return CompiledRoute.of(RouteDef(key, "AWS_IAM", "fn", None, 29000, "2.0"))


def pick(keys: list[str], method: str, path: str) -> str | None:
    routes = sorted((route(k) for k in keys), key=lambda c: c.rank)
    found = next((c for c in routes if c.matches(method, path)), None)
    return found.route.route_key if found else None


def test_the_most_specific_route_wins_as_api_gateway_picks_it() -> None:
    keys = ["$default", "ANY /jobs/{proxy+}", "GET /jobs/{id}", "GET /jobs/stats", "POST /jobs"]
    assert pick(keys, "GET", "/jobs/stats") == "GET /jobs/stats"
    assert pick(keys, "GET", "/jobs/42") == "GET /jobs/{id}"
    assert pick(keys, "DELETE", "/jobs/42/x") == "ANY /jobs/{proxy+}"
    assert pick(keys, "POST", "/jobs") == "POST /jobs"
    assert pick(keys, "PUT", "/elsewhere") == "$default"
    assert pick(["POST /jobs"], "GET", "/jobs") is None


def test_lambda_proxy_responses_become_http_as_api_gateway_makes_them() -> None:
    plain = lambda_response({"statusCode": 201, "headers": {"x-a": "1"}, "body": "hi", "cookies": ["a=b"]})
    assert (plain.status, plain.body, plain.headers["x-a"], plain.headers["Set-Cookie"]) == (201, b"hi", "1", "a=b")
    binary = lambda_response({"statusCode": 200, "body": "aGk=", "isBase64Encoded": True})
    assert binary.body == b"hi"
    shorthand = lambda_response({"answer": 42})  # payload 2.0: a value without statusCode is the JSON body
    assert (shorthand.status, json.loads(shorthand.body)) == (200, {"answer": 42})


# ------------------------------------------------------------------------------------------ Lambda service


def function(name: str = "svc-Fn-ABC", *, aliases: tuple[str, ...] = ("live",), reserved: int | None = None) -> Any:
    definition = FunctionDef("Fn", name, f"arn:aws:lambda:us-east-1:123456789012:function:{name}", "h.handler",
                             {}, 3, 128, reserved, "Role", aliases)  # fmt: skip
    return HostedFunction(definition, "http://127.0.0.1:1", versioned=True)


@pytest.mark.parametrize(
    ("raw", "qualifier", "found"),
    [
        ("svc-Fn-ABC", None, True),
        ("svc-Fn-ABC:live", None, True),
        ("svc-Fn-ABC", "$LATEST", True),
        ("svc-Fn-ABC", "1", True),
        ("arn:aws:lambda:us-east-1:123456789012:function:svc-Fn-ABC:live", None, True),
        ("123456789012:function:svc-Fn-ABC", None, True),
        ("svc-Fn-ABC", "2", False),
        ("svc-Fn-ABC:blue", None, False),
        ("other", None, False),
    ],
)
def test_functions_are_found_by_the_templates_names_aliases_and_versions(
    raw: str, qualifier: str | None, found: bool
) -> None:
    service = LambdaService([function()])
    result = service.find(raw, qualifier)
    service.close()
    assert (not hasattr(result, "status")) == found
    if not found:
        assert result.status == 404  # type: ignore[union-attr]


def test_a_qualifier_conflict_and_reserved_concurrency_zero_are_refused_as_lambda_does() -> None:
    service = LambdaService([function(reserved=0)])
    conflict = service.find("svc-Fn-ABC:live", "1")
    assert conflict.status == 400  # type: ignore[union-attr]
    throttled = service.invoke("svc-Fn-ABC", b"{}")
    assert throttled.status == 429
    assert throttled.headers["x-amzn-ErrorType"] == "TooManyRequestsException"
    service.close()


def test_an_asynchronous_invocation_is_accepted_at_once_and_its_failure_counted_by_the_service() -> None:
    import threading

    failed: list[str] = []
    counted = threading.Event()

    def on_failure(name: str) -> None:
        failed.append(name)
        counted.set()

    # GIVEN a function whose execution environment does not answer (port 1)
    service = LambdaService([function()], on_failure=on_failure)
    event = {"x-amz-invocation-type": "Event"}
    # WHEN an event is not JSON, or over 1 MB THEN Lambda refuses it at once, and nothing runs
    bad = service.invoke("svc-Fn-ABC", b"{not json", headers=event)
    assert (bad.status, bad.headers["x-amzn-ErrorType"]) == (400, "InvalidRequestContentException")
    large = service.invoke("svc-Fn-ABC", b'"' + b"x" * (1024 * 1024) + b'"', headers=event)
    assert (large.status, large.headers["x-amzn-ErrorType"]) == (413, "RequestTooLargeException")
    # WHEN a good event comes THEN it is accepted (202), and its failure in the background is the function's Errors
    accepted = service.invoke("svc-Fn-ABC", b'{"run": 1}', headers=event)
    assert (accepted.status, accepted.body) == (202, b"")
    assert counted.wait(30)
    assert failed == ["svc-Fn-ABC"]
    service.close()


# ------------------------------------------------------------------------------------------ schedules


class FakeLambdas:
    """Answers invocations with the statuses it is given, recording what it was asked."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = statuses
        self.calls: list[tuple[str, bytes, dict[str, str]]] = []

    def invoke(self, raw: str, payload: bytes, *, headers: dict[str, str] | None = None, **_: Any) -> Any:
        from servestack.local.lambda_.service import Invocation

        self.calls.append((raw, payload, headers or {}))
        return Invocation(self.statuses.pop(0), {}, b"boom")


def schedule(attempts: int = 2) -> ScheduleDef:
    return ScheduleDef("S", "sched", "rate(1 day)", "UTC", True, "arn:aws:lambda:::function:f", "arn:role/r",
                       '{"run": 1}', attempts, 3600, "arn:aws:sqs:us-east-1:1:dlq")  # fmt: skip


def test_a_schedule_invokes_its_target_asynchronously_with_its_input() -> None:
    lambdas = FakeLambdas([202])
    runner = ScheduleRunner(schedule(), lambdas, lambda *_: None, backoff_sec=0)  # type: ignore[arg-type]
    assert runner.fire() is True
    ((target, payload, headers),) = lambdas.calls
    assert (target, json.loads(payload), headers["x-amz-invocation-type"]) == ("arn:aws:lambda:::function:f",
                                                                                {"run": 1}, "Event")  # fmt: skip


def test_failed_invocations_are_retried_then_dead_lettered_with_schedulers_attributes() -> None:
    lambdas = FakeLambdas([500, 500, 500])
    dead: list[tuple[str, str, dict[str, Any]]] = []
    runner = ScheduleRunner(schedule(2), lambdas, lambda *_: None, lambda *a: dead.append(a), backoff_sec=0)  # type: ignore[arg-type]
    assert runner.fire() is False
    assert len(lambdas.calls) == 3  # the first attempt and two retries
    ((queue, body, attributes),) = dead
    assert queue == "arn:aws:sqs:us-east-1:1:dlq"
    assert json.loads(body) == {"run": 1}
    assert attributes["X-Amz-Scheduler-Attempt"] == "3"


def test_a_role_that_may_not_invoke_never_reaches_the_function() -> None:
    lambdas = FakeLambdas([])
    dead: list[Any] = []
    denied = "User: ... is not authorized to perform: lambda:InvokeFunction"
    runner = ScheduleRunner(schedule(0), lambdas, lambda *_: denied, lambda *a: dead.append(a), backoff_sec=0)  # type: ignore[arg-type]
    assert runner.fire() is False
    assert lambdas.calls == []
    assert dead[0][2]["X-Amz-Scheduler-Error-Code"] == "AccessDeniedException"


def transform_schedule(attempts: int) -> ScheduleDef:
    """An engine: transform schedule: Scheduler's universal CreateTransformJob target, with the job as input."""
    return ScheduleDef("T", "nightly", "rate(1 day)", "UTC", True,
                       "arn:aws:scheduler:::aws-sdk:sagemaker:createTransformJob", "arn:role/scheduler",
                       '{"TransformJobName": "nightly-<aws.scheduler.execution-id>"}', attempts, 3600,
                       "arn:aws:sqs:us-east-1:1:dlq", universal="sagemaker:createTransformJob")  # fmt: skip


def test_a_transform_schedule_makes_its_sdk_call_instead_of_invoking_a_function() -> None:
    # GIVEN a universal CreateTransformJob target whose call SageMaker accepts
    lambdas = FakeLambdas([])
    started: list[str] = []
    runner = ScheduleRunner(transform_schedule(2), lambdas, lambda *_: None,  # type: ignore[arg-type]
                            start_job=lambda s: started.append(s.name) or None, backoff_sec=0)  # fmt: skip
    # WHEN it fires THEN the job is started once, and no function is invoked
    assert runner.fire() is True
    assert started == ["nightly"]
    assert lambdas.calls == []


def test_a_refused_create_transform_job_is_retried_then_dead_lettered() -> None:
    # GIVEN a schedule role that may not create the job (the call answers AccessDeniedException each time)
    refusals: list[str] = []

    def refused(_: ScheduleDef) -> str:
        refusals.append("x")
        return "AccessDeniedException: User: ... is not authorized to perform: sagemaker:CreateTransformJob"

    dead: list[tuple[str, str, dict[str, Any]]] = []
    runner = ScheduleRunner(transform_schedule(2), FakeLambdas([]), lambda *_: None,  # type: ignore[arg-type]
                            lambda *a: dead.append(a), start_job=refused, backoff_sec=0)  # fmt: skip
    # WHEN it fires THEN the call is tried 3 times (the retry policy's 2 retries), then the input goes to the DLQ
    assert runner.fire() is False
    assert len(refusals) == 3
    ((queue, body, attributes),) = dead
    assert queue == "arn:aws:sqs:us-east-1:1:dlq"
    assert json.loads(body) == {"TransformJobName": "nightly-<aws.scheduler.execution-id>"}
    assert attributes["X-Amz-Scheduler-Error-Code"] == "AccessDeniedException"
    assert "sagemaker:CreateTransformJob" in attributes["X-Amz-Scheduler-Error-Message"]


# ------------------------------------------------------------------------------------------ supervisor


def ticked(supervisor: Supervisor, lines: list[str]) -> str | None:
    """The supervisor's last line after one more of its ticks (local up ticks every 0.5 s)."""
    supervisor.tick()
    return lines[-1] if lines else None


def test_a_dead_child_is_restarted_with_backoff_and_others_are_left_alone(tmp_path: Path) -> None:
    # GIVEN two children, one that dies at once
    dies = Child("dies", [sys.executable, "-c", "raise SystemExit(3)"], {}, "http://127.0.0.1:9/")
    lives = Child("lives", [sys.executable, "-c", "import time; time.sleep(30)"], {}, "http://127.0.0.1:9/")
    lines: list[str] = []
    supervisor = Supervisor([dies, lives], lines.append)
    for child in (dies, lives):
        child.start()
    first_lives = lives.process.pid
    try:
        dies.process.wait(timeout=10)
        # WHEN the supervisor notices THEN it schedules a restart (1 s), then restarts it once that time has passed
        noticed = time.monotonic()
        supervisor.tick()
        assert lines == ["dies: exited with code 3; restarting in 1s"]
        wait_for(lambda: ticked(supervisor, lines) == "dies: restarting (restart 1)", "the restart")
        assert time.monotonic() - noticed >= 1.0
        dies.process.wait(timeout=10)
        supervisor.tick()
        assert lines[-1] == "dies: exited with code 3; restarting in 2s"  # backoff doubles
        # AND the healthy child was never touched
        assert lives.process.pid == first_lives
        assert lives.process.poll() is None
    finally:
        for child in (dies, lives):
            child.stop(grace_sec=1)


# ------------------------------------------------------------------------------------------ synth and paths


def test_the_synth_cache_key_changes_with_any_input(tmp_path: Path) -> None:
    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "batch.py").write_text("grant = 1\n")
    (tmp_path / "app.py").write_text("print()\n")
    spec = tmp_path / "serving.yaml"
    spec.write_text("models: []\n")
    first = inputs_digest(tmp_path, spec)
    assert first == inputs_digest(tmp_path, spec)
    (tmp_path / "stacks" / "batch.py").write_text("grant = 2\n")
    assert inputs_digest(tmp_path, spec) != first


def test_cloud_paths_map_to_their_local_stand_ins() -> None:
    mapped = map_paths(
        {"A": "/var/task/models/artifacts", "B": "/opt/ml/model", "C": "/var/taskforce", "D": "x"},
        {"/var/task": "/src", "/opt/ml/model": "/data/m"},
    )
    assert mapped == {"A": "/src/models/artifacts", "B": "/data/m", "C": "/var/taskforce", "D": "x"}


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_child_whose_master_is_killed_leaves_no_orphan_and_its_restart_is_counted(tmp_path: Path) -> None:
    # GIVEN a child that forks a worker (as granian's master does), in its own process group
    pid_file = tmp_path / "worker.pid"
    forks = (
        "import subprocess, sys, time, pathlib; "
        "worker = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"pathlib.Path({str(pid_file)!r}).write_text(str(worker.pid)); time.sleep(60)"
    )
    master = Child("master", [sys.executable, "-c", forks], {}, "http://127.0.0.1:9/")
    restarts: list[dict[str, int]] = []
    supervisor = Supervisor([master], lambda line: None, lambda: restarts.append(dict(supervisor.restarts)))
    master.start()
    try:
        wait_for(lambda: pid_file.exists() and pid_file.read_text(), "the worker to start")
        worker = int(pid_file.read_text())
        assert os.getpgid(worker) == master.process.pid
        # WHEN only the master is SIGKILLed
        os.kill(master.process.pid, signal.SIGKILL)
        master.process.wait(timeout=10)
        supervisor.tick()
        # THEN its orphaned worker is killed with its group, and the restart is counted once it happens (after
        # the 1 s backoff)
        wait_for(lambda: not _alive(worker), "the orphaned worker to be killed")

        def restarted() -> list[dict[str, int]]:
            supervisor.tick()
            return restarts

        wait_for(restarted, "the restart")
        assert restarts == [{"master": 1}]
    finally:
        master.stop(grace_sec=1)


def test_the_fire_route_fires_a_running_schedule_now_and_refuses_what_it_cannot_fire() -> None:
    from dataclasses import replace

    from servestack.local.hosting.http_server import Request
    from servestack.local.scheduler.api import SchedulerApi

    # GIVEN a running schedule whose invocations fail (then dead-lettered), and a disabled one
    dead: list[tuple[str, str, dict[str, Any]]] = []
    failing = ScheduleRunner(schedule(1), FakeLambdas([500, 500]), lambda *_: None, lambda *a: dead.append(a),
                             backoff_sec=0)  # type: ignore[arg-type]  # fmt: skip
    off = replace(schedule(), name="off", enabled=False)
    api = SchedulerApi([schedule(), off], "us-east-1", "123456789012")
    api.runners = {"sched": failing, "off": ScheduleRunner(off, FakeLambdas([]), lambda *_: None)}  # type: ignore[arg-type]

    def post(path: str, method: str = "POST") -> tuple[int, Any]:
        reply = api.fire(Request(method, path, {}, {}, b""))
        return reply.status, json.loads(reply.body)

    # WHEN each is fired THEN the running one fired now, past its retry policy into its dead-letter queue
    assert post("/_servestack/schedules/sched/fire") == (200, {"invoked": False})
    assert [queue for queue, _, _ in dead] == ["arn:aws:sqs:us-east-1:1:dlq"]
    # AND an unknown, a disabled schedule and another method are refused, naming what is allowed
    status, body = post("/_servestack/schedules/nightly/fire")
    assert (status, body["Message"]) == (404, "name: 'nightly' is not a running schedule (off, sched)")
    status, body = post("/_servestack/schedules/off/fire")
    assert (status, body["Message"]) == (409, "name: 'off' is DISABLED; an enabled schedule fires")
    status, body = post("/_servestack/schedules/sched/fire", method="GET")
    assert (status, body["Message"]) == (405, "method: 'GET' is not allowed; POST")


def test_a_schedule_in_its_own_group_answers_get_schedule_there_and_names_it_in_its_dead_letters() -> None:
    from dataclasses import replace

    from servestack.local.hosting.http_server import Request
    from servestack.local.scheduler.api import SchedulerApi

    # GIVEN a schedule in a group of its own (a batch deployment's, servestack/cdk/batch.py)
    grouped = replace(schedule(0), group="servestack-scores")
    api = SchedulerApi([grouped], "us-east-1", "123456789012")

    def get(query: dict[str, str]) -> tuple[int, Any]:
        reply = api.handle(Request("GET", "/schedules/sched", query, {}, b""))
        return reply.status, json.loads(reply.body)

    # WHEN GetSchedule names its group THEN it answers with the schedule's ARN in that group
    status, body = get({"groupName": "servestack-scores"})
    assert status == 200
    assert body["Arn"] == "arn:aws:scheduler:us-east-1:123456789012:schedule/servestack-scores/sched"
    assert body["GroupName"] == "servestack-scores"
    # AND in the default group there is no such schedule, as in AWS
    status, body = get({})
    assert (status, body["Message"]) == (404, "Schedule sched does not exist.")
    # WHEN its invocation ends in its dead-letter queue THEN the message names the schedule in its group
    dead: list[tuple[str, str, dict[str, Any]]] = []
    runner = ScheduleRunner(grouped, FakeLambdas([500]), lambda *_: None, lambda *a: dead.append(a), backoff_sec=0)  # type: ignore[arg-type]
    assert runner.fire() is False
    assert dead[0][2]["X-Amz-Scheduler-Schedule-Arn"] == "schedule/servestack-scores/sched"


def test_local_modes_step_before_each_run_comes_first_and_its_failure_never_stops_the_run() -> None:
    # GIVEN a schedule whose step before each run (the seeded sample's retirement) fails once
    steps: list[str] = []

    def before_run(s: ScheduleDef) -> None:
        steps.append(s.name)
        if len(steps) == 1:
            raise RuntimeError("the emulator did not answer")

    lambdas = FakeLambdas([202, 202])
    runner = ScheduleRunner(schedule(), lambdas, lambda *_: None, before_run=before_run, backoff_sec=0)  # type: ignore[arg-type]
    # WHEN it fires twice THEN the step ran before each run, and each run invoked its target all the same
    assert runner.fire() is True
    assert runner.fire() is True
    assert steps == ["sched", "sched"]
    assert len(lambdas.calls) == 2
