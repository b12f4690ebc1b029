"""`servestack local deploy NAME` of a serverless deployment: its CodeDeploy release on the running `local up`,
asked for as the developer asks for it (CodeDeploy's `CreateDeployment` on the deployment group the template
names, signed with the developer's keys), then followed with `GetDeployment` until it ends.

local up's CodeDeploy (servestack/local/codedeploy/deployments.py) runs the release under the template's roles: the
pre-traffic hook under its own role, the shift and the alarm reads under the CodeDeploy service role. A
refused call fails the release with the AccessDenied AWS would give; the exit status says how it ended:
0 succeeded, 1 failed, stopped or rolled back, 2 when it could not start.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from servestack.failures import CommandError, ExitCode
from servestack.project import STATE_DIR, project_or_cwd

TARGET = "CodeDeploy_20141006."
ENDED = ("Succeeded", "Failed", "Stopped")


def _call(about: dict[str, Any], operation: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    from servestack.local.emulator import developer, signed

    headers = {"X-Amz-Target": TARGET + operation, "Content-Type": "application/x-amz-json-1.1"}
    status, answer = signed("POST", about["aws_api_url"], developer(about), about.get("region", "us-east-1"),
                            body=json.dumps(body).encode(), headers=headers, service="codedeploy")  # fmt: skip
    loaded: dict[str, Any] = json.loads(answer or b"{}")
    return status, loaded


def deploy_serverless(
    about: dict[str, Any],
    name: str,
    entry: dict[str, Any],
    *,
    interval_sec: float | None = None,
    output: Path | None = None,
    timeout_sec: float = 3600,
) -> int:
    """Release the deployment's alias through local up's CodeDeploy; print the timeline; write the outcome."""
    group = entry.get("codedeploy")
    if not isinstance(group, dict):
        raise CommandError(f"{name}: the running local up holds no CodeDeploy deployment group for it; restart it")
    request: dict[str, Any] = {"applicationName": group["application"], "deploymentGroupName": group["group"]}
    if interval_sec is not None:
        request["servestackIntervalSec"] = interval_sec
    else:
        print(f"{name}: releasing at the deployment configuration's own interval (minutes); --interval-sec 2 "
              "rehearses it in seconds", flush=True)  # fmt: skip
    status, answer = _call(about, "CreateDeployment", request)
    if status != 200:
        raise CommandError(f"{name}: CreateDeployment: {answer.get('message', answer)}", ExitCode.AWS)
    deployment_id = answer["deploymentId"]
    print(f"{name}: deployment {deployment_id} created", flush=True)
    printed = 0
    info: dict[str, Any] = {}
    deadline = time.monotonic() + timeout_sec
    while time.monotonic() < deadline:
        status, answer = _call(about, "GetDeployment", {"deploymentId": deployment_id})
        if status != 200:
            raise CommandError(f"{name}: GetDeployment: {answer.get('message', answer)}", ExitCode.AWS)
        info = answer["deploymentInfo"]
        for message in info["deploymentStatusMessages"][printed:]:
            print(message, flush=True)
        printed = len(info["deploymentStatusMessages"])
        if info["status"] in ENDED:
            break
        time.sleep(0.2)
    target = output or project_or_cwd() / STATE_DIR / f"deploy-{name}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(info, indent=2) + "\n")
    error = info.get("errorInformation")
    print(f"{name}: {info.get('status')}" + (f" ({error['code']}: {error['message']})" if error else "")
          + f" (outcome: {target})", flush=True)  # fmt: skip
    return 0 if info.get("status") == "Succeeded" else 1
