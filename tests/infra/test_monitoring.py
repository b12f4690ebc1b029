"""Scheduled drift monitoring in the templates (servestack/cdk/monitoring.py): the check's function and its
least-privilege role, its schedule in the deployment's own group with retries and a dead-letter queue, and the drift
and failure alarms on the dashboard.
`digits-captured` (tests/infra/conftest.py) is a realtime endpoint with `capture:` and `monitor:`, whose baseline is
a file of the project."""

from __future__ import annotations

import json
from typing import Any

from servestack.local.cloudformation import file_asset_sources
from servestack.monitor.setting import HANDLER
from tests.infra.conftest import MONITOR_BASELINE, Synth

DEPLOYMENT = "digits-captured"
NAME = f"servestack-{DEPLOYMENT}"


def _monitor(synth: Synth) -> tuple[str, dict[str, Any]]:
    functions = synth.resources(DEPLOYMENT, "AWS::Lambda::Function")
    ((logical, function),) = [
        (k, f) for k, f in functions.items() if f["Properties"]["Handler"] == "servestack.monitor.scheduled.handler"
    ]
    return logical, function


def _bucket(synth: Synth) -> str:
    """The deployment's bucket (its capture's), not the one of its access logs."""
    (found,) = [k for k in synth.resources(DEPLOYMENT, "AWS::S3::Bucket") if k.startswith("ArtifactsBucket")]
    return found


def _statements(synth: Synth, role: str) -> list[dict[str, Any]]:
    return [
        statement
        for policy in synth.resources(DEPLOYMENT, "AWS::IAM::Policy").values()
        if {"Ref": role} in policy["Properties"]["Roles"]
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]


def test_the_check_is_told_its_capture_package_window_and_thresholds(synth: Synth) -> None:
    _, function = _monitor(synth)
    variables = function["Properties"]["Environment"]["Variables"]
    # The bucket is a Ref, so the setting is a join: its text around the bucket's name
    joined = variables["SERVESTACK_MONITOR"]["Fn::Join"][1]
    bucket = joined[1]
    setting = json.loads(joined[0] + "BUCKET" + joined[2])

    assert bucket == {"Ref": _bucket(synth)}
    assert setting == {
        "baseline": "train.csv",
        "bucket": "BUCKET",
        "deployment": DEPLOYMENT,
        "min_rows": 100,
        "model": "digits",
        "prefix": f"capture/{DEPLOYMENT}/",
        "source": "capture",
        "thresholds": {"js": 0.1, "missing": 0.05, "out_of_range": 0.05, "psi": 0.3, "unseen": 0.01},
        "version": "1",
        "window_hours": 6,
    }
    # AND its code carries the monitor, the model package and the baseline file (bundling skipped: the staged
    # sources are the asset)
    code = file_asset_sources(synth.outdir)[function["Properties"]["Code"]["S3Key"]]
    assert (code / "servestack" / "monitor" / "scheduled.py").is_file()
    assert (code / "models" / "artifacts" / "digits" / "1" / "manifest.json").is_file()
    assert MONITOR_BASELINE.endswith("/train.csv")
    assert (code / "monitor-baseline" / "train.csv").read_text() == "pixel\n0.5\n"


def test_the_checks_role_reads_the_capture_prefix_and_puts_drift_metrics_only(synth: Synth) -> None:
    _, function = _monitor(synth)
    role = function["Properties"]["Role"]["Fn::GetAtt"][0]
    bucket = _bucket(synth)
    logs = function["Properties"]["LoggingConfig"]["LogGroup"]["Ref"]
    prefix = f"capture/{DEPLOYMENT}/"

    assert _statements(synth, role) == [
        {
            "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
            "Effect": "Allow",
            "Resource": {"Fn::GetAtt": [logs, "Arn"]},
        },
        {
            "Action": "s3:GetObject",
            "Effect": "Allow",
            "Resource": {"Fn::Join": ["", [{"Fn::GetAtt": [bucket, "Arn"]}, f"/{prefix}*"]]},
        },
        {
            "Action": "s3:ListBucket",
            "Condition": {"StringLike": {"s3:prefix": [f"{prefix}*"]}},
            "Effect": "Allow",
            "Resource": {"Fn::GetAtt": [bucket, "Arn"]},
        },
        {
            "Action": "cloudwatch:PutMetricData",
            "Condition": {"StringEquals": {"cloudwatch:namespace": "servestack/Drift"}},
            "Effect": "Allow",
            "Resource": "*",
        },
    ]
    # AND the role is the function's alone, with no managed policy
    (role_resource,) = [r for k, r in synth.resources(DEPLOYMENT, "AWS::IAM::Role").items() if k == role]
    assert "ManagedPolicyArns" not in role_resource["Properties"]


def test_the_schedule_is_in_the_deployments_group_and_invokes_the_check_with_its_own_role(synth: Synth) -> None:
    logical, _ = _monitor(synth)
    (group,) = synth.resources(DEPLOYMENT, "AWS::Scheduler::ScheduleGroup").values()
    (schedule,) = synth.resources(DEPLOYMENT, "AWS::Scheduler::Schedule").values()
    props = schedule["Properties"]

    assert group["Properties"]["Name"] == NAME
    assert (props["Name"], props["GroupName"]) == (f"{NAME}-monitor", NAME)
    assert (props["ScheduleExpression"], props["ScheduleExpressionTimezone"]) == ("rate(6 hours)", "UTC")
    assert props["Target"]["Arn"] == {"Fn::GetAtt": [logical, "Arn"]}
    scheduler_role = props["Target"]["RoleArn"]["Fn::GetAtt"][0]
    function_arn = {"Fn::GetAtt": [logical, "Arn"]}
    dead_letters = _dead_letters(synth)
    # AND Scheduler retries an invocation it could not make, then sends it to the check's dead-letter queue
    assert props["Target"]["RetryPolicy"] == {"MaximumEventAgeInSeconds": 3600, "MaximumRetryAttempts": 2}
    assert props["Target"]["DeadLetterConfig"] == {"Arn": {"Fn::GetAtt": [dead_letters, "Arn"]}}
    # AND its role may invoke the check and send to that queue, nothing else
    assert _statements(synth, scheduler_role) == [
        {
            "Action": "lambda:InvokeFunction",
            "Effect": "Allow",
            "Resource": [function_arn, {"Fn::Join": ["", [function_arn, ":*"]]}],
        },
        {"Action": "sqs:SendMessage", "Effect": "Allow", "Resource": {"Fn::GetAtt": [dead_letters, "Arn"]}},
    ]


def _dead_letters(synth: Synth) -> str:
    (logical,) = [k for k in synth.resources(DEPLOYMENT, "AWS::SQS::Queue") if k.startswith("MonitorDeadLetters")]
    return logical


def test_the_dead_letter_queue_is_encrypted_tls_only_and_kept_14_days(synth: Synth) -> None:
    dead_letters = _dead_letters(synth)
    queue = synth.resources(DEPLOYMENT, "AWS::SQS::Queue")[dead_letters]["Properties"]
    assert (queue["SqsManagedSseEnabled"], queue["MessageRetentionPeriod"]) == (True, 14 * 24 * 3600)
    (policy,) = [
        p["Properties"]["PolicyDocument"]["Statement"]
        for p in synth.resources(DEPLOYMENT, "AWS::SQS::QueuePolicy").values()
        if p["Properties"]["Queues"] == [{"Ref": dead_letters}]
    ]
    assert [(s["Effect"], s["Condition"]) for s in policy] == [("Deny", {"Bool": {"aws:SecureTransport": "false"}})]


def test_the_failure_alarm_counts_failed_checks_target_errors_and_dead_letters(synth: Synth) -> None:
    logical, _ = _monitor(synth)
    alarms = synth.resources(DEPLOYMENT, "AWS::CloudWatch::Alarm")
    ((alarm_id, alarm),) = [
        (k, a) for k, a in alarms.items() if a["Properties"]["AlarmName"] == f"{NAME}-monitor-failures"
    ]
    props = alarm["Properties"]
    assert (props["ComparisonOperator"], props["Threshold"], props["EvaluationPeriods"], props["TreatMissingData"]) == (
        "GreaterThanThreshold",
        0,
        1,
        "notBreaching",
    )
    queries = {q["Id"]: q for q in props["Metrics"]}
    (expression,) = [q["Expression"] for q in props["Metrics"] if "Expression" in q]
    assert expression == "FILL(failed, 0) + FILL(target_errors, 0) + FILL(dlq, 0)"

    def watched(id_: str) -> tuple[str, str, Any, str, int]:
        stat = queries[id_]["MetricStat"]
        metric = stat["Metric"]
        return metric["Namespace"], metric["MetricName"], metric["Dimensions"], stat["Stat"], stat["Period"]

    # The check raising (or timing out) is the function's Errors; Scheduler's errors are the group's
    assert watched("failed") == ("AWS/Lambda", "Errors", [{"Name": "FunctionName", "Value": {"Ref": logical}}], "Sum",
                                 300)  # fmt: skip
    assert watched("target_errors") == (
        "AWS/Scheduler", "TargetErrorCount", [{"Name": "ScheduleGroup", "Value": NAME}], "Sum", 300,
    )  # fmt: skip
    assert watched("dlq") == (
        "AWS/SQS",
        "ApproximateNumberOfMessagesVisible",
        [{"Name": "QueueName", "Value": {"Fn::GetAtt": [_dead_letters(synth), "QueueName"]}}],
        "Maximum",
        300,
    )
    # AND it is on the dashboard, beside the drift alarm
    (dashboard,) = synth.resources(DEPLOYMENT, "AWS::CloudWatch::Dashboard").values()
    assert alarm_id in json.dumps(dashboard["Properties"]["DashboardBody"])


def test_the_drift_alarm_watches_the_drift_flag_and_is_on_the_dashboard(synth: Synth) -> None:
    alarms = synth.resources(DEPLOYMENT, "AWS::CloudWatch::Alarm")
    ((logical, alarm),) = [(k, a) for k, a in alarms.items() if a["Properties"]["AlarmName"] == f"{NAME}-drift"]
    props = alarm["Properties"]

    assert (props["Namespace"], props["MetricName"], props["Statistic"], props["Period"]) == (
        "servestack/Drift",
        "DriftDetected",
        "Maximum",
        3600,
    )
    assert props["Dimensions"] == [{"Name": "Deployment", "Value": DEPLOYMENT}]
    assert (props["ComparisonOperator"], props["Threshold"], props["EvaluationPeriods"]) == (
        "GreaterThanOrEqualToThreshold",
        1,
        1,
    )
    # Between two checks there is no datapoint: the alarm keeps the last verdict
    assert props["TreatMissingData"] == "ignore"
    (dashboard,) = synth.resources(DEPLOYMENT, "AWS::CloudWatch::Dashboard").values()
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    assert logical in body  # the alarm status widget names its ARN
    assert "SEARCH(" in body
    assert "DriftScore" in body


# ------------------------------------------------------------------------------------------ a batch deployment's check

BATCH = "cancer-watched"
BATCH_NAME = f"servestack-{BATCH}"


def _batch_check(synth: Synth) -> tuple[str, dict[str, Any]]:
    functions = synth.resources(BATCH, "AWS::Lambda::Function")
    ((logical, function),) = [(k, f) for k, f in functions.items() if f["Properties"]["Handler"] == HANDLER]
    return logical, function


def test_a_batch_deployments_check_reads_its_input_and_output_prefixes_and_nothing_else(synth: Synth) -> None:
    logical, function = _batch_check(synth)
    (bucket,) = [k for k in synth.resources(BATCH, "AWS::S3::Bucket") if k.startswith("ArtifactsBucket")]
    joined = function["Properties"]["Environment"]["Variables"]["SERVESTACK_MONITOR"]["Fn::Join"][1]
    setting = json.loads(joined[0] + "BUCKET" + joined[2])
    # THEN it is told to read the runs under the output prefix
    assert (setting["source"], setting["prefix"], setting["window_hours"]) == ("batch", "scoring/out/", 26)
    role = function["Properties"]["Role"]["Fn::GetAtt"][0]
    logs = function["Properties"]["LoggingConfig"]["LogGroup"]["Ref"]
    arn = {"Fn::GetAtt": [bucket, "Arn"]}
    objects = [{"Fn::Join": ["", [arn, f"/{prefix}*"]]} for prefix in ("scoring/in/", "scoring/out/")]
    # AND its role reads exactly the input and output prefixes (objects, and listing under them), puts drift
    # metrics, and writes its log: no write to S3, nothing of the batch job's
    assert _statements_of(synth, BATCH, role) == [
        {
            "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
            "Effect": "Allow",
            "Resource": {"Fn::GetAtt": [logs, "Arn"]},
        },
        {"Action": "s3:GetObject", "Effect": "Allow", "Resource": objects},
        {
            "Action": "s3:ListBucket",
            "Condition": {"StringLike": {"s3:prefix": ["scoring/in/*", "scoring/out/*"]}},
            "Effect": "Allow",
            "Resource": {"Fn::GetAtt": [bucket, "Arn"]},
        },
        {
            "Action": "cloudwatch:PutMetricData",
            "Condition": {"StringEquals": {"cloudwatch:namespace": "servestack/Drift"}},
            "Effect": "Allow",
            "Resource": "*",
        },
    ]
    # AND its schedule is in the deployment's one schedule group, the batch schedule's: no second group
    (group,) = synth.resources(BATCH, "AWS::Scheduler::ScheduleGroup").values()
    assert group["Properties"]["Name"] == BATCH_NAME
    schedules = {
        s["Properties"]["Name"]: s["Properties"] for s in synth.resources(BATCH, "AWS::Scheduler::Schedule").values()
    }
    assert sorted(schedules) == [BATCH_NAME, f"{BATCH_NAME}-monitor"]
    assert {props["GroupName"] for props in schedules.values()} == {BATCH_NAME}
    check = schedules[f"{BATCH_NAME}-monitor"]["Target"]
    assert check["Arn"] == {"Fn::GetAtt": [logical, "Arn"]}
    assert "DeadLetterConfig" in check
    # AND its alarms are the deployment's, beside the batch failure alarm
    names = {a["Properties"]["AlarmName"] for a in synth.resources(BATCH, "AWS::CloudWatch::Alarm").values()}
    assert names == {f"{BATCH_NAME}-failures", f"{BATCH_NAME}-drift", f"{BATCH_NAME}-monitor-failures"}


def _statements_of(synth: Synth, deployment: str, role: str) -> list[dict[str, Any]]:
    return [
        statement
        for policy in synth.resources(deployment, "AWS::IAM::Policy").values()
        if {"Ref": role} in policy["Properties"]["Roles"]
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]
