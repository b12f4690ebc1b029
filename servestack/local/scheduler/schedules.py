"""EventBridge Scheduler schedules of the templates, run by `local up`: fire on the expression in its time
zone, invoke the target function with the template's input (asynchronously, as Scheduler's Lambda target
does), as the schedule's role.

As in the cloud, the schedule's role must be allowed `lambda:InvokeFunction` on the target; a refused or
failed invocation is retried per the target's `RetryPolicy` (attempts and maximum event age, with backoff),
then sent to the target's dead-letter queue (as the role, which needs `sqs:SendMessage` on it and nothing
else: the queue's URL comes from its ARN, not from `sqs:GetQueueUrl`) with Scheduler's error attributes. A
refused dead letter is logged, and the schedule keeps firing. A function that fails after the invocation was
accepted is the function's business (its logs), not the schedule's.

Each failed attempt counts in the schedule group's `TargetErrorCount` (`on_target_error`), as Scheduler's metrics
count it, where a failure alarm watches it.

A universal target (`aws-sdk:sagemaker:createTransformJob`, engine: transform) is fired the same way: its
`start_job` makes the SDK call as the schedule's role (refused or failed: retried, then dead-lettered, as for
a Lambda target) and, once SageMaker accepted the job, runs it; the job's own failure is the job's record
(DescribeTransformJob), not the schedule's.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from servestack.local.lambda_ import LambdaService
from servestack.local.scheduler.definitions import ScheduleDef
from servestack.local.scheduler.expressions import parse_schedule

logger = logging.getLogger("servestack.local")

# (role ARN, action, resource ARN) -> None when allowed, else the denial AWS would report.
Authorize = Callable[[str, str, str], "str | None"]


class ScheduleRunner:
    def __init__(
        self,
        schedule: ScheduleDef,
        lambdas: LambdaService,
        authorize: Authorize,
        send_dead_letter: Callable[[str, str, dict[str, Any]], None] | None = None,
        *,
        run_task: Callable[[ScheduleDef], str | None] | None = None,
        start_job: Callable[[ScheduleDef], str | None] | None = None,
        before_run: Callable[[ScheduleDef], None] | None = None,
        on_target_error: Callable[[str], None] | None = None,
        backoff_sec: float = 1.0,
    ) -> None:
        self.schedule = schedule
        # local mode's own step before each run (a batch deployment's seeded sample leaves once the user's input is
        # there): not Scheduler's, so its failure is logged and the run goes on
        self.before_run = before_run
        self.run_task = run_task  # an ECS target: start the task; None when it started, else why not
        self.start_job = start_job  # a universal target: make its SDK call; None when accepted, else why not
        self.lambdas = lambdas
        self.authorize = authorize
        self.send_dead_letter = send_dead_letter
        self.on_target_error = on_target_error  # a failed attempt, by schedule group (its TargetErrorCount)
        self.backoff_sec = backoff_sec
        self.parsed = parse_schedule(schedule.expression, schedule.timezone)
        self.runs = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def next_fire(self) -> datetime:
        return self.parsed.next_after(datetime.now(UTC))

    def start(self) -> ScheduleRunner:
        if self.schedule.enabled:
            self._thread = threading.Thread(target=self._loop, name=f"schedule-{self.schedule.name}", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.is_set():
            fire = self.next_fire()
            logger.info("schedule %s: next run %s", self.schedule.name, fire.isoformat())
            if self._stop.wait(max(0.0, (fire - datetime.now(UTC)).total_seconds())):
                return
            try:
                self.fire()
            except Exception:  # one run's failure is that run's log, never the end of the schedule
                logger.exception("schedule %s: run %d failed", self.schedule.name, self.runs)

    def fire(self) -> bool:
        """One scheduled run: invoke, retrying per the retry policy; False when it ended in the DLQ."""
        s = self.schedule
        self.runs += 1
        if self.before_run is not None:
            try:
                self.before_run(s)
            except Exception:
                logger.exception("schedule %s: local mode's step before run %d failed", s.name, self.runs)
        started = time.monotonic()
        error = "unknown"
        for attempt in range(s.retry_attempts + 1):
            if s.task is not None:
                failed = self.run_task(s) if self.run_task is not None else "ECS targets need a task runner"
                if failed is None:
                    logger.info("schedule %s: started task %s (run %d)", s.name, s.task, self.runs)
                    return True
                error = failed
                logger.error("schedule %s: attempt %d failed: %s", s.name, attempt + 1, error)
                self._target_error()
                if self._stop.wait(self.backoff_sec * 2**attempt):
                    return False
                continue
            if s.universal is not None:
                failed = self.start_job(s) if self.start_job is not None else f"{s.universal}: not run locally"
                if failed is None:
                    logger.info("schedule %s: %s accepted (run %d)", s.name, s.universal, self.runs)
                    return True
                error = failed
            else:
                denied = self.authorize(s.role_arn, "lambda:InvokeFunction", s.target_arn)
                if denied is not None:
                    error = f"AccessDeniedException: {denied}"
                else:
                    invocation = self.lambdas.invoke(
                        s.target_arn, (s.input or "{}").encode(), headers={"x-amz-invocation-type": "Event"}
                    )
                    if invocation.status == 202:
                        logger.info("schedule %s: invoked %s (run %d)", s.name, s.target_arn, self.runs)
                        return True
                    error = invocation.body.decode(errors="replace")
            logger.error("schedule %s: attempt %d failed: %s", s.name, attempt + 1, error)
            self._target_error()
            if time.monotonic() - started + self.backoff_sec > s.maximum_event_age_sec:
                break
            if self._stop.wait(self.backoff_sec * 2**attempt):
                return False
        if s.dead_letter_arn and self.send_dead_letter is not None:
            attributes = {
                "X-Amz-Scheduler-Attempt": str(s.retry_attempts + 1),
                "X-Amz-Scheduler-Schedule-Arn": f"schedule/{s.group}/{s.name}",
                "X-Amz-Scheduler-Error-Code": error.split(":", 1)[0][:256],
                "X-Amz-Scheduler-Error-Message": error[:1024],
            }
            try:
                self.send_dead_letter(s.dead_letter_arn, s.input or "{}", attributes)
            except Exception as refused:  # AccessDenied, a missing queue: Scheduler counts it in its DLQ metrics
                logger.error(
                    "schedule %s: the event could not be sent to its dead-letter queue %s: %s",
                    s.name, s.dead_letter_arn, refused,
                )  # fmt: skip
        return False

    def _target_error(self) -> None:
        if self.on_target_error is not None:
            self.on_target_error(self.schedule.group)


def queue_url_of(queue_arn: str, endpoint_url: str) -> str:
    """A queue's URL from its ARN (`arn:aws:sqs:<region>:<account>:<name>` -> `<endpoint>/<account>/<name>`), as
    Scheduler addresses a dead-letter queue: with `sqs:SendMessage` alone, no `sqs:GetQueueUrl`."""
    parts = queue_arn.split(":")
    if len(parts) != 6 or parts[:3] != ["arn", "aws", "sqs"] or not parts[4] or not parts[5]:
        raise ValueError(f"{queue_arn!r} is not an SQS queue ARN (arn:aws:sqs:<region>:<account>:<name>)")
    return f"{endpoint_url.rstrip('/')}/{parts[4]}/{parts[5]}"


def send_dead_letter(sqs: Any, endpoint_url: str, queue_arn: str, body: str, attributes: dict[str, Any]) -> None:
    """Send a schedule's event to its dead-letter queue with `sqs` (a client signing as the schedule's role)."""
    sqs.send_message(
        QueueUrl=queue_url_of(queue_arn, endpoint_url), MessageBody=body,
        MessageAttributes={k: {"DataType": "String", "StringValue": v} for k, v in attributes.items()},
    )  # fmt: skip


def invoke_as_schedule_role(about: dict[str, Any], entry: dict[str, Any], payload: dict[str, Any]) -> dict[str, Any]:
    """`local run-batch` of a Lambda target, started as the schedule starts it: Invoke of the target by the
    schedule's role (the role its `Target.RoleArn` names), signed with that role's keys from local up's
    identities, through local up's Lambda API, where IAM checks `lambda:InvokeFunction` on the target as it
    does when the schedule fires. The invocation is synchronous (the schedule's is `Event`) so that the
    developer sees the run's manifest; the permission checked is the same. Returns boto3's Invoke response;
    `CommandError` (exit 1) when the role may not start the run."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError

    from servestack.failures import CommandError, ExitCode

    role_arn = str(entry.get("schedule_role") or "")
    keys = (about.get("identities") or {}).get(role_arn.rsplit("/", 1)[-1])
    if not role_arn or not isinstance(keys, dict):
        raise CommandError(
            f"the running local up records no keys for the schedule's role ({role_arn or 'none'}) of "
            f"{entry.get('schedule_name', 'this deployment')}: restart `servestack local up`",
            ExitCode.NOT_RUNNING,
        )
    session = boto3.session.Session(
        aws_access_key_id=keys["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=keys["AWS_SECRET_ACCESS_KEY"],
        aws_session_token=keys.get("AWS_SESSION_TOKEN"),
        region_name=about.get("region", "us-east-1"),
    )
    config = Config(retries={"mode": "standard", "max_attempts": 1}, read_timeout=960)
    lambdas = session.client("lambda", endpoint_url=about["aws_api_url"], config=config)
    logger.info("invoking %s as the schedule's role %s", entry["target"], role_arn)
    try:
        response: dict[str, Any] = lambdas.invoke(FunctionName=entry["target"], Payload=json.dumps(payload).encode())
    except ClientError as refused:
        raise CommandError(
            f"the schedule's role {role_arn} could not start the run: {refused}", ExitCode.FAILED
        ) from None
    return response
