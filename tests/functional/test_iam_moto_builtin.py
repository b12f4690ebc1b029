"""Why local mode does not use moto's own IAM enforcement: the experiment behind the finding written in
servestack/local/iam/__init__.py, kept as a test so that a moto upgrade that fixes it shows up here.

An IAM user holds a policy shaped like servestack's roles (statements scoped to ARNs, conditions on
`s3:prefix` and `cloudwatch:namespace`), and moto checks every call after `INITIAL_NO_AUTH_ACTION_COUNT`.
The experiment runs in a child process: `mock_aws` resets moto's in-process backends, which an embedded
moto server of another test may be using.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
from botocore.exceptions import ClientError
from moto import mock_aws
from moto.core import DEFAULT_ACCOUNT_ID, set_initial_no_auth_action_count

REPO_ROOT = Path(__file__).resolve().parents[2]
BUCKET = "moto-iam-finding"
POLICY = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Action": "dynamodb:PutItem",
            "Resource": f"arn:aws:dynamodb:us-east-1:{DEFAULT_ACCOUNT_ID}:table/jobs",
        },
        {
            "Effect": "Allow",
            "Action": "sqs:SendMessage",
            "Resource": f"arn:aws:sqs:us-east-1:{DEFAULT_ACCOUNT_ID}:work",
        },
        {
            "Effect": "Allow",
            "Action": "s3:ListBucket",
            "Resource": f"arn:aws:s3:::{BUCKET}",
            "Condition": {"StringLike": {"s3:prefix": ["input/*"]}},
        },
        {"Effect": "Allow", "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{BUCKET}/*"},
        {
            "Effect": "Allow",
            "Action": "cloudwatch:PutMetricData",
            "Resource": "*",
            "Condition": {"StringLike": {"cloudwatch:namespace": "/aws/sagemaker/Endpoints*"}},
        },
    ],
}
TLS_ONLY = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Deny",
            "Principal": {"AWS": "*"},
            "Action": "s3:*",
            "Resource": [f"arn:aws:s3:::{BUCKET}", f"arn:aws:s3:::{BUCKET}/*"],
            "Condition": {"Bool": {"aws:SecureTransport": "false"}},
        }
    ],
}


def outcome(call: Callable[[], Any]) -> str:
    try:
        call()
    except ClientError as error:
        return f"refused {error.response['Error']['Code']}"
    return "allowed"


def user_session(iam: Any, name: str, policy: dict[str, Any]) -> boto3.Session:
    iam.create_user(UserName=name)
    iam.put_user_policy(UserName=name, PolicyName="policy", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName=name)["AccessKey"]
    return boto3.Session(
        aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"], region_name="us-east-1"
    )


@mock_aws
def run_experiment() -> dict[str, str]:
    iam = boto3.client("iam", region_name="us-east-1")
    admin = user_session(
        iam, "admin", {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
    )
    worker = user_session(iam, "worker", POLICY)

    @set_initial_no_auth_action_count(0)
    def enforced() -> dict[str, str]:
        admin.client("dynamodb").create_table(
            TableName="jobs",
            KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        queue = admin.client("sqs").create_queue(QueueName="work")["QueueUrl"]
        s3 = admin.client("s3")
        s3.create_bucket(Bucket=BUCKET)
        s3.put_object(Bucket=BUCKET, Key="input/a", Body=b"1")
        results = {
            "table-scoped PutItem": outcome(
                lambda: worker.client("dynamodb").put_item(TableName="jobs", Item={"k": {"S": "1"}})
            ),
            "queue-scoped SendMessage": outcome(
                lambda: worker.client("sqs").send_message(QueueUrl=queue, MessageBody="m")
            ),
            "ListBucket outside its s3:prefix condition": outcome(
                lambda: worker.client("s3").list_objects_v2(Bucket=BUCKET, Prefix="output/")
            ),
            "PutMetricData inside its namespace condition": outcome(
                lambda: worker.client("cloudwatch").put_metric_data(
                    Namespace="/aws/sagemaker/Endpoints/x", MetricData=[{"MetricName": "m", "Value": 1.0}]
                )
            ),
        }
        s3.put_bucket_policy(Bucket=BUCKET, Policy=json.dumps(TLS_ONLY))
        results["GetObject under a TLS-only bucket policy"] = outcome(
            lambda: worker.client("s3").get_object(Bucket=BUCKET, Key="input/a")
        )
        return results

    return enforced()


def test_moto_builtin_enforcement_cannot_stand_for_aws() -> None:
    # GIVEN moto 5.2's own IAM checks switched on / WHEN a servestack-shaped policy is exercised
    child = subprocess.run(
        [sys.executable, "-m", "tests.functional.test_iam_moto_builtin"],
        cwd=REPO_ROOT,
        # moto's in-process mock, not an emulator another test of this worker pointed AWS_ENDPOINT_URL at
        env={k: v for k, v in os.environ.items() if not k.startswith(("AWS_ENDPOINT_URL", "AWS_PROFILE"))},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    results = json.loads(child.stdout.strip().splitlines()[-1])
    # THEN it differs from AWS in each way the package docstring records
    assert results == {
        # AWS: allowed. moto checks DynamoDB against resource "*", and answers in XML that boto3 cannot parse
        "table-scoped PutItem": "refused 403",
        # AWS: allowed. moto derives SQS queue ARNs, so this one agrees
        "queue-scoped SendMessage": "allowed",
        # AWS: refused. moto ignores StringLike (and every operator but StringEquals)
        "ListBucket outside its s3:prefix condition": "allowed",
        # AWS: allowed. moto names the action after the signing name: monitoring:PutMetricData
        "PutMetricData inside its namespace condition": "refused 403",
        # AWS (over HTTPS): allowed. moto ignores the Bool condition, so the Deny applies to every request
        "GetObject under a TLS-only bucket policy": "refused 403",
    }


if __name__ == "__main__":
    print(json.dumps(run_experiment()))
