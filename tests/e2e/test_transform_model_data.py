"""An `engine: transform` job gets its model as SageMaker gives it: downloaded from the model's `ModelDataUrl`
with the model's execution role when the job starts, then unpacked under the job's `/opt/ml/model`. So the
execution role's `s3:GetObject` on the model data object is exercised: without it, the job fails with
SageMaker's download failure reason and the S3 AccessDenied, as it would in AWS."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator

import pytest

from tests.e2e.conftest import LocalUp, copy_project, start_local_up
from tests.e2e.iam_surface import cli, statements, store, without

pytestmark = pytest.mark.slow
SPEC = """\
models:
  - name: breast-cancer
    version: 1
deployments:
  nightly:
    mode: batch
    model: breast-cancer
    engine: transform
    instance_type: ml.m5.large
    instance_count: 1
"""


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalUp]:
    where = tmp_path_factory.mktemp("transform-model")
    local = start_local_up(where, "--fresh", "--data-dir", str(where / "data"), spec=copy_project(where / "p", SPEC))
    yield local
    assert local.stop() == 0, local.log_text()[-4000:]


def test_the_job_reads_its_model_with_the_execution_role_and_fails_without_the_grant(up: LocalUp) -> None:
    # GIVEN the transform deployment, which runs with every statement of its templates
    run = ["local", "run-batch", "nightly", "--state", str(up.state_path)]
    passed = cli(*run)
    assert passed.returncode == 0, (passed.stdout + passed.stderr)[-3000:]
    # AND the execution role's grant to read the model data (CDK's file asset of the model), which CDK merges
    # into one statement with the grant to read the input
    roles = store(up)["roles"]
    (grant,) = [
        s for s in statements(roles)
        if "TransformRole" in s.role and "s3:GetObject" in s.actions and "-assets-" in json.dumps(s.body["Resource"])
    ]  # fmt: skip
    resources = grant.body["Resource"] if isinstance(grant.body["Resource"], list) else [grant.body["Resource"]]
    (model_data,) = [r for r in resources if "-assets-" in r]
    bucket, key = model_data.removeprefix("arn:aws:s3:::").split("/", 1)
    url = f"s3://{bucket}/{key}"
    # WHEN the job runs with that statement granting the rest of its resources, not the model data
    policies = copy.deepcopy(roles[grant.role]["policies"])
    listed = policies[grant.policy]["Statement"]
    body = listed[grant.index] if isinstance(listed, list) else listed
    rest = [r for r in resources if r != model_data]
    if rest:
        body["Resource"] = rest
        store(up, "PUT", grant.role, policies)
    else:
        store(up, "PUT", grant.role, without(roles, grant))
    try:
        failed = cli(*run)
    finally:
        store(up, "PUT", grant.role, roles[grant.role]["policies"])
    # THEN it fails before any object is transformed, with SageMaker's reason: the URL, the role, the S3 denial
    assert failed.returncode == 1, failed.stdout + failed.stderr
    line = next(x for x in failed.stderr.splitlines() if re.search(r"transform job \S+ Failed", x))
    assert f'Failed to download model data for container "container_1" from URL: "{url}"' in line
    assert re.search(rf"As role arn:aws:\S+/{grant.role}\b", line), line
    assert "AccessDenied" in line
    assert "s3:GetObject" in line
    assert f"arn:aws:s3:::{bucket}/{key}" in line
    assert "local workers" not in failed.stderr
