"""local up's SageMaker Runtime front refuses what SageMaker refuses: one test per rule of
docs/sagemaker-strictness.md, each through a real boto3 client, asserting the error code boto3 raises.

The front runs in this process in front of the real realtime container (`serve`, a subprocess); a second,
deliberately slow HTTP server stands in for a container that misses SageMaker's deadline.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from servestack.local.iam.access import LocalAccess
from servestack.local.lambda_.service import LambdaService
from servestack.local.sagemaker.inference_components import ComponentState, InferenceComponents
from servestack.local.sagemaker.runtime_front import (
    COMPONENT_NAME_REQUIRED,
    MAX_BODY_BYTES,
    NO_CAPACITY,
    AsyncTarget,
    RealtimeTarget,
    SageMakerRuntime,
)
from servestack.local.sagemaker.transform_jobs import REPORT_PREFIX, TransformJobs
from servestack.local.up.aws_front import AwsFront
from tests.conftest import ARTIFACTS, RealtimeServer
from tests.waiting import DEADLINE_SEC

pytestmark = pytest.mark.slow
DIGITS = (ARTIFACTS / "digits/1/sample-request.json").read_bytes()


# The front's deadline for a container's answer (60 s in local up): far above what the real container takes to
# answer a digits request on a busy machine (milliseconds), and what the slow one below always misses.
FRONT_DEADLINE_SEC = 3.0
# Set when the module's front stops: until then the slow container answers nothing.
SLOW_CONTAINER_RELEASED = threading.Event()


class SlowContainer(BaseHTTPRequestHandler):
    """Answers /invocations only once the module's tests are over: past the front's deadline, however long the
    front takes to notice."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        SLOW_CONTAINER_RELEASED.wait(DEADLINE_SEC)
        try:
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")
        except OSError:  # the front gave up on it first, as it should
            return

    def log_message(self, format: str, *args: Any) -> None:
        return None


class FakeS3:
    """The one S3 call the async rule needs: the input's size (a 1 GB object is too big to make here)."""

    def __init__(self, sizes: dict[str, int]) -> None:
        self.sizes = sizes

    def head_object(self, Bucket: str, Key: str) -> dict[str, int]:  # noqa: N803 - boto3's argument names
        return {"ContentLength": self.sizes[f"{Bucket}/{Key}"]}


def component(name: str, copies: int) -> ComponentState:
    arn = f"arn:aws:sagemaker:us-east-1:123456789012:inference-component/{name}"
    endpoint = "arn:aws:sagemaker:us-east-1:123456789012:endpoint/components"
    return ComponentState(name, arn, "components", endpoint, "primary", "m-digits", {}, copies, copies)


class RecordingScaler:
    """Stands for the endpoint's router: records each copy count asked, and can be told to fail."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.fail = False

    def __call__(self, state: ComponentState, copies: int) -> None:
        self.calls.append((state.name, copies))
        if self.fail:
            raise RuntimeError("the router is not answering")


COMPONENTS = {
    "components-digits": component("components-digits", 1),
    "components-idle": component("components-idle", 0),
}
SCALER = RecordingScaler()


@pytest.fixture(scope="module")
def front(realtime_server: RealtimeServer) -> Iterator[str]:
    slow = ThreadingHTTPServer(("127.0.0.1", 0), SlowContainer)
    threading.Thread(target=slow.serve_forever, daemon=True).start()
    submitted: list[str] = []
    runtime = SageMakerRuntime(
        {
            "single": RealtimeTarget(realtime_server.url, ("primary",)),
            "two-variants": RealtimeTarget(realtime_server.url, ("blue", "green")),
            "slow": RealtimeTarget(f"http://127.0.0.1:{slow.server_address[1]}", ("primary",)),
            # An endpoint hosting inference components (the container stands in for the endpoint's router).
            "components": RealtimeTarget(realtime_server.url, ("primary",), components=COMPONENTS),
        },
        {"async-ep": AsyncTarget(lambda b, k, c, a, i: (submitted.append(i) or f"s3://out/{i}.out", None))},
        FakeS3({"in/big": 1024**3 + 1, "in/small": 10}),
        invocation_timeout_sec=FRONT_DEADLINE_SEC,
    )
    lambdas = LambdaService([])
    server = AwsFront(
        runtime, lambdas, LocalAccess(enforced=False), components=InferenceComponents(COMPONENTS, SCALER),
        transform_jobs=TransformJobs(["m-digits"], "us-east-1", "123456789012"),
    )  # fmt: skip
    server.serve_in_background()
    yield server.url
    for client in CLIENTS:
        client.close()
    server.close()
    lambdas.close()
    SLOW_CONTAINER_RELEASED.set()
    slow.shutdown()
    slow.server_close()


# Every client the tests make, closed when the front stops (a client collected mid-test would close its pooled
# connections from the garbage collector, a ResourceWarning in whichever test runs then).
CLIENTS: list[Any] = []


def runtime_client(url: str) -> Any:
    session = boto3.session.Session(aws_access_key_id="local", aws_secret_access_key="local", region_name="us-east-1")
    config = Config(retries={"mode": "standard", "max_attempts": 1}, read_timeout=30)
    client = session.client("sagemaker-runtime", endpoint_url=url, config=config)
    CLIENTS.append(client)
    return client


def error_of(call: Any) -> dict[str, Any]:
    with pytest.raises(ClientError) as raised:
        call()
    return dict(raised.value.response)


def test_a_single_model_endpoint_answers_without_target_model(front: str) -> None:
    # GIVEN a single-model endpoint WHEN invoked plainly THEN the container answers through the front
    response = runtime_client(front).invoke_endpoint(EndpointName="single", Body=DIGITS, ContentType="application/json")
    assert response["InvokedProductionVariant"] == "primary"
    assert b"predictions" in response["Body"].read()


def test_target_model_on_a_single_model_endpoint_is_a_validation_error(front: str) -> None:
    # WHEN TargetModel is set on an endpoint whose container runs in SingleModel mode
    error = error_of(
        lambda: runtime_client(front).invoke_endpoint(
            EndpointName="single", Body=DIGITS, ContentType="application/json", TargetModel="digits/1.tar.gz"
        )
    )
    # THEN boto3 raises ValidationError with SageMaker's words
    assert error["Error"]["Code"] == "ValidationError"
    assert error["Error"]["Message"] == (
        "Endpoint single is not a multi-model endpoint and does not support target model header."
    )


def test_an_unknown_endpoint_is_a_validation_error(front: str) -> None:
    error = error_of(lambda: runtime_client(front).invoke_endpoint(EndpointName="nope", Body=DIGITS))
    assert error["Error"]["Code"] == "ValidationError"
    assert error["Error"]["Message"] == "Endpoint nope of account 123456789012 not found."


def test_an_unknown_target_variant_is_a_validation_error(front: str) -> None:
    # GIVEN an endpoint with variants blue and green WHEN TargetVariant names another
    error = error_of(
        lambda: runtime_client(front).invoke_endpoint(
            EndpointName="two-variants", Body=DIGITS, ContentType="application/json", TargetVariant="red"
        )
    )
    # THEN ValidationError naming the variant
    assert error["Error"]["Code"] == "ValidationError"
    assert "red" in error["Error"]["Message"]


def test_a_body_over_six_megabytes_is_refused_with_413(front: str) -> None:
    body = b"[" + b"0," * (MAX_BODY_BYTES // 2) + b"0]"
    error = error_of(
        lambda: runtime_client(front).invoke_endpoint(EndpointName="single", Body=body, ContentType="application/json")
    )
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 413
    assert error["Error"]["Code"] == "413"
    assert error["Error"]["Message"] == "HTTP content length exceeded 6291456 bytes."


def test_a_container_past_the_deadline_is_a_model_error_with_status_zero(front: str) -> None:
    # GIVEN a container that answers nothing within the front's deadline (60 s in local up, 3 s here)
    error = error_of(lambda: runtime_client(front).invoke_endpoint(EndpointName="slow", Body=DIGITS))
    # THEN ModelError (424) with OriginalStatusCode 0 and SageMaker's timeout message
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 424
    assert error["Error"]["Code"] == "ModelError"
    assert error["OriginalStatusCode"] == 0
    assert "Your invocation timed out while waiting for a response from container primary." in error["Error"]["Message"]


def test_async_without_input_location_is_a_validation_error(front: str) -> None:
    # botocore demands InputLocation; send the raw request SageMaker would still have to refuse
    import httpx

    response = httpx.post(f"{front}/endpoints/async-ep/async-invocations", content=b"{}")
    assert response.status_code == 400
    assert response.headers["x-amzn-ErrorType"] == "ValidationError"


def test_async_input_over_one_gigabyte_is_a_validation_error(front: str) -> None:
    client = runtime_client(front)
    error = error_of(lambda: client.invoke_endpoint_async(EndpointName="async-ep", InputLocation="s3://in/big"))
    assert error["Error"]["Code"] == "ValidationError"
    assert "1 GB" in error["Error"]["Message"]
    # AND an input within the limit is accepted, with its output location
    accepted = client.invoke_endpoint_async(EndpointName="async-ep", InputLocation="s3://in/small", InferenceId="j1")
    assert accepted["InferenceId"] == "j1"
    assert accepted["OutputLocation"] == "s3://out/j1.out"


def test_async_on_a_realtime_endpoint_names_the_right_operation(front: str) -> None:
    error = error_of(
        lambda: runtime_client(front).invoke_endpoint_async(EndpointName="single", InputLocation="s3://in/small")
    )
    assert error["Error"]["Code"] == "ValidationError"
    assert "call InvokeEndpoint" in error["Error"]["Message"]


# ------------------------------------------------------------------------------------------ inference components


def test_an_inference_component_answers_under_its_variant(front: str) -> None:
    # GIVEN an endpoint hosting components WHEN boto3 names one with InferenceComponentName
    response = runtime_client(front).invoke_endpoint(
        EndpointName="components", InferenceComponentName="components-digits", Body=DIGITS,
        ContentType="application/json",
    )  # fmt: skip
    # THEN its container answers, reported under the variant that hosts it
    assert response["InvokedProductionVariant"] == "primary"
    assert b"predictions" in response["Body"].read()


def test_no_component_name_on_an_endpoint_with_components_is_a_validation_error(front: str) -> None:
    error = error_of(lambda: runtime_client(front).invoke_endpoint(EndpointName="components", Body=DIGITS))

    assert error["Error"]["Code"] == "ValidationError"
    assert error["Error"]["Message"] == COMPONENT_NAME_REQUIRED
    assert error["Error"]["Message"].startswith("Inference Component Name header is required for endpoints")


def test_an_unknown_component_is_a_validation_error(front: str) -> None:
    client = runtime_client(front)
    # WHEN the name is no component of the endpoint, or the endpoint hosts no components at all
    unknown = error_of(
        lambda: client.invoke_endpoint(EndpointName="components", InferenceComponentName="nope", Body=DIGITS)
    )
    plain = error_of(
        lambda: client.invoke_endpoint(EndpointName="single", InferenceComponentName="components-digits", Body=DIGITS)
    )
    # THEN ValidationError naming the component
    assert (unknown["Error"]["Code"], plain["Error"]["Code"]) == ("ValidationError", "ValidationError")
    assert unknown["Error"]["Message"] == "Inference Component nope of account 123456789012 not found."
    assert "components-digits" in plain["Error"]["Message"]


def test_target_model_on_an_endpoint_with_components_is_a_validation_error(front: str) -> None:
    error = error_of(
        lambda: runtime_client(front).invoke_endpoint(
            EndpointName="components", InferenceComponentName="components-digits", TargetModel="digits/1.tar.gz",
            Body=DIGITS,
        )
    )  # fmt: skip
    assert error["Error"]["Code"] == "ValidationError"
    assert "is not a multi-model endpoint" in error["Error"]["Message"]


def test_a_component_with_no_copy_has_no_capacity(front: str) -> None:
    # GIVEN a component at zero copies WHEN it is invoked
    error = error_of(
        lambda: runtime_client(front).invoke_endpoint(
            EndpointName="components", InferenceComponentName="components-idle", Body=DIGITS
        )
    )
    # THEN SageMaker's ValidationError for a component without capacity, with its words
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert error["Error"]["Code"] == "ValidationError"
    assert error["Error"]["Message"] == NO_CAPACITY


def sagemaker_client(url: str) -> Any:
    session = boto3.session.Session(aws_access_key_id="local", aws_secret_access_key="local", region_name="us-east-1")
    config = Config(retries={"mode": "standard", "max_attempts": 1})
    client = session.client("sagemaker", endpoint_url=url, config=config)
    CLIENTS.append(client)
    return client


def wait_in_service(client: Any, name: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        described: dict[str, Any] = client.describe_inference_component(InferenceComponentName=name)
        if described["InferenceComponentStatus"] != "Updating" or time.monotonic() > deadline:
            return described
        time.sleep(0.05)


def test_copies_set_by_update_runtime_config_open_and_close_capacity(front: str) -> None:
    control, runtime = sagemaker_client(front), runtime_client(front)
    SCALER.calls.clear()
    # WHEN boto3's sagemaker client scales a component to zero
    answer = control.update_inference_component_runtime_config(
        InferenceComponentName="components-digits", DesiredRuntimeConfig={"CopyCount": 0}
    )
    assert answer["InferenceComponentArn"].endswith(":inference-component/components-digits")
    described = wait_in_service(control, "components-digits")
    # THEN it reports no copy, and invoking it is SageMaker's no-capacity error
    assert described["RuntimeConfig"] == {"DesiredCopyCount": 0, "CurrentCopyCount": 0}
    assert described["InferenceComponentStatus"] == "InService"
    error = error_of(
        lambda: runtime.invoke_endpoint(
            EndpointName="components", InferenceComponentName="components-digits", Body=DIGITS
        )
    )
    assert error["Error"]["Message"] == NO_CAPACITY
    # WHEN it is given two copies again THEN once they serve, it answers
    control.update_inference_component_runtime_config(
        InferenceComponentName="components-digits", DesiredRuntimeConfig={"CopyCount": 2}
    )
    assert wait_in_service(control, "components-digits")["RuntimeConfig"] == {
        "DesiredCopyCount": 2, "CurrentCopyCount": 2,
    }  # fmt: skip
    response = runtime.invoke_endpoint(
        EndpointName="components", InferenceComponentName="components-digits", Body=DIGITS,
        ContentType="application/json",
    )  # fmt: skip
    assert response["InvokedProductionVariant"] == "primary"
    # Read the body: an unread StreamingBody keeps its pooled connection until it is garbage collected.
    assert b"predictions" in response["Body"].read()
    assert SCALER.calls == [("components-digits", 0), ("components-digits", 2)]


def test_a_scaling_that_fails_leaves_the_component_failed_with_the_reason(front: str) -> None:
    control = sagemaker_client(front)
    SCALER.fail = True
    try:
        control.update_inference_component_runtime_config(
            InferenceComponentName="components-idle", DesiredRuntimeConfig={"CopyCount": 1}
        )
        described = wait_in_service(control, "components-idle")
    finally:
        SCALER.fail = False
    assert described["InferenceComponentStatus"] == "Failed"
    assert described["FailureReason"] == "the router is not answering"
    assert described["RuntimeConfig"]["CurrentCopyCount"] == 0


def test_the_control_plane_refuses_an_unknown_component_and_other_operations(front: str) -> None:
    control = sagemaker_client(front)
    unknown = error_of(lambda: control.describe_inference_component(InferenceComponentName="nope"))
    other = error_of(lambda: control.describe_endpoint(EndpointName="components"))

    assert unknown["Error"]["Code"] == "ValidationException"
    assert "nope" in unknown["Error"]["Message"]
    assert other["Error"]["Code"] == "UnknownOperationException"
    assert "DescribeInferenceComponent and UpdateInferenceComponentRuntimeConfig" in other["Error"]["Message"]


# ------------------------------------------------------------------------------------------ transform jobs


def transform_job(name: str, **changes: Any) -> dict[str, Any]:
    """The CreateTransformJob request an engine: transform schedule sends (servestack/cdk/transform_job.py),
    with `changes`."""
    request: dict[str, Any] = {
        "TransformJobName": name,
        "ModelName": "m-digits",
        "MaxConcurrentTransforms": 2,
        "MaxPayloadInMB": 6,
        "BatchStrategy": "MultiRecord",
        "TransformInput": {
            "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://bucket/in/"}},
            "ContentType": "application/jsonlines",
            "SplitType": "Line",
        },
        "TransformOutput": {"S3OutputPath": "s3://bucket/out", "AssembleWith": "Line"},
        "TransformResources": {"InstanceType": "ml.m5.large", "InstanceCount": 1},
    }
    return request | changes


def unvalidated_client(url: str) -> Any:
    """boto3's sagemaker client without its own parameter checks: sends what SageMaker itself must refuse."""
    session = boto3.session.Session(aws_access_key_id="local", aws_secret_access_key="local", region_name="us-east-1")
    config = Config(retries={"mode": "standard", "max_attempts": 1}, parameter_validation=False)
    client = session.client("sagemaker", endpoint_url=url, config=config)
    CLIENTS.append(client)
    return client


def test_a_transform_job_is_created_in_progress_then_reports_its_end(front: str) -> None:
    from tests.control import control as signed_control

    control = sagemaker_client(front)
    # WHEN a job is created with a mixed-case name
    created = control.create_transform_job(**transform_job("Nightly-d32c5kddcf5bb8c3"))
    # THEN its ARN carries the name lower-cased, and it is InProgress
    assert created["TransformJobArn"] == (
        "arn:aws:sagemaker:us-east-1:123456789012:transform-job/nightly-d32c5kddcf5bb8c3"
    )
    described = control.describe_transform_job(TransformJobName="Nightly-d32c5kddcf5bb8c3")
    assert described["TransformJobStatus"] == "InProgress"
    assert described["TransformResources"] == {"InstanceType": "ml.m5.large", "InstanceCount": 1}
    # WHEN the emulation reports that it failed (a control route: the developer's signature) THEN
    # DescribeTransformJob says Failed, with the reason
    reported = signed_control(
        "POST", f"{front}{REPORT_PREFIX}Nightly-d32c5kddcf5bb8c3", {"status": "Failed", "reason": "in/a.jsonl: 500"}
    )
    assert reported.status_code == 200
    ended = control.describe_transform_job(TransformJobName="Nightly-d32c5kddcf5bb8c3")
    assert (ended["TransformJobStatus"], ended["FailureReason"]) == ("Failed", "in/a.jsonl: 500")
    assert "TransformEndTime" in ended


def test_a_transform_job_name_outside_sagemakers_pattern_is_a_validation_exception(front: str) -> None:
    error = error_of(lambda: sagemaker_client(front).create_transform_job(**transform_job("nightly_run")))

    assert error["Error"]["Code"] == "ValidationException"
    assert error["Error"]["Message"] == (
        "1 validation error detected: Value 'nightly_run' at 'transformJobName' failed to satisfy constraint: "
        "Member must satisfy regular expression pattern: ^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}"
    )


def test_a_transform_job_name_over_63_characters_is_a_validation_exception(front: str) -> None:
    error = error_of(lambda: sagemaker_client(front).create_transform_job(**transform_job("a" * 64)))

    assert error["Error"]["Code"] == "ValidationException"
    assert (
        "at 'transformJobName' failed to satisfy constraint: Member must have length between 1 and 63"
        in (error["Error"]["Message"])
    )


def test_a_transform_job_of_an_unknown_model_is_a_validation_exception(front: str) -> None:
    error = error_of(
        lambda: sagemaker_client(front).create_transform_job(**transform_job("no-model-1", ModelName="nope"))
    )

    assert error["Error"]["Code"] == "ValidationException"
    assert error["Error"]["Message"] == 'Could not find model "arn:aws:sagemaker:us-east-1:123456789012:model/nope".'


def test_a_transform_job_without_a_required_member_is_a_validation_exception(front: str) -> None:
    # GIVEN a request without TransformResources (botocore would refuse it before sending: sent unchecked)
    request = transform_job("no-resources-1")
    del request["TransformResources"]
    error = error_of(lambda: unvalidated_client(front).create_transform_job(**request))

    assert error["Error"]["Code"] == "ValidationException"
    assert (
        "Value null at 'transformResources' failed to satisfy constraint: Member must not be null"
        in (error["Error"]["Message"])
    )


def test_max_payload_over_100_mb_is_a_validation_exception(front: str) -> None:
    # botocore's model has no maximum here, so boto3 sends it: SageMaker refuses it
    error = error_of(
        lambda: sagemaker_client(front).create_transform_job(**transform_job("big-payload-1", MaxPayloadInMB=101))
    )

    assert error["Error"]["Code"] == "ValidationException"
    assert "Value '101' at 'maxPayloadInMB'" in error["Error"]["Message"]
    assert "less than or equal to 100" in error["Error"]["Message"]


def test_zero_instances_is_a_validation_exception(front: str) -> None:
    request = transform_job("no-instances-1", TransformResources={"InstanceType": "ml.m5.large", "InstanceCount": 0})
    error = error_of(lambda: unvalidated_client(front).create_transform_job(**request))

    assert error["Error"]["Code"] == "ValidationException"
    assert error["Error"]["Message"] == (
        "1 validation error detected: Value '0' at 'transformResources.instanceCount' failed to satisfy "
        "constraint: Member must have value greater than or equal to 1"
    )


def test_an_instance_type_transform_does_not_offer_is_a_validation_exception(front: str) -> None:
    request = transform_job("wrong-type-1", TransformResources={"InstanceType": "ml.t2.medium", "InstanceCount": 1})
    error = error_of(lambda: sagemaker_client(front).create_transform_job(**request))

    assert error["Error"]["Code"] == "ValidationException"
    assert (
        "Value 'ml.t2.medium' at 'transformResources.instanceType' failed to satisfy constraint: Member must "
        "satisfy enum value set" in error["Error"]["Message"]
    )


def test_a_transform_job_name_already_used_is_resource_in_use(front: str) -> None:
    control = sagemaker_client(front)
    control.create_transform_job(**transform_job("twice-1"))
    # WHEN the same name is created again THEN ResourceInUse (a job's name is never reused)
    error = error_of(lambda: control.create_transform_job(**transform_job("twice-1")))

    assert error["Error"]["Code"] == "ResourceInUse"
    assert "twice-1" in error["Error"]["Message"]


def test_describing_an_unknown_transform_job_is_a_validation_exception(front: str) -> None:
    error = error_of(lambda: sagemaker_client(front).describe_transform_job(TransformJobName="never-created"))

    assert error["Error"]["Code"] == "ValidationException"
    assert error["Error"]["Message"] == "Could not find requested job with name never-created"


def test_a_transform_job_over_an_empty_input_prefix_is_refused_before_it_exists() -> None:
    # GIVEN local up's transform jobs, whose input listing finds nothing under the job's prefix
    listed: list[tuple[str, str]] = []
    role = "arn:aws:iam::123456789012:role/transform-execution"

    def has_objects(bucket: str, prefix: str) -> bool:
        listed.append((bucket, prefix))
        return False

    jobs = TransformJobs(["m-digits"], "us-east-1", "123456789012", has_objects=has_objects,
                         model_roles={"m-digits": role})  # fmt: skip
    # WHEN a job over that prefix is created
    reply = jobs.create(transform_job("empty-d32c5kddcf5bb8c3"))
    # THEN SageMaker's refusal comes back, in its words, and no job was recorded
    assert reply.status == 400
    assert listed == [("bucket", "in/")]
    assert json.loads(reply.body) == {
        "__type": "ValidationException",
        "message": 'No S3 objects found under S3 URL "s3://bucket/in/" given in input data source. Please ensure '
        "that the bucket exists in the selected region (us-east-1), that objects exist under that S3 prefix, and "
        f'that the role "{role}" has "s3:ListBucket" permissions on bucket "bucket".',
    }
    assert jobs.jobs == {}
