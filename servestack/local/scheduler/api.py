"""EventBridge Scheduler's read API on local up's AWS API port: `GetSchedule` (`GET /schedules/{Name}`) of the
templates' schedules, as the local scheduler runs them (servestack/local/scheduler/schedules.py). What the pipeline's
smoke test asks of a batch deployment (`scheduler:GetSchedule`, authorized on the schedule's ARN before this
answers). Schedules are the templates': nothing creates or changes them here."""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

from servestack.local.hosting import Reply, Request
from servestack.local.scheduler.definitions import ScheduleDef

PREFIX = "/schedules/"


def _error(status: int, code: str, message: str) -> Reply:
    headers = {"Content-Type": "application/json", "x-amzn-ErrorType": code}
    return Reply(status, headers, json.dumps({"Message": message}).encode())


class SchedulerApi:
    def __init__(self, schedules: list[ScheduleDef], region: str, account: str) -> None:
        self.schedules = {s.name: s for s in schedules}
        self.region = region
        self.account = account

    @staticmethod
    def is_api(request: Request) -> bool:
        return request.method == "GET" and request.path.startswith(PREFIX)

    def handle(self, request: Request) -> Reply:
        name = urllib.parse.unquote(request.path[len(PREFIX) :].strip("/"))
        group = request.query.get("groupName") or "default"
        schedule = self.schedules.get(name) if group == "default" else None
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
