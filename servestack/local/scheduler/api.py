"""EventBridge Scheduler's read API on local up's AWS API port: `GetSchedule` (`GET /schedules/{Name}`) of the
templates' schedules, as the local scheduler runs them (servestack/local/scheduler/schedules.py). What the pipeline's
smoke test asks of a batch deployment (`scheduler:GetSchedule`, authorized on the schedule's ARN before this
answers). Schedules are the templates': nothing creates or changes them here.

`POST /_servestack/schedules/{Name}/fire` is local up's own route (AWS has no "run now"; signed by the
developer, refused otherwise): the schedule fires at once, as at its next time, through the local scheduler's
runner (its role's invocation, the retry policy, the dead-letter queue), and the answer says whether the
target was invoked. Local up registers each running schedule's runner in `runners`."""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

from servestack.local.hosting import Reply, Request
from servestack.local.scheduler.definitions import ScheduleDef

PREFIX = "/schedules/"
FIRE_PREFIX = "/_servestack/schedules/"
FIRE_SUFFIX = "/fire"


def _error(status: int, code: str, message: str) -> Reply:
    headers = {"Content-Type": "application/json", "x-amzn-ErrorType": code}
    return Reply(status, headers, json.dumps({"Message": message}).encode())


class SchedulerApi:
    CONTROL_ROUTES = (
        ("POST", f"{FIRE_PREFIX}{{schedule}}{FIRE_SUFFIX}"),
    )  # local up's own (the developer's signature)

    def __init__(self, schedules: list[ScheduleDef], region: str, account: str) -> None:
        self.schedules = {(s.group, s.name): s for s in schedules}
        self.region = region
        self.account = account
        self.runners: dict[str, Any] = {}  # schedule name -> its running ScheduleRunner (servestack/local/scheduler.py)

    @staticmethod
    def is_api(request: Request) -> bool:
        return request.method == "GET" and request.path.startswith(PREFIX)

    def handle(self, request: Request) -> Reply:
        name = urllib.parse.unquote(request.path[len(PREFIX) :].strip("/"))
        group = request.query.get("groupName") or "default"
        schedule = self.schedules.get((group, name))
        if schedule is None:
            return _error(404, "ResourceNotFoundException", f"Schedule {name} does not exist.")
        body: dict[str, Any] = {
            "Arn": f"arn:aws:scheduler:{self.region}:{self.account}:schedule/{group}/{name}",
            "GroupName": group,
            "Name": name,
            "ScheduleExpression": schedule.expression,
            "ScheduleExpressionTimezone": schedule.timezone,
            "State": "ENABLED" if schedule.enabled else "DISABLED",
            "FlexibleTimeWindow": {"Mode": "OFF"},
            "Target": {"Arn": schedule.target_arn, "RoleArn": schedule.role_arn},
        }
        if schedule.input is not None:
            body["Target"]["Input"] = schedule.input
        return Reply(200, {"Content-Type": "application/json"}, json.dumps(body).encode())

    @staticmethod
    def is_fire_route(request: Request) -> bool:
        return request.path.startswith(FIRE_PREFIX) and request.path.endswith(FIRE_SUFFIX)

    def fire(self, request: Request) -> Reply:
        """Fire a schedule now (the caller is the developer, checked by the front): `{"invoked": bool}`, False
        when the invocation failed past the retry policy (the event then went to the dead-letter queue)."""
        name = urllib.parse.unquote(request.path[len(FIRE_PREFIX) : -len(FIRE_SUFFIX)])
        runner = self.runners.get(name)
        if request.method != "POST":
            return _error(405, "ValidationException", f"method: {request.method!r} is not allowed; POST")
        if runner is None:
            known = ", ".join(sorted(self.runners)) or "none"
            return _error(404, "ResourceNotFoundException", f"name: {name!r} is not a running schedule ({known})")
        if not runner.schedule.enabled:
            return _error(409, "ConflictException", f"name: {name!r} is DISABLED; an enabled schedule fires")
        invoked = bool(runner.fire())
        return Reply(200, {"Content-Type": "application/json"}, json.dumps({"invoked": invoked}).encode())
