"""The local scheduler fires an `engine: transform` schedule as EventBridge Scheduler does in AWS: it calls
CreateTransformJob as the schedule's role (on local up's SageMaker API), then the job runs, emulated, and its end
runs the manifest step. A `rate(1 minute)` schedule, so the first run comes within a minute of `local up`."""

from __future__ import annotations

import json
import re
import time

import pytest

from tests.e2e.conftest import LocalUp

pytestmark = pytest.mark.slow
# nightly (`rate(1 minute)`) of the shared local up (tests/e2e/conftest.py's SHARED_SPEC).


def test_a_transform_schedule_creates_its_job_as_its_role_and_the_job_runs(shared_up: LocalUp) -> None:
    # GIVEN a transform deployment on a one-minute schedule, its input seeded with the model's sample
    up = shared_up
    d = up.deployment("nightly")
    assert d.get("seeded"), "local up seeds the input prefix with the model's sample"
    bucket, output = d["input"]["bucket"], d["input"]["output_prefix"]
    # WHEN the schedule fires (within a minute) and the job it creates ends
    s3 = up.emulator("s3")
    deadline = time.monotonic() + 240
    manifest = None
    while manifest is None and time.monotonic() < deadline:
        listed = s3.list_objects_v2(Bucket=bucket, Prefix=f"{output}manifest.json").get("Contents", [])
        if listed:
            manifest = json.loads(s3.get_object(Bucket=bucket, Key=f"{output}manifest.json")["Body"].read())
        else:
            time.sleep(1)
    s3.close()
    log = up.log_text()
    # THEN the manifest step ran over the job's output
    assert manifest is not None, log[-4000:]
    assert manifest["rows"]["total"] > 0
    # AND the job SageMaker would have created is on record, Completed, under the schedule's execution id
    name = re.search(r"transform job (servestack-nightly-[a-z0-9]{16}) Completed", log)
    assert name is not None, log[-4000:]
    sagemaker = up.client("sagemaker")
    described = sagemaker.describe_transform_job(TransformJobName=name.group(1))
    sagemaker.close()
    assert described["TransformJobStatus"] == "Completed"
    assert described["TransformJobArn"].endswith(f":transform-job/{name.group(1)}")
