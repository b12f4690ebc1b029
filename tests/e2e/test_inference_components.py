"""Two models on one SageMaker endpoint as inference components, through `local up` with IAM enforced, as a user
calls them: boto3's `invoke_endpoint(InferenceComponentName=...)` reaches each model; what SageMaker refuses is
refused (no component name, an unknown one, TargetModel, a component with no copy); copies set with boto3's
`sagemaker` client close and reopen a component; and `servestack local deploy --component` releases a new
version of one component while the other serves untouched."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from servestack.local.sagemaker.runtime_front import COMPONENT_NAME_REQUIRED, NO_CAPACITY
from tests.conftest import ARTIFACTS, REPO_ROOT
from tests.control import control
from tests.e2e.conftest import DEVELOPER, SERVESTACK, LocalUp, copy_project, running, wait_for

pytestmark = pytest.mark.slow
DIGITS = (ARTIFACTS / "digits/1/sample-request.json").read_bytes()
CANCER = (ARTIFACTS / "breast-cancer/1/sample-request.json").read_bytes()


def documented_blocks(marker: str) -> dict[str, str]:
    """The fenced blocks of docs/realtime.md after `marker`, up to the next section, by language (the first of
    each)."""
    text = (REPO_ROOT / "docs/realtime.md").read_text(encoding="utf-8")
    after = text[text.index(marker) :]
    section = after.split("\n## ")[0]
    blocks: dict[str, str] = {}
    for found in re.finditer(r"```(\w+)\n(.*?)```", section, re.DOTALL):
        blocks.setdefault(found.group(1), found.group(2))
    return blocks


# The docs' example (docs/realtime.md) is what this module runs: its serving.yaml, and its boto3 code.
EXAMPLE = documented_blocks("<!-- tested: tests/e2e/test_inference_components.py")
SPEC = EXAMPLE["yaml"]
ENDPOINT = "servestack-two-models"
DIGITS_COMPONENT = "servestack-two-models-digits"
CANCER_COMPONENT = "servestack-two-models-cancer"


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalUp]:
    where = tmp_path_factory.mktemp("components")
    with running(
        where, "--fresh", "--data-dir", str(where / "data"), spec=copy_project(where / "project", SPEC)
    ) as local:
        yield local


def reference(model: str) -> Any:
    return json.loads((ARTIFACTS / model / "1/sample-response.json").read_text())["predictions"]


def invoke(up: LocalUp, component: str | None, body: bytes, **extra: Any) -> dict[str, Any]:
    named = {"InferenceComponentName": component} if component else {}
    response: dict[str, Any] = up.client("sagemaker-runtime").invoke_endpoint(
        EndpointName=ENDPOINT, ContentType="application/json", Body=body, **named, **extra
    )
    response["json"] = json.loads(response["Body"].read())
    return response


def refusal(call: Any) -> dict[str, str]:
    with pytest.raises(ClientError) as raised:
        call()
    error: dict[str, str] = raised.value.response["Error"]
    return error


def sagemaker(up: LocalUp, **keys: Any) -> Any:
    session = boto3.session.Session(**(keys or DEVELOPER))
    config = Config(retries={"mode": "standard", "max_attempts": 1})
    return session.client("sagemaker", endpoint_url=up.api, config=config)


def test_each_component_answers_with_its_own_model(up: LocalUp) -> None:
    # GIVEN the templates' endpoint with two components, and the state file naming them
    assert up.deployment("two-models")["endpoint_name"] == ENDPOINT
    assert set(up.deployment("two-models")["components"]) == {DIGITS_COMPONENT, CANCER_COMPONENT}
    # WHEN boto3 invokes each by its InferenceComponentName (as the developer, IAM enforced)
    digits = invoke(up, DIGITS_COMPONENT, DIGITS)
    cancer = invoke(up, CANCER_COMPONENT, CANCER)
    # THEN each model answers its own sample, under the variant hosting the components
    assert digits["json"]["predictions"] == reference("digits")
    assert cancer["json"]["predictions"] == reference("breast-cancer")
    assert digits["InvokedProductionVariant"] == cancer["InvokedProductionVariant"] == "primary"
    assert up.state["iam_enforced"] is True


def test_what_sagemaker_refuses_is_refused(up: LocalUp) -> None:
    runtime = up.client("sagemaker-runtime")
    # WHEN the component name is missing, unknown, or TargetModel is sent to this endpoint
    missing = refusal(lambda: runtime.invoke_endpoint(EndpointName=ENDPOINT, Body=DIGITS))
    unknown = refusal(
        lambda: runtime.invoke_endpoint(EndpointName=ENDPOINT, InferenceComponentName="two-models-nope", Body=DIGITS)
    )
    target_model = refusal(
        lambda: runtime.invoke_endpoint(
            EndpointName=ENDPOINT, InferenceComponentName=DIGITS_COMPONENT, TargetModel="digits/1.tar.gz", Body=DIGITS
        )
    )
    # THEN each is SageMaker's ValidationError
    assert missing == {"Code": "ValidationError", "Message": COMPONENT_NAME_REQUIRED}
    assert unknown["Code"] == "ValidationError"
    assert "two-models-nope" in unknown["Message"]
    assert target_model["Code"] == "ValidationError"
    assert "not a multi-model endpoint" in target_model["Message"]


def test_a_role_without_invoke_permission_is_denied(up: LocalUp) -> None:
    # GIVEN the keys of the endpoint's own execution role (it may pull, read models, log; not invoke)
    keys = up.role_keys("ComponentsExecutionRole")
    runtime = up.client("sagemaker-runtime", **keys)
    # WHEN it invokes a component THEN AccessDeniedException, as the template's IAM says
    denied = refusal(
        lambda: runtime.invoke_endpoint(EndpointName=ENDPOINT, InferenceComponentName=DIGITS_COMPONENT, Body=DIGITS)
    )
    assert denied["Code"] == "AccessDeniedException"
    assert (
        f"sagemaker:InvokeEndpoint on resource: arn:aws:sagemaker:us-east-1:123456789012:endpoint/{ENDPOINT}"
        in (denied["Message"])
    )
    # AND it may not scale a component either
    scale = refusal(
        lambda: sagemaker(up, **keys).update_inference_component_runtime_config(
            InferenceComponentName=CANCER_COMPONENT, DesiredRuntimeConfig={"CopyCount": 0}
        )
    )
    assert scale["Code"] == "AccessDeniedException"


def described(up: LocalUp, name: str) -> dict[str, Any]:
    def settled() -> dict[str, Any] | None:
        answer: dict[str, Any] = sagemaker(up).describe_inference_component(InferenceComponentName=name)
        return answer if answer["InferenceComponentStatus"] != "Updating" else None

    found: dict[str, Any] = wait_for(settled, 120, f"{name} in service")
    return found


def test_a_component_at_zero_copies_has_no_capacity_until_a_copy_is_back(up: LocalUp) -> None:
    control = sagemaker(up)
    # WHEN the cancer component is scaled to zero copies with boto3
    control.update_inference_component_runtime_config(
        InferenceComponentName=CANCER_COMPONENT, DesiredRuntimeConfig={"CopyCount": 0}
    )
    assert described(up, CANCER_COMPONENT)["RuntimeConfig"] == {"DesiredCopyCount": 0, "CurrentCopyCount": 0}
    # THEN invoking it is SageMaker's no-capacity ValidationError, while the other component serves on
    error = refusal(lambda: invoke(up, CANCER_COMPONENT, CANCER))
    assert error == {"Code": "ValidationError", "Message": NO_CAPACITY}
    assert invoke(up, DIGITS_COMPONENT, DIGITS)["json"]["predictions"] == reference("digits")
    # WHEN one copy is asked for again THEN, once it is in service, the component answers
    control.update_inference_component_runtime_config(
        InferenceComponentName=CANCER_COMPONENT, DesiredRuntimeConfig={"CopyCount": 1}
    )
    back = described(up, CANCER_COMPONENT)
    assert (back["InferenceComponentStatus"], back["RuntimeConfig"]["CurrentCopyCount"]) == ("InService", 1)
    assert invoke(up, CANCER_COMPONENT, CANCER)["json"]["predictions"] == reference("breast-cancer")


def _digits_v2(path: Path) -> Path:
    """Digits with other bytes and the same behaviour: a healthy new version."""
    import onnx

    model = onnx.load(str(ARTIFACTS / "digits" / "1" / "model.onnx"))
    model.doc_string = "digits, release 2"
    onnx.save(model, str(path))
    return path


def test_a_rehearsal_updates_one_component_and_leaves_the_other_untouched(up: LocalUp, tmp_path: Path) -> None:
    project = Path(up.state["project"])
    env = {**os.environ, "SERVESTACK_LOCAL_STATE": str(up.state_path)}
    env.pop("AWS_ENDPOINT_URL", None)
    env.pop("SERVESTACK_REGISTRY_URI", None)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [SERVESTACK, *args], cwd=project, capture_output=True, text=True, env=env, timeout=180, check=False
        )

    router = up.deployment("two-models")["control_url"]  # the router's admin routes: its control port
    before = control("GET", f"{router}/_servestack/metrics", timeout=30).json()["variants"]
    # GIVEN digits version 2 pushed to the running local up's registry
    pushed = cli("models", "push", str(_digits_v2(tmp_path / "digits-v2.onnx")), "--name", "digits")
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    # WHEN the digits component is rehearsed to version 2 (compressed clocks)
    outcome_file = tmp_path / "outcome.json"
    done = cli(
        "local", "deploy", "two-models", "--component", "digits", "--version", "2", "--traffic-rps", "30",
        "--interval-sec", "3", "--bake-sec", "1", "--period-sec", "1", "--evaluation-periods", "2",
        "--output", str(outcome_file),
    )  # fmt: skip
    # THEN it succeeds: the component's traffic shifted to green under its alarms, and `live` moved
    outcome = json.loads(outcome_file.read_text())
    assert done.returncode == 0, done.stdout + done.stderr
    assert outcome["state"] == "succeeded"
    assert outcome["component"] == DIGITS_COMPONENT
    assert {a["name"] for a in outcome["alarms"]} == {f"{DIGITS_COMPONENT}-5xx-rate", f"{DIGITS_COMPONENT}-p99-latency"}
    assert outcome["client"]["failures"] == 0
    assert sum(w["served_by_green"] for w in outcome["client"]["windows"]) > 0
    # AND the digits component now answers version 2 while the cancer component still answers version 1
    assert invoke(up, DIGITS_COMPONENT, DIGITS)["json"]["version"] == "2"
    assert invoke(up, CANCER_COMPONENT, CANCER)["json"]["version"] == "1"
    # AND the cancer component's container is the one it had before (never restarted by the release)
    after = control("GET", f"{router}/_servestack/metrics", timeout=30).json()["variants"]
    assert after[CANCER_COMPONENT]["url"] == before[CANCER_COMPONENT]["url"]
    assert after[DIGITS_COMPONENT]["model"] == "digits@2"
    # AND a rehearsal that names no component is refused with the components to choose from
    refused = cli("local", "deploy", "two-models", "--version", "2")
    assert refused.returncode != 0
    assert "digits, cancer" in refused.stderr


def test_the_documented_example_runs_as_written(up: LocalUp) -> None:
    # GIVEN the project's state file where `local up` writes it for a user
    project = Path(up.state["project"])
    (project / ".servestack").mkdir(exist_ok=True)
    shutil.copy(up.state_path, project / ".servestack" / "local.json")
    # WHEN the documented boto3 code runs in the project
    done = subprocess.run(
        [sys.executable, "-c", EXAMPLE["python"]], cwd=project, capture_output=True, text=True, timeout=120, check=False
    )
    # THEN each component prints its model's predictions, and the nameless call SageMaker's refusal
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"{DIGITS_COMPONENT} {reference('digits')}"
    assert lines[1] == f"{CANCER_COMPONENT} {reference('breast-cancer')}"
    assert lines[2] == COMPONENT_NAME_REQUIRED[:60]
