"""What local up reads from the session's synthesized templates (the repo's deployments plus every construct
option): each mode's resources with the template's settings, and a report that lists every resource."""

from __future__ import annotations

import json
from pathlib import Path

from servestack.local.cloudformation.return_values import RETURN_VALUES
from servestack.local.cloudformation.templates import LocalValues, Resolver, StackTemplate
from servestack.local.emulator.moto_server import EmbeddedEmulator, clients
from servestack.local.stack.provisioning import ensure_roles
from servestack.local.stack.topology import StackTopology, read_stack
from tests.infra.conftest import Synth

LOCAL = LocalValues(emulator_url="http://emu:5000")


def topology(synth: Synth, deployment: str) -> StackTopology:
    stack = f"servestack-{deployment}"
    template = StackTemplate.load(synth.outdir / f"{stack}.template.json", stack)
    return read_stack(template, Resolver(template, LOCAL))


def test_every_deployment_reads_and_reports_every_resource(synth: Synth) -> None:
    for deployment in synth.deployments:
        read = topology(synth, deployment)
        resources = synth.templates[f"servestack-{deployment}"]["Resources"]
        assert read.deployment == deployment
        assert {row.logical_id for row in read.report} == set(resources)


def test_realtime_variants_shadow_and_model_mode(synth: Synth) -> None:
    (ab,) = topology(synth, "digits-ab").endpoints.values()
    assert [(v.name, v.weight) for v in ab.variants] == [("current", 9.0), ("candidate", 1.0)]
    (shadowed,) = topology(synth, "digits-shadow").endpoints.values()
    assert [v.name for v in shadowed.shadow_variants] == ["shadow"]
    assert shadowed.shadow_variants[0].weight == 0.2  # 20% of the production variant's weight
    (mme,) = topology(synth, "digits-mme").endpoints.values()
    assert mme.variants[0].container.mode == "MultiModel"
    assert mme.variants[0].container.model_data_url.endswith("/models/")  # type: ignore[union-attr]
    (sls,) = topology(synth, "digits-sls").endpoints.values()
    assert sls.variants[0].serverless == {"MaxConcurrency": 5, "MemorySizeInMB": 3072}
    (realtime,) = topology(synth, "digits-realtime").endpoints.values()
    assert realtime.name == "servestack-digits-realtime"
    assert realtime.variants[0].container.model_data_url is not None


def test_async_queue_mapping_notification_and_table(synth: Synth) -> None:
    read = topology(synth, "cancer-async")
    (mapping,) = read.mappings
    assert (mapping.batch_size, mapping.window_sec, mapping.report_batch_item_failures) == (20, 2, True)
    assert mapping.maximum_concurrency == 10
    queues = {q.name: q for q in read.queues.values()}
    redrive = json.loads(queues["servestack-cancer-async-jobs"].attributes["RedrivePolicy"])
    assert redrive == {"deadLetterTargetArn": queues["servestack-cancer-async-dlq"].arn, "maxReceiveCount": "3"}
    (table,) = read.tables.values()
    assert table.ttl_attribute == "expires_at"
    # the notification is CDK's custom resource, applied by its handler under the handler's role (not the bucket's)
    assert not any(b.notifications for b in read.buckets.values())
    (notifications,) = read.bucket_notifications
    bucket = read.buckets[notifications.bucket_logical_id]
    assert notifications.bucket == bucket.name
    handler_role = next(r for r in read.roles.values() if r.arn == notifications.role_arn)
    assert "BucketNotificationsHandler" in handler_role.logical_id
    assert not notifications.skip_destination_validation
    (rule,) = notifications.configuration["QueueConfigurations"]
    assert rule["QueueArn"] == queues["servestack-cancer-async-jobs"].arn
    assert rule["Filter"]["Key"]["FilterRules"] == [
        {"Name": "prefix", "Value": "async/servestack-cancer-async/requests/uploads/"}
    ]
    # the queue policy lets S3 send from this bucket only
    (policy,) = read.resource_policies[queues["servestack-cancer-async-jobs"].arn]
    s3_statement = next(s for s in policy["Statement"] if s.get("Principal") == {"Service": "s3.amazonaws.com"})
    assert s3_statement["Condition"]["ArnLike"]["aws:SourceArn"] == bucket.arn


def test_sagemaker_async_backend_endpoint_topics_and_notifier(synth: Synth) -> None:
    read = topology(synth, "cancer-gpu-async")
    (endpoint,) = read.endpoints.values()
    assert endpoint.async_config is not None
    topics = {t.arn for t in read.topics.values()}
    notification = endpoint.async_config["OutputConfig"]["NotificationConfig"]
    assert {notification["SuccessTopic"], notification["ErrorTopic"]} == topics
    assert all(sub[0] == "sqs" and sub[2] for t in read.topics.values() for sub in t.subscriptions)
    (mapping,) = read.mappings
    assert read.functions[mapping.function].handler == "handlers.asynchronous.notification_handler"


def test_serverless_route_alias_and_permission(synth: Synth) -> None:
    read = topology(synth, "digits-api")
    (api,) = read.apis.values()
    (route,) = api.routes
    assert (route.route_key, route.authorization, route.qualifier, route.timeout_ms) == (
        "$default",
        "AWS_IAM",
        "live",
        10_000,  # the function's own timeout_sec (serving.yaml's digits-api): the route waits as long as it runs
    )
    function = next(f for f in read.functions.values() if f.name == route.function)
    assert function.aliases == ("live",)
    assert function.logical_id in read.versioned
    (permission,) = read.resource_policies[function.arn]
    (statement,) = permission["Statement"]
    assert statement["Principal"] == {"Service": "apigateway.amazonaws.com"}


def test_batch_schedule_input_retries_and_dead_letters(synth: Synth) -> None:
    read = topology(synth, "cancer-nightly")
    (schedule,) = read.schedules
    assert (schedule.expression, schedule.timezone, schedule.retry_attempts) == ("cron(0 2 * * ? *)", "Europe/Paris", 2)
    payload = json.loads(schedule.input or "{}")
    assert payload["input_prefix"] == "batch/cancer-nightly/input/"
    assert schedule.dead_letter_arn in {q.arn for q in read.queues.values()}
    assert read.function_by_arn(schedule.target_arn) is not None
    assert schedule.group == "servestack-cancer-nightly"  # the deployment's own schedule group


def test_a_transform_schedule_is_read_and_reported_as_run_by_the_local_scheduler(synth: Synth) -> None:
    # GIVEN an engine: transform deployment / WHEN local up reads it
    read = topology(synth, "cancer-transform")
    (schedule,) = read.schedules
    # THEN its schedule is known as a universal CreateTransformJob target, with the job it would create
    assert schedule.universal == "sagemaker:createTransformJob"
    job = json.loads(schedule.input or "{}")
    assert job["TransformJobName"] == "servestack-cancer-transform-<aws.scheduler.execution-id>"
    assert job["TransformInput"]["SplitType"] == "Line"
    # AND the job's model container, execution role and the function its end runs are known to run-batch
    (transform,) = read.transforms
    assert transform.container.environment["SERVESTACK_TRANSFORM_MAX_PAYLOAD_MB"] == "4"
    assert "TransformRole" in transform.execution_role
    assert read.functions[transform.on_end or ""].handler == "handlers.batch.transform_done"
    # AND --explain says that the schedule is fired as its role, and that the job state change rule is not
    # emulated as a rule (the emulated job sends its event)
    rows = {row.type: row for row in read.report if row.type in ("AWS::Scheduler::Schedule", "AWS::Events::Rule")}
    assert rows["AWS::Scheduler::Schedule"].emulated
    assert "CreateTransformJob" in rows["AWS::Scheduler::Schedule"].how
    assert "as the schedule's role" in rows["AWS::Scheduler::Schedule"].how
    assert not rows["AWS::Events::Rule"].emulated


def test_a_fargate_deployments_failed_task_rule_and_failure_alarm_are_played(synth: Synth) -> None:
    # GIVEN the Fargate batch deployment / WHEN local up reads it
    read = topology(synth, "digits-weekly")
    # THEN its failed-task rule is played, its pattern resolved on the cluster's ARN as ECS's events carry it
    (rule,) = read.rules
    (schedule,) = read.schedules
    assert rule.enabled
    assert rule.pattern["detail"]["clusterArn"] == [schedule.target_arn]  # the schedule's target: the cluster
    # AND its failure alarm is evaluated on that rule's TriggeredRules and its own schedule group's target errors
    (alarm,) = read.alarms
    assert alarm.name == "servestack-digits-weekly-failures"
    assert alarm.watched_rules() == {rule.name}
    metrics = {m.id: m for m in alarm.metrics}
    assert metrics["target_errors"].dimensions == (("ScheduleGroup", schedule.group),)
    # AND --explain says both are emulated, and how
    rows = {row.type: row for row in read.report if row.type in ("AWS::Events::Rule", "AWS::CloudWatch::Alarm")}
    assert rows["AWS::Events::Rule"].emulated
    assert "ECS task's stop" in rows["AWS::Events::Rule"].how
    assert rows["AWS::CloudWatch::Alarm"].emulated
    assert "evaluated" in rows["AWS::CloudWatch::Alarm"].how
    # AND a Lambda deployment's failure alarm is evaluated too: local mode counts its function's Errors, its group's
    # target errors and its dead-letter queue's depth (servestack/local/cloudwatch/service_metrics.py)
    nightly = {row.type: row for row in topology(synth, "cancer-nightly").report}
    assert nightly["AWS::CloudWatch::Alarm"].emulated


def test_every_resource_type_the_app_synthesizes_has_its_documented_return_values(synth: Synth) -> None:
    # GIVEN every template of the session synth (each mode, every construct option, the pipeline)
    bodies = [*synth.templates.values(), synth.pipeline]
    used = {resource["Type"] for body in bodies for resource in body["Resources"].values()}
    # THEN local mode knows what Ref and Fn::GetAtt return for each type (tests/unit/test_return_values.py checks
    # each row against the CloudFormation reference)
    assert sorted(used - set(RETURN_VALUES) - {"AWS::CDK::Metadata"}) == []


def test_every_role_policy_of_every_stack_is_one_iam_accepts(synth: Synth) -> None:
    # GIVEN each stack's roles with their policies resolved as local up resolves them (a Fargate batch's schedule
    # role may ecs:RunTask on `Ref` of its task definition, which CloudFormation documents as the ARN)
    emulator = EmbeddedEmulator()
    try:
        iam = clients(emulator.url)["iam"]
        for deployment in synth.deployments:
            # WHEN local up puts them on the emulator's IAM (moto validates each document as IAM does)
            ensure_roles(iam, topology(synth, deployment))
        # THEN every document was accepted: the Fargate schedule's role may run exactly its task definition
        weekly = topology(synth, "digits-weekly")
        (task,) = weekly.tasks.values()
        family = "servestackdigitsweeklyBatchTask7A223B2E"
        assert task.arn == f"arn:aws:ecs:us-east-1:123456789012:task-definition/{family}:1"
        role = next(r for r in weekly.roles.values() if "SchedulerRole" in r.logical_id)
        statements = [s for document in role.policies for s in document["Statement"]]
        assert {"Action": "ecs:RunTask", "Effect": "Allow", "Resource": task.arn} in statements
    finally:
        emulator.stop()


def test_local_up_says_where_a_gpu_instance_type_runs_on_the_cpu(synth: Synth) -> None:
    from servestack.local.up.devices import gpu_notes

    # GIVEN digits-mixed: a CPU primary variant (ml.m5.large) and a GPU variant (ml.g6.xlarge)
    (note,) = gpu_notes([topology(synth, "digits-mixed")])
    # THEN local up names the GPU variant alone, its instance type and GPU, and that it runs on the CPU here
    assert note.startswith("digits-mixed: variant gpu of servestack-digits-mixed is a GPU instance type on AWS")
    assert "(ml.g6.xlarge, NVIDIA L4)" in note
    assert "here it runs on this machine's CPU, with onnxruntime's CPU provider" in note
    # AND a shadow variant on the default GPU type is named too; CPU-only deployments get no line
    assert len(gpu_notes([topology(synth, "digits-shadow")])) == 2
    assert gpu_notes([topology(synth, "digits-mme"), topology(synth, "digits-sls")]) == []
    # AND a Batch Transform job gets none: it runs on CPU types (cancer-transform: ml.c5.xlarge)
    assert gpu_notes([topology(synth, "cancer-transform")]) == []
    # AND an async deployment on SageMaker (cancer-gpu-async: the default ml.g5.xlarge)
    (endpoint,) = gpu_notes([topology(synth, "cancer-gpu-async")])
    assert "(ml.g5.xlarge, NVIDIA A10G)" in endpoint


def test_a_deployments_drift_check_is_scheduled_as_its_role_and_its_drift_alarm_evaluated(synth: Synth) -> None:
    # GIVEN the realtime deployment with capture: and monitor: / WHEN local up reads it
    read = topology(synth, "digits-captured")
    # THEN its one schedule, in the deployment's own group, invokes the check's function (a Lambda target, invoked
    # as the schedule's role)
    (schedule,) = read.schedules
    assert (schedule.name, schedule.group) == ("servestack-digits-captured-monitor", "servestack-digits-captured")
    assert (schedule.task, schedule.universal) == (None, None)
    assert [f.handler for f in read.functions.values()] == ["servestack.monitor.scheduled.handler"]
    # AND a failed invocation goes to the check's dead-letter queue once retried (the local scheduler honours it)
    (queue,) = [q for q in read.queues.values() if q.arn == schedule.dead_letter_arn]
    assert (schedule.retry_attempts, schedule.maximum_event_age_sec) == (2, 3600)
    # AND its drift alarm is evaluated (its metric is the check's own), and so is its failure alarm (the function's
    # Errors, the group's target errors and the queue's depth, which local mode counts); the endpoint's guardrails
    # (SageMaker's metrics) are only reported
    drift, failures = sorted(
        (alarm for alarm in read.alarms if alarm.evaluated_locally(set())), key=lambda alarm: alarm.name
    )
    assert drift.name == "servestack-digits-captured-drift"
    assert drift.treat_missing_data == "ignore"
    assert failures.name == "servestack-digits-captured-monitor-failures"
    assert failures.watched_queues() == {queue.name}
    rows = [row for row in read.report if row.type == "AWS::CloudWatch::Alarm"]
    alarms = synth.resources("digits-captured", "AWS::CloudWatch::Alarm")
    assert sorted(row.logical_id for row in rows if row.emulated) == sorted(
        k for k in alarms if "DriftAlarm" in k or "MonitorFailureAlarm" in k
    )
    assert len(rows) > 2


def test_a_batch_deployments_drift_check_shares_its_group_and_is_not_taken_for_its_run(
    synth: Synth, tmp_path: Path
) -> None:
    from servestack.local.batch import BatchPlanner
    from tests.integration.test_batch_seed import plan_context

    # GIVEN the batch deployment with monitor: / WHEN local up reads and plans it
    read = topology(synth, "cancer-watched")
    entry = BatchPlanner(None).plan(read, plan_context(tmp_path, tmp_path / "no-sample")).entry
    # THEN both schedules are in the deployment's one group, each with its dead-letter queue
    schedules = {schedule.name: schedule for schedule in read.schedules}
    assert sorted(schedules) == ["servestack-cancer-watched", "servestack-cancer-watched-monitor"]
    assert {schedule.group for schedule in schedules.values()} == {"servestack-cancer-watched"}
    assert all(schedule.dead_letter_arn for schedule in schedules.values())
    # AND the deployment's run is the batch schedule's (`local run-batch`, the seed), never the check's
    assert entry["schedule_name"] == "servestack-cancer-watched"
    assert entry["input"]["input_prefix"] == "scoring/in/"
    # AND its drift, check-failure and batch failure alarms are all evaluated
    assert {alarm.name for alarm in read.alarms if alarm.evaluated_locally(set())} == {
        "servestack-cancer-watched-failures",
        "servestack-cancer-watched-drift",
        "servestack-cancer-watched-monitor-failures",
    }
