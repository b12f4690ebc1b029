"""What SageMaker and Lambda do with a role's keys, against the embedded emulator with IAM enforced as local up
runs it: the model data fetched with the execution role (and refused without its S3 read), and a child's log
lines shipped to its log group with its role (the refusal of a role without its logs grant reported once),
EMF lines becoming CloudWatch metrics only once the role's write was accepted."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from servestack.adapters.metrics import OverloadMetrics
from servestack.local.emulator.moto_server import EmbeddedEmulator, client_as
from servestack.local.iam.access import LocalAccess
from servestack.local.iam.identities import Credentials
from servestack.local.logs.shipping import LogShipper, emf_metric_data, ensure_log_group
from servestack.local.sagemaker.model_data import ModelDataError, fetch_model_data, file_assets, publish_model_data
from tests.conftest import ARTIFACTS
from tests.waiting import DEADLINE_SEC, wait_for

REGION = "us-east-1"
BUCKET = "cdk-hnb659fds-assets-123456789012-us-east-1"
KEY = "0123abcd.gz"
GROUP = "/aws/sagemaker/Endpoints/servestack-rt"


@pytest.fixture(scope="module")
def emulator() -> Iterator[tuple[LocalAccess, str]]:
    access = LocalAccess(log=lambda line: None)
    server = EmbeddedEmulator(middleware=access.middleware)
    yield access, server.url
    server.stop()


def role(access: LocalAccess, name: str, *statements: dict[str, Any]) -> Credentials:
    document = {"Version": "2012-10-17", "Statement": list(statements)}
    return access.credentials_for(f"arn:aws:iam::123456789012:role/{name}", (document,))


def model_archive() -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name in ("model.onnx", "manifest.json"):
            tar.add(ARTIFACTS / "digits/1" / name, arcname=f"digits/1/{name}")
    return gzip.compress(raw.getvalue())


def assembly(out_dir: Path) -> Path:
    """A cloud assembly holding one file asset, the model data, as `cdk synth` writes it."""
    out_dir.mkdir()
    (out_dir / "asset.0123abcd.tar.gz").write_bytes(model_archive())
    destination = {"bucketName": "cdk-hnb659fds-assets-${AWS::AccountId}-${AWS::Region}", "objectKey": KEY}
    assets = {"files": {"0123abcd": {"source": {"path": "asset.0123abcd.tar.gz", "packaging": "file"},
                                     "destinations": {"current": destination}}}}  # fmt: skip
    (out_dir / "stack.assets.json").write_text(json.dumps(assets))
    return out_dir


def test_the_model_data_is_published_then_fetched_with_the_execution_role(
    emulator: tuple[LocalAccess, str], tmp_path: Path
) -> None:
    access, url = emulator
    out_dir = assembly(tmp_path / "cdk.out")
    assert set(file_assets(out_dir)) == {KEY}
    developer = client_as("s3", url, access.developer, REGION)
    # WHEN the deploy publishes the asset where the model's URL points (twice: the second finds it there)
    assert publish_model_data(developer, out_dir, [f"s3://{BUCKET}/{KEY}"]) == [f"s3://{BUCKET}/{KEY}"]
    assert publish_model_data(developer, out_dir, [f"s3://{BUCKET}/{KEY}"]) == []
    # AND SageMaker fetches it with a role allowed to read that object
    reader = role(access, "reader", {"Effect": "Allow", "Action": "s3:GetObject",
                                     "Resource": f"arn:aws:s3:::{BUCKET}/{KEY}"})  # fmt: skip
    model_dir = tmp_path / "variant" / "opt/ml/model"
    fetch_model_data(client_as("s3", url, reader, REGION), f"s3://{BUCKET}/{KEY}", model_dir, role=reader.arn)
    # THEN the archive is unpacked under the variant's /opt/ml/model
    assert (model_dir / "digits/1/model.onnx").read_bytes() == (ARTIFACTS / "digits/1/model.onnx").read_bytes()


def test_without_the_roles_s3_read_the_fetch_fails_with_access_denied(
    emulator: tuple[LocalAccess, str], tmp_path: Path
) -> None:
    access, url = emulator
    publish_model_data(client_as("s3", url, access.developer, REGION), assembly(tmp_path / "cdk.out"),
                       [f"s3://{BUCKET}/{KEY}"])  # fmt: skip
    logs_only = role(access, "no-s3", {"Effect": "Allow", "Action": "logs:PutLogEvents", "Resource": "*"})
    with pytest.raises(ModelDataError) as raised:
        fetch_model_data(client_as("s3", url, logs_only, REGION), f"s3://{BUCKET}/{KEY}", tmp_path / "m",
                         role=logs_only.arn)  # fmt: skip
    said = str(raised.value)
    assert said.startswith(f'Failed to download model data for container "container_1" from URL: "s3://{BUCKET}/{KEY}"')
    assert "AccessDenied" in said
    assert "s3:GetObject" in said
    assert f"arn:aws:s3:::{BUCKET}/{KEY}" in said


def shipper(access: LocalAccess, url: str, keys: Credentials, stream: str, said: list[str]) -> LogShipper:
    return LogShipper(
        name="rt/endpoint", logs=client_as("logs", url, keys, REGION), group=GROUP, stream=stream, role=keys.arn,
        report=said.append, metrics=client_as("cloudwatch", url, access.developer, REGION),
    )  # fmt: skip


def emf_line() -> str:
    metrics = OverloadMetrics(list, endpoint_name="servestack-rt", variant_name="primary", interval_sec=10)
    metrics.sample()
    return json.dumps(metrics.line())


def test_an_archive_reaching_outside_the_model_folder_is_refused(
    emulator: tuple[LocalAccess, str], tmp_path: Path
) -> None:
    # GIVEN model data whose archive holds a member addressed `../../escaped.txt`
    access, url = emulator
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        member = tmp_path / "m.txt"
        member.write_text("model")
        tar.add(member, arcname="../../escaped.txt")
    evil_key = "evil9999.gz"
    developer = client_as("s3", url, access.developer, REGION)
    publish_model_data(
        developer, assembly(tmp_path / "cdk.out"), [f"s3://{BUCKET}/{KEY}"]
    )  # the bucket, as deploy makes it
    developer.put_object(Bucket=BUCKET, Key=evil_key, Body=gzip.compress(raw.getvalue()))
    reader = role(access, "evil-reader", {"Effect": "Allow", "Action": "s3:GetObject",
                                          "Resource": f"arn:aws:s3:::{BUCKET}/{evil_key}"})  # fmt: skip
    # WHEN SageMaker's fetch unpacks it under the variant's /opt/ml/model
    model_dir = tmp_path / "variant" / "opt/ml/model"
    with pytest.raises(ModelDataError):
        fetch_model_data(client_as("s3", url, reader, REGION), f"s3://{BUCKET}/{evil_key}", model_dir,
                         role=reader.arn)  # fmt: skip
    # THEN nothing was written outside the model folder
    assert not list(tmp_path.rglob("escaped.txt"))


def test_log_lines_and_emf_metrics_go_through_the_roles_logs_grant(
    emulator: tuple[LocalAccess, str],
) -> None:
    access, url = emulator
    ensure_log_group(client_as("logs", url, access.developer, REGION), GROUP)
    grant = {
        "Effect": "Allow",
        "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
        "Resource": f"arn:aws:logs:{REGION}:123456789012:log-group:{GROUP}:*",
    }
    writer = role(access, "writer", grant)
    said: list[str] = []
    ship = shipper(access, url, writer, "primary/allowed", said)
    ship("serving digits@1")
    ship(emf_line())
    ship.close(timeout_sec=DEADLINE_SEC)  # once both are shipped
    logs = client_as("logs", url, access.developer, REGION)
    events = logs.get_log_events(logGroupName=GROUP, logStreamName="primary/allowed")["events"]
    assert [e["message"] for e in events][:1] == ["serving digits@1"]
    assert said == []
    metrics = client_as("cloudwatch", url, access.developer, REGION).list_metrics(Namespace="servestack")["Metrics"]
    assert {m["MetricName"] for m in metrics} == {"QueueDepth", "InFlight", "Rejected"}
    assert {"Name": "EndpointName", "Value": "servestack-rt"} in metrics[0]["Dimensions"]


def test_a_role_without_its_logs_grant_is_reported_once(emulator: tuple[LocalAccess, str]) -> None:
    access, url = emulator
    ensure_log_group(client_as("logs", url, access.developer, REGION), GROUP)
    # GIVEN a role without its logs grant
    mute = role(access, "mute", {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*"})
    said: list[str] = []
    ship = shipper(access, url, mute, "primary/denied", said)
    # WHEN a first line is shipped and refused, and then a second one (a batch of its own, refused again)
    ship("first")
    wait_for(lambda: said, "the first batch's refusal")
    ship("second")
    ship.close(timeout_sec=DEADLINE_SEC)
    # THEN the refusal is reported once
    assert len(said) == 1, said
    assert said[0].startswith(f"rt/endpoint cannot write its logs to {GROUP} as {mute.arn}: AccessDenied")
    assert "logs:CreateLogStream" in said[0]


def test_emf_documents_become_metric_data() -> None:
    namespace, data = emf_metric_data(emf_line()) or ("", [])
    assert namespace == "servestack"
    assert [d["MetricName"] for d in data] == ["QueueDepth", "InFlight", "Rejected"]
    assert data[0]["Values"] == [0.0]
    assert emf_metric_data("an ordinary line") is None
    assert emf_metric_data('{"_aws": "not emf"}') is None
