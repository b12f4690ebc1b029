"""Issue 37, finding 6: every route of each local server, sent unsigned, is refused with a 403 an AWS SDK reads
(an `x-amzn-ErrorType` header or an AWS error body), before the route does anything; local mode's own routes
(`/_servestack/...`) answer only the developer's keys.

The routes are the code's: local up's AWS front's `CONTROL_ROUTES` (each route class's own) and the AWS APIs
it answers, an endpoint router's `ADMIN_ROUTES` on its control port (and on the port callers invoke), the
emulator's services (`SERVICES`) and moto's admin API. A last test reads every `/_servestack/` path written in
servestack's code and checks that one of those tables holds it, so a new route cannot miss the sweep.

Not swept, by design: the router's inference routes (`/ping`, `/invocations`: the container's port, which
SageMaker's own front calls unsigned; the banner's curl does) and each Lambda function's execution environment
(its Invoke API, which local up's Lambda service calls after IAM): processes of the developer's own user
reach them, as they can read local up's state file (docs/local-mode.md, "What the local role boundary is").
"""

from __future__ import annotations

import ast
import asyncio
import json
import re
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn

from servestack.local.codedeploy import LocalCodeDeploy
from servestack.local.ecs import EcsRunTask
from servestack.local.emulator.moto_server import SERVICES, EmbeddedEmulator
from servestack.local.iam import DEVELOPER, ControlGate, Credentials
from servestack.local.iam.access import LocalAccess
from servestack.local.lambda_.service import LambdaService
from servestack.local.sagemaker.router import Router
from servestack.local.sagemaker.router_admin import ADMIN_ROUTES
from servestack.local.sagemaker.router_http import ADMIN
from servestack.local.sagemaker.runtime_front import SageMakerRuntime
from servestack.local.sagemaker.transform_jobs import TransformJobs
from servestack.local.scheduler import SchedulerApi
from servestack.local.stack import BucketNotifications
from servestack.local.up.aws_front import CONTROL_ROUTES, AwsFront
from tests.conftest import REPO_ROOT
from tests.control import REGION, control

# The AWS APIs local up's AWS front answers (servestack/local/up/aws_front.py's `handle`), one call of each.
FRONT_AWS_ROUTES = [
    ("POST", "/endpoints/ep/invocations", {}),
    ("POST", "/endpoints/ep/async-invocations", {"X-Amzn-SageMaker-InputLocation": "s3://b/k"}),
    ("POST", "/2015-03-31/functions/fn/invocations", {}),
    ("GET", "/schedules/nightly", {}),
    ("POST", "/", {"X-Amz-Target": "SageMaker.DescribeInferenceComponent"}),
    ("POST", "/", {"X-Amz-Target": "SageMaker.UpdateInferenceComponentRuntimeConfig"}),
    ("POST", "/", {"X-Amz-Target": "SageMaker.CreateTransformJob"}),
    ("POST", "/", {"X-Amz-Target": "SageMaker.DescribeTransformJob"}),
    ("POST", "/", {"X-Amz-Target": "AmazonEC2ContainerServiceV20141113.RunTask"}),
    ("POST", "/", {"X-Amz-Target": "CodeDeploy_20141006.CreateDeployment"}),
]


# The signing name each of local up's own routes is called with (servestack's callers'): the route may check it.
SIGNED_AS = {
    "/_servestack/iam/roles": "iam",
    "/_servestack/iam/roles/{role}": "iam",
    "/_servestack/cloudformation/stacks/{stack}/update": "cloudformation",
}
ACCOUNT = "123456789012"


def concrete(path: str) -> str:
    return re.sub(r"\{[a-z]+\}", "x", path)


def assert_aws_refusal(answer: httpx.Response, what: str, statuses: tuple[int, ...] = (403,)) -> None:
    """A refusal as an AWS service sends it (403 unless `statuses`): its error code where botocore looks for it."""
    assert answer.status_code in statuses, (what, answer.status_code, answer.text[:300])
    if answer.headers.get("content-type", "").startswith(("application/xml", "text/xml")):
        assert "<Code>" in answer.text, (what, answer.text[:300])
        return
    body = answer.json()
    code = answer.headers.get("x-amzn-errortype") or body.get("__type")
    assert code, (what, dict(answer.headers), answer.text[:300])
    assert body.get("message") or body.get("Message"), (what, answer.text[:300])


def secrets_of(access: LocalAccess) -> list[str]:
    """The secrets and session tokens of the store's roles (the developer's are the documented `local`)."""
    return [s for who in access.store if who.kind == "role" for s in (who.secret_access_key, who.session_token) if s]


# ------------------------------------------------------------------------------------------ local up's AWS front


@dataclass
class Front:
    url: str
    access: LocalAccess
    role: Credentials  # keys of a role of the store: an identity local up knows, not the developer


def front_of(access: LocalAccess, run_dir: Path) -> AwsFront:
    """The AWS front with every part local up can give it, each holding nothing."""
    scheduler = SchedulerApi([], REGION, ACCOUNT)
    notifications = BucketNotifications([], access, emulator_url="http://127.0.0.1:1", region=REGION, identities={})
    codedeploy = LocalCodeDeploy(
        [], access, emulator_url="http://127.0.0.1:1", front_url="http://127.0.0.1:1", region=REGION, env_base={},
        run_dir=run_dir, identities={},
    )  # fmt: skip
    return AwsFront(
        SageMakerRuntime({}, {}, None), LambdaService([]), access, codedeploy=codedeploy,
        transform_jobs=TransformJobs([], REGION, ACCOUNT), scheduler=scheduler, notifications=notifications,
        ecs=EcsRunTask({}, access, REGION, ACCOUNT),
    )  # fmt: skip


@pytest.fixture(scope="module", params=[True, False], ids=["enforced", "no-iam"])
def front(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    access = LocalAccess(enforced=request.param, log=lambda line: None)
    allow = {"Effect": "Allow", "Action": "*", "Resource": "*"}  # a role may do anything: still not the developer
    role = access.credentials_for(
        "arn:aws:iam::123456789012:role/admin-role", ({"Version": "2012-10-17", "Statement": [allow]},)
    )
    served = front_of(access, tmp_path_factory.mktemp("run")).serve_in_background()
    yield Front(served.url, access, role)
    served.close()


@pytest.mark.parametrize(("method", "path"), [*CONTROL_ROUTES, ("GET", "/_servestack/no-such-route")])
def test_local_ups_own_routes_answer_only_the_developers_signature(front: Front, method: str, path: str) -> None:
    url = f"{front.url}{concrete(path)}"
    # WHEN it is sent unsigned THEN a 403 an SDK reads (with --no-iam too)
    unsigned = httpx.request(method, url, content=b"{}")
    assert_aws_refusal(unsigned, f"{method} {path} unsigned")
    assert unsigned.headers["x-amzn-errortype"] == "MissingAuthenticationTokenException"
    # WHEN a role signs it, even one allowed every action THEN AccessDeniedException: the route is the developer's
    service = SIGNED_AS.get(path, "sagemaker")
    by_role = control(method, url, {}, credentials=front.role, service=service)
    assert_aws_refusal(by_role, f"{method} {path} signed by a role")
    assert by_role.headers["x-amzn-errortype"] == "AccessDeniedException"
    # WHEN the developer signs it THEN the route itself answers
    answer = control(method, url, {}, service=service)
    assert answer.status_code != 403, answer.text
    # AND no answer holds a key of the store
    for reply in (unsigned, by_role, answer):
        assert not any(secret in reply.text for secret in secrets_of(front.access))


@pytest.mark.parametrize(("method", "path", "headers"), FRONT_AWS_ROUTES)
def test_local_ups_aws_apis_refuse_an_unsigned_call(
    method: str, path: str, headers: dict[str, str], tmp_path: Path
) -> None:
    served = front_of(LocalAccess(log=lambda line: None), tmp_path).serve_in_background()
    try:
        answer = httpx.request(method, f"{served.url}{path}", content=b"{}", headers=headers)
    finally:
        served.close()
    # THEN the service's own refusal: 403, or 400 where a JSON-protocol service sends that (SageMaker, ECS)
    assert_aws_refusal(answer, f"{method} {path}", statuses=(400, 403))
    assert "MissingAuthenticationToken" in (answer.headers.get("x-amzn-errortype") or answer.json().get("__type"))


# ------------------------------------------------------------------------------------------ an endpoint's router


@dataclass
class RouterPorts:
    public: str
    control: str


def _listening() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@pytest.fixture(scope="module")
def router() -> Iterator[RouterPorts]:
    """The router of an endpoint with no variant (none is needed to reach its admin routes), on a public and a
    control port, checking signatures with the developer's keys as `local up` starts it."""
    public, control_socket = _listening(), _listening()
    gate = ControlGate.for_developer(DEVELOPER, region=REGION)
    app = Router("sweep", [], control_port=control_socket.getsockname()[1], control_gate=gate)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [public, control_socket]}, daemon=True)
    thread.start()
    ports = RouterPorts(
        f"http://127.0.0.1:{public.getsockname()[1]}", f"http://127.0.0.1:{control_socket.getsockname()[1]}"
    )
    ready = threading.Event()

    async def wait_started() -> None:
        async with asyncio.timeout(60):  # uvicorn's start, however busy the machine: a poll with a deadline
            while not server.started:
                await asyncio.sleep(0.01)
        ready.set()

    asyncio.run(wait_started())
    assert ready.is_set()
    yield ports
    server.should_exit = True
    thread.join(timeout=10)


@pytest.mark.parametrize(("method", "route"), ADMIN_ROUTES)
def test_the_routers_control_routes_answer_only_the_developers_signature(
    router: RouterPorts, method: str, route: str
) -> None:
    url = f"{router.control}{ADMIN}{concrete(route)}"
    body = {"version": "2", "faults": {"error_rate": 1}} if route == "deploy" else {"copies": 0}
    # WHEN it is sent unsigned (the rehearsal of issue 37: `error_rate` 1) THEN a 403 an SDK reads
    unsigned = httpx.request(method, url, json=body if method == "POST" else None)
    assert_aws_refusal(unsigned, f"{method} {route} unsigned")
    assert unsigned.headers["x-amzn-errortype"] == "MissingAuthenticationTokenException"
    # WHEN other keys sign it THEN refused: the router knows the developer's keys alone
    other = Credentials("arn:aws:iam::123456789012:user/other", "AKIAOTHEROTHEROTHER1", "secret")
    by_other = control(method, url, body if method == "POST" else None, credentials=other)
    assert_aws_refusal(by_other, f"{method} {route} signed by other keys")
    # WHEN the developer signs it THEN the route answers (this router has no shadow, rehearsal or component)
    answer = control(method, url, body if method == "POST" else None)
    assert answer.status_code in (200, 404), answer.text
    assert "x-amzn-errortype" not in answer.headers
    # AND on the port callers invoke, the admin routes are refused even signed
    public = control(method, f"{router.public}{ADMIN}{concrete(route)}", body if method == "POST" else None)
    assert_aws_refusal(public, f"{method} {route} on the public port")


def test_a_router_without_the_developers_keys_answers_no_admin_route() -> None:
    from servestack.local.sagemaker.endpoint import control_gate

    gate = control_gate({})  # local up always gives them; a router started by hand may lack them
    from servestack.local.iam.wire import HttpRequest

    refused = gate.refusal(HttpRequest("GET", "/_servestack/metrics", "", {"host": "127.0.0.1"}))
    assert refused is not None
    assert refused.status == 403


# ------------------------------------------------------------------------------------------ the emulator


@pytest.fixture(scope="module")
def emulator() -> Iterator[EmbeddedEmulator]:
    started = EmbeddedEmulator(middleware=LocalAccess(log=lambda line: None).middleware)
    yield started
    started.stop()


@pytest.mark.parametrize("service", SERVICES)
def test_the_emulators_services_refuse_an_unsigned_call(emulator: EmbeddedEmulator, service: str) -> None:
    from botocore import UNSIGNED
    from botocore.config import Config
    from botocore.exceptions import ClientError

    from servestack.local.emulator import session_client

    config = Config(signature_version=UNSIGNED, retries={"max_attempts": 1}, s3={"addressing_style": "path"})
    client = session_client(service, endpoint_url=emulator.url, region_name=REGION, config=config)
    calls = {
        "s3": lambda: client.list_buckets(),
        "sqs": lambda: client.list_queues(),
        "dynamodb": lambda: client.list_tables(),
        "sns": lambda: client.list_topics(),
        "events": lambda: client.list_rules(),
        "iam": lambda: client.list_roles(),
        "sts": lambda: client.get_caller_identity(),
        "logs": lambda: client.describe_log_groups(),
    }
    with pytest.raises(ClientError) as refused:
        calls[service]()
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] in (400, 403), refused.value.response


@pytest.mark.parametrize("path", ["/moto-api/reset", "/moto-api/data.json", "/moto-api/", "/moto-api/seed"])
def test_the_emulators_admin_api_is_refused(emulator: EmbeddedEmulator, path: str) -> None:
    answer = httpx.post(f"{emulator.url}{path}")
    assert answer.status_code == 403, answer.text
    assert answer.json()["error"]["type"] == "AccessDenied"


# ------------------------------------------------------------------------------------------ the sweep is complete


def control_paths_in_the_code() -> set[str]:
    """Every string constant of servestack/ that holds `/_servestack/`, f-string fields as `{}`."""
    found: set[str] = set()
    for path in (REPO_ROOT / "servestack").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
            else:
                continue
            for match in re.finditer(r"/_servestack/[A-Za-z0-9_{}/.-]*", text):
                found.add(match.group(0))
    return found


def test_every_servestack_route_in_the_code_is_in_a_swept_table() -> None:
    swept = [concrete(path) for _, path in CONTROL_ROUTES] + [f"{ADMIN}{concrete(route)}" for _, route in ADMIN_ROUTES]
    for literal in sorted(control_paths_in_the_code()):
        literal = literal.rstrip(".")  # `/_servestack/...` in prose
        pattern = re.sub(r"\\\{[^}]*\\\}", "[^/]*", re.escape(literal))  # `{name}`, `{}`: any segment
        covered = literal == ADMIN or any(re.match(pattern, route) for route in swept)
        assert covered, f"{literal}: a /_servestack/ route not in CONTROL_ROUTES or ADMIN_ROUTES"


def test_the_state_files_keys_are_in_no_answer_of_the_roles_route(front: Front) -> None:
    # GIVEN the roles route, which lists the roles and their statements to the developer
    listed = control("GET", f"{front.url}/_servestack/iam/roles", service="iam")
    if not front.access.enabled:
        assert listed.status_code == 409
        return
    assert listed.status_code == 200, listed.text
    # THEN it holds no key of any identity (their keys are the state file's, readable by the developer only)
    assert json.loads(listed.text)["roles"]
    assert not any(secret in listed.text for secret in secrets_of(front.access))
