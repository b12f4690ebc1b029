"""Admin surfaces of `local up` no caller of the emulated AWS can reach: moto's admin API on the emulator port is
refused unless `--allow-reset`, and an endpoint router's `/_servestack/` routes answer only on its control port
(recorded in the state file, used by the CLI), never on the port callers invoke."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from servestack.local.emulator.moto_server import EmbeddedEmulator, clients
from servestack.local.hosting.http_server import Request
from servestack.local.iam import DEVELOPER
from servestack.local.sagemaker.inference_components import ComponentState, InferenceComponents, copies_on_router
from tests.conftest import ARTIFACTS
from tests.control import control
from tests.functional.test_router import RouterProcess


@pytest.fixture
def emulator() -> Iterator[EmbeddedEmulator]:
    started = EmbeddedEmulator()
    yield started
    started.stop()


@pytest.mark.parametrize("path", ["/moto-api/reset", "//moto-api/reset", "/MOTO-API/reset", "/%6Doto-api/reset"])
def test_moto_reset_is_refused_and_wipes_nothing(emulator: EmbeddedEmulator, path: str) -> None:
    s3 = clients(emulator.url)["s3"]
    s3.create_bucket(Bucket="kept")
    # (moto's backends are one per process: buckets of other tests in this worker may be there too)
    before = [b["Name"] for b in s3.list_buckets()["Buckets"]]
    assert "kept" in before
    # WHEN an unsigned caller posts moto's reset (spelled any way moto would still route it)
    answer = httpx.post(f"{emulator.url}{path}")
    # THEN it is a 403 with a JSON body saying how to allow it, and the bucket is still there
    assert answer.status_code == 403, answer.text
    error = answer.json()["error"]
    assert error["type"] == "AccessDenied"
    assert "--allow-reset" in error["message"]
    assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == before


def test_the_rest_of_moto_api_is_refused_too(emulator: EmbeddedEmulator) -> None:
    assert httpx.get(f"{emulator.url}/moto-api/data.json").status_code == 403


def test_allow_reset_lets_moto_reset_through() -> None:
    emulator = EmbeddedEmulator(allow_admin=True)
    try:
        s3 = clients(emulator.url)["s3"]
        s3.create_bucket(Bucket="wiped")
        assert httpx.post(f"{emulator.url}/moto-api/reset").status_code == 200
        assert s3.list_buckets()["Buckets"] == []
    finally:
        emulator.stop()


@pytest.fixture
def enforced_emulator() -> Iterator[EmbeddedEmulator]:
    """The emulator as local up runs it: behind the IAM enforcer, which puts a virtual-hosted bucket in the path."""
    from servestack.local.iam.access import LocalAccess

    started = EmbeddedEmulator(middleware=LocalAccess(log=lambda line: None).middleware)
    yield started
    started.stop()


def developer_s3(method: str, url: str, host: str) -> httpx.Response:
    """An S3 request signed with the developer's keys (an administrator), sent with `host` as its Host."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    from servestack.local.iam import DEVELOPER

    headers = {"Host": host, "X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD"}
    request = AWSRequest(method=method, url=url, headers=headers)
    S3SigV4Auth(Credentials(DEVELOPER.access_key_id, DEVELOPER.secret_access_key), "s3", "us-east-1").add_auth(request)
    return httpx.request(method, url, headers=dict(request.headers.items()))


@pytest.mark.parametrize(("method", "path"), [("POST", "/reset"), ("GET", "/data.json"), ("POST", "/seed?a=1")])
@pytest.mark.parametrize("name", ["localhost", "127.0.0.1"])
def test_moto_api_as_a_virtual_hosted_bucket_is_refused_too(
    enforced_emulator: EmbeddedEmulator, method: str, path: str, name: str
) -> None:
    s3 = clients(enforced_emulator.url)["s3"]
    s3.create_bucket(Bucket="kept-vhost")
    before = [b["Name"] for b in s3.list_buckets()["Buckets"]]
    port = enforced_emulator.url.rsplit(":", 1)[1]
    # WHEN the developer signs `POST /reset` (or reads `/data.json`) for the bucket `moto-api`, by its Host: the
    # enforcer rewrites it to `/moto-api/reset`, the path moto routes to its admin API
    answer = developer_s3(method, f"{enforced_emulator.url}{path}", f"moto-api.{name}:{port}")
    # THEN it is refused as moto will route it, and nothing was wiped or dumped
    assert answer.status_code == 403, answer.text
    assert answer.json()["error"]["type"] == "AccessDenied"
    assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == before


@pytest.fixture
def component_router(tmp_path: Path) -> Iterator[RouterProcess]:
    component = {"name": "ep-digits", "model": "digits", "version": "1", "weight": 1, "component": "ep-digits",
                 "package_dir": str(ARTIFACTS / "digits" / "1")}  # fmt: skip
    started = RouterProcess.start(tmp_path, "digits-ic", [component])
    yield started
    started.stop()


@pytest.mark.slow
def test_router_admin_routes_answer_only_on_the_control_port(component_router: RouterProcess) -> None:
    public = component_router.url
    # WHEN a caller of the endpoint's port tries to stop a component, read metrics or start a rehearsal
    for method, path, body in [
        ("POST", "/_servestack/components/ep-digits", {"copies": 0}),
        ("GET", "/_servestack/metrics", None),
        ("GET", "/_servestack/components", None),
        ("POST", "/_servestack/deploy", {"version": "1"}),
    ]:
        answer = httpx.request(method, f"{public}{path}", json=body)
        # THEN it is refused with a JSON 403 and nothing changes
        assert answer.status_code == 403, (path, answer.status_code, answer.text)
        assert answer.json()["error"]["type"] == "AccessDenied"
    control_url = component_router.control_url
    assert control_url != public
    components = control("GET", f"{control_url}/_servestack/components").json()
    assert components["ep-digits"]["copies"] == 1
    assert components["ep-digits"]["backends"] == ["ep-digits"]
    # AND the control port does what the CLI asks
    stopped = control("POST", f"{control_url}/_servestack/components/ep-digits", {"copies": 0}, timeout=60).json()
    assert stopped["ep-digits"] == {"copies": 0, "backends": [], "serving": 0}
    refused = httpx.post(f"{public}/invocations", headers={"X-Amzn-SageMaker-Inference-Component": "ep-digits"},
                         content=json.dumps({"instances": [[0.0] * 64]}))  # fmt: skip
    assert refused.status_code == 400


@pytest.mark.slow
def test_describe_inference_component_reports_the_copies_the_router_runs(component_router: RouterProcess) -> None:
    control_url = component_router.control_url
    arn = "arn:aws:sagemaker:us-east-1:123456789012"
    state = ComponentState(
        "ep-digits", f"{arn}:inference-component/ep-digits", "ep", f"{arn}:endpoint/ep", "AllTraffic", "m", {}, 1, 1
    )
    components = InferenceComponents(
        {"ep-digits": state},
        lambda *_: None,
        lambda component: copies_on_router(control_url, component.name, DEVELOPER),
    )

    def describe() -> dict[str, int]:
        request = Request("POST", "/", {}, {"x-amz-target": "SageMaker.DescribeInferenceComponent"},
                          json.dumps({"InferenceComponentName": "ep-digits"}).encode())  # fmt: skip
        reply = components.handle(request)
        assert reply.status == 200, reply.body
        config: dict[str, int] = json.loads(reply.body)["RuntimeConfig"]
        return config

    assert describe() == {"DesiredCopyCount": 1, "CurrentCopyCount": 1}
    # WHEN the component's copies are stopped on its router (the CLI's control port)
    control("POST", f"{control_url}/_servestack/components/ep-digits", {"copies": 0}, timeout=60).raise_for_status()
    # THEN DescribeInferenceComponent no longer says a copy runs
    assert describe() == {"DesiredCopyCount": 0, "CurrentCopyCount": 0}


def test_local_ups_transform_report_route_answers_only_the_developers_signature() -> None:
    from servestack.local.emulator.callers import signed
    from servestack.local.iam.access import LocalAccess
    from servestack.local.lambda_.service import LambdaService
    from servestack.local.sagemaker.runtime_front import SageMakerRuntime
    from servestack.local.sagemaker.transform_jobs import REPORT_PREFIX, TransformJobs
    from servestack.local.up.aws_front import AwsFront

    access = LocalAccess(log=lambda line: None)
    front = AwsFront(
        SageMakerRuntime({}, {}, None), LambdaService([]), access,
        transform_jobs=TransformJobs(["m-digits"], "us-east-1", "123456789012"),
    ).serve_in_background()  # fmt: skip
    try:
        report = f"{front.url}{REPORT_PREFIX}Nightly-1"
        body = json.dumps({"status": "Failed", "reason": "forged"}).encode()
        # WHEN anyone posts a job's end unsigned THEN it is refused (403), before any job is looked up
        unsigned = httpx.post(report, content=body, headers={"Content-Type": "application/json"})
        assert unsigned.status_code == 403, unsigned.text
        # WHEN the developer signs it (as `local run-batch` does) THEN it reaches the route (no such job here)
        status, answer = signed("POST", report, access.developer, "us-east-1", body=body,
                                headers={"Content-Type": "application/json"}, service="sagemaker")  # fmt: skip
        assert status == 400, answer
        assert b"Could not find requested job" in answer
    finally:
        front.close()
