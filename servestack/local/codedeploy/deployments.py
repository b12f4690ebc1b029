"""CodeDeploy for Lambda, as `local up` plays it: a serverless deployment's blue/green release of its alias,
run under the roles the templates give it.

From the templates: the `AWS::CodeDeploy::DeploymentGroup` (its application, `ServiceRoleArn`, alarms and
deployment configuration) and the alias whose `UpdatePolicy.CodeDeployLambdaAliasUpdate` names the group and
its `BeforeAllowTrafficHook` function (inline code, its role, its environment).

On local up's AWS API port (`X-Amz-Target: CodeDeploy_20141006.<Op>`, SigV4 for `codedeploy`, each call
authorized on the deployment group's ARN as the Service Authorization Reference gives it):
- `CreateDeployment` (`codedeploy:CreateDeployment`): starts a release of the group's alias to the version
  the template publishes (local mode runs the working tree: that version is its code);
- `GetDeployment` (`codedeploy:GetDeployment`): its status, error and status messages (the timeline);
- `PutLifecycleEventHookExecutionStatus` (`codedeploy:PutLifecycleEventHookExecutionStatus`): the hook's
  verdict, with the hook role's keys.

The release, as the CodeDeploy service role (the statements the template gives it; local mode holds no AWS
managed policy, so a call only a managed policy would allow is refused): `lambda:GetAlias` on the function
(the version the alias serves now, to roll back to) and `lambda:GetProvisionedConcurrencyConfig` on the alias
(`<function arn>:<alias>`: CodeDeploy waits for the new version's provisioned concurrency before shifting);
`lambda:InvokeFunction` on the hook, which then runs in its own execution environment with its role's keys
(it invokes the new version and reports through the call above); then the shift per the deployment
configuration, each step reading the group's alarms (`cloudwatch:DescribeAlarms` on the emulator, signed with
the role's keys, on the alarms' ARNs) and moving the alias (`lambda:UpdateAlias` on the function); an alarm
in ALARM rolls the alias back. Every qualifier runs the same code locally, so the alias's weights are recorded and
reported, not routed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servestack.local.codedeploy.definitions import HookDef, LambdaDeploymentDef
from servestack.local.hosting import Reply, Request
from servestack.local.lambda_ import runner_command

TARGET_PREFIX = "CodeDeploy_20141006."
HOOK_MARGIN_SEC = 30  # CodeDeploy waits for the hook's status a while past the function's own timeout
# ------------------------------------------------------------------------------------------ the service


@dataclass
class Release:
    """One deployment: what GetDeployment answers."""

    deployment_id: str
    definition: LambdaDeploymentDef
    creator: str
    interval_sec: float
    status: str = "Created"
    error: dict[str, str] | None = None
    messages: list[str] = field(default_factory=list)
    hook_status: dict[str, str] = field(default_factory=dict)  # execution id -> Succeeded | Failed
    started: float = field(default_factory=time.monotonic)

    def say(self, message: str) -> None:
        self.messages.append(f"+{time.monotonic() - self.started:7.2f}s {message}")

    def info(self) -> dict[str, Any]:
        d = self.definition
        info: dict[str, Any] = {
            "deploymentId": self.deployment_id, "applicationName": d.application, "deploymentGroupName": d.group,
            "status": self.status, "creator": "user", "computePlatform": "Lambda",
            "deploymentStatusMessages": list(self.messages),
        }  # fmt: skip
        if self.error is not None:
            info["errorInformation"] = self.error
        return info


class LocalCodeDeploy:
    """The CodeDeploy API of local up's AWS front, and the releases it runs."""

    def __init__(
        self,
        deployments: list[LambdaDeploymentDef],
        access: Any,
        *,
        emulator_url: str,
        front_url: str,
        region: str,
        env_base: dict[str, str],
        run_dir: Path,
        identities: dict[str, dict[str, str]],
    ) -> None:
        self.groups = {(d.application, d.group): d for d in deployments}
        self.access = access
        self.emulator_url = emulator_url
        self.front_url = front_url
        self.region = region
        self.env_base = env_base
        self.run_dir = run_dir
        self.identities = identities
        self.releases: dict[str, Release] = {}
        self.hooks: dict[str, tuple[subprocess.Popen[bytes], str]] = {}  # hook name -> (process, url)
        self.shippers: list[Any] = []  # the hooks' LogShippers
        self._lock = threading.Lock()
        self.credentials: dict[str, Any] = {}
        for d in deployments:  # the service role's keys, its documents as the store holds them
            self.credentials[d.service_role_arn] = access.credentials_for(
                d.service_role_arn, self._policies(d.service_role_arn)
            )

    def _policies(self, role_arn: str) -> tuple[dict[str, Any], ...]:
        store = getattr(self.access, "store", None)
        held = store.role_policies(role_arn) if store is not None else None
        return tuple(dict(document) for document in (held or {}).values())

    @staticmethod
    def is_api(request: Request) -> bool:
        return request.method == "POST" and (request.headers.get("x-amz-target") or "").startswith(TARGET_PREFIX)

    def close(self) -> None:
        for shipper in self.shippers:
            shipper.close()
        for process, _ in self.hooks.values():
            process.terminate()
        for process, _ in self.hooks.values():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()

    # ------------------------------------------------------------------------------------ API
    def handle(self, request: Request) -> Reply:
        operation = (request.headers.get("x-amz-target") or "")[len(TARGET_PREFIX) :]
        signer = self._authenticated(request)  # before anything is looked up, as AWS (no answer to an unknown caller)
        if isinstance(signer, Reply):
            return signer
        try:
            body = json.loads(request.body or b"{}")
        except ValueError:
            return _error(400, "InvalidInputException", "the request body is not JSON")
        if operation == "CreateDeployment":
            key = (str(body.get("applicationName")), str(body.get("deploymentGroupName")))
            definition = self.groups.get(key)
            if definition is None:
                known = ", ".join(f"{a}/{g}" for a, g in self.groups) or "none"
                message = f"deploymentGroupName: {key[0]}/{key[1]} is not one of the templates' ({known})"
                return _error(400, "DeploymentGroupDoesNotExistException", message)
        elif operation in ("GetDeployment", "PutLifecycleEventHookExecutionStatus"):
            found = self.releases.get(str(body.get("deploymentId")))
            if found is None:
                message = f"deploymentId: {body.get('deploymentId')!r} is not a deployment of this local up"
                return _error(400, "DeploymentDoesNotExistException", message)
            release, definition = found, found.definition
        else:
            return _error(400, "UnknownOperationException",
                          f"{operation}: local up's CodeDeploy answers CreateDeployment, GetDeployment and "
                          "PutLifecycleEventHookExecutionStatus")  # fmt: skip
        caller = self._authorized(request, signer, f"codedeploy:{operation}", definition.group_arn)
        if isinstance(caller, Reply):
            return caller
        if operation == "CreateDeployment":
            interval = body.get("servestackIntervalSec")  # local only: rehearse in seconds
            release = Release(f"d-{uuid.uuid4().hex[:9].upper()}", definition, caller,
                              float(interval) if interval is not None else definition.interval_sec)  # fmt: skip
            self.releases[release.deployment_id] = release
            threading.Thread(target=self._run, args=(release,), name=release.deployment_id, daemon=True).start()
            return _ok({"deploymentId": release.deployment_id})
        if operation == "GetDeployment":
            return _ok({"deploymentInfo": release.info()})
        status = str(body.get("status"))
        if status not in ("Succeeded", "Failed"):
            return _error(400, "InvalidLifecycleEventHookExecutionStatusException",
                          f"status: {status!r} is not allowed (Succeeded, Failed)")  # fmt: skip
        execution = str(body.get("lifecycleEventHookExecutionId"))
        release.hook_status[execution] = status
        return _ok({"lifecycleEventHookExecutionId": execution})

    def _authenticated(self, request: Request) -> Any:
        """The request's signer (an `Identity`; None with --no-iam), or the reply to an unsigned or badly signed
        request."""
        if not self.access.enabled:  # --no-iam
            return None
        enforcer = self.access.enforcer
        from servestack.local.iam import AuthFailure, authenticate, check_scope, parse_signature

        wire = _wire(request)
        try:
            signature = parse_signature(wire)
            if signature is None:
                return _error(403, "MissingAuthenticationTokenException", "the request is not signed")
            check_scope(signature, self.region, "codedeploy")
            found = authenticate(wire, enforcer.store, enforcer.clock(), signature=signature)
        except AuthFailure as failure:
            return _error(403, "UnrecognizedClientException", failure.message)
        assert found is not None
        return found[0]

    def _authorized(self, request: Request, identity: Any, action: str, resource: str) -> str | Reply:
        """The caller's ARN when IAM allows `action` on `resource` for `identity`, else the reply."""
        if identity is None:  # --no-iam
            return "anonymous"
        from servestack.local.iam import access_denied

        decision = self.access.enforcer.authorize(identity, action, resource)
        if not decision.allowed:
            return access_denied("codedeploy", _wire(request), identity.arn, decision)
        return str(identity.arn)

    # ------------------------------------------------------------------------------------ the release
    def _as_role(self, release: Release, action: str, resource: str) -> bool:
        denied = self.access.authorize(release.definition.service_role_arn, action, resource)
        if denied is not None:
            self._fail(release, "IAM_ROLE_PERMISSIONS", f"AccessDeniedException: {denied}")
            return False
        return True

    def _fail(self, release: Release, code: str, message: str) -> None:
        release.error = {"code": code, "message": message[:1000]}
        release.status = "Failed"
        release.say(f"failed: {message[:300]}")

    def _run(self, release: Release) -> None:
        d = release.definition
        release.status = "InProgress"
        release.say(f"{d.function}:{d.alias} -> version {d.version} ({'/'.join(map(str, d.steps))}%)")
        try:
            if not self._as_role(release, "lambda:GetAlias", d.function_arn):
                return
            if not self._as_role(release, "lambda:GetProvisionedConcurrencyConfig", f"{d.function_arn}:{d.alias}"):
                return
            if d.hook is not None and not self._before_allow_traffic(release, d.hook):
                return
            shifted = 0
            for index, weight in enumerate(d.steps):
                if not self._alarms_quiet(release):
                    if shifted:
                        self._shift(release, 0, "rolled back")
                    release.status = "Stopped" if release.error is None else "Failed"
                    return
                if not self._shift(release, weight, "traffic shifted"):
                    return
                shifted = weight
                if index < len(d.steps) - 1:
                    time.sleep(release.interval_sec)
            release.status = "Succeeded"
            release.say("succeeded")
        except Exception as error:  # the release must end, whatever went wrong
            self._fail(release, "INTERNAL_ERROR", f"{type(error).__name__}: {error}")

    def _before_allow_traffic(self, release: Release, hook: HookDef) -> bool:
        if not self._as_role(release, "lambda:InvokeFunction", hook.arn):
            return False
        execution = uuid.uuid4().hex
        event = {"DeploymentId": release.deployment_id, "LifecycleEventHookExecutionId": execution}
        url = self._hook_environment(hook)
        release.say(f"BeforeAllowTraffic: invoking {hook.name}")
        import httpx

        from servestack.local.lambda_ import INVOKE_PREFIX, INVOKE_SUFFIX

        # CodeDeploy invokes the hook and waits for its PutLifecycleEventHookExecutionStatus. Locally the invocation
        # is awaited too, so that a hook that ended without a status fails the release at once (AWS would wait
        # for the lifecycle event's timeout, one hour) and the release's error carries what the hook said.
        answer = httpx.post(f"{url}{INVOKE_PREFIX}{hook.name}{INVOKE_SUFFIX}", content=json.dumps(event).encode(),
                            timeout=hook.timeout_sec + HOOK_MARGIN_SEC)  # fmt: skip
        said = answer.text[:600]
        deadline = time.monotonic() + 2
        while execution not in release.hook_status and time.monotonic() < deadline:
            time.sleep(0.05)
        verdict = release.hook_status.get(execution)
        if verdict is None:
            self._fail(release, "HOOK_EXECUTION_FAILURE", f"BeforeAllowTraffic: {hook.name} reported no status: {said}")
            return False
        if verdict != "Succeeded":
            self._fail(release, "HOOK_EXECUTION_FAILURE", f"BeforeAllowTraffic: {hook.name} reported Failed: {said}")
            return False
        release.say("BeforeAllowTraffic: Succeeded")
        return True

    def _alarms_quiet(self, release: Release) -> bool:
        d = release.definition
        if not d.alarms:
            return True
        from botocore.exceptions import ClientError

        from servestack.local.emulator import client_as

        cloudwatch = client_as("cloudwatch", self.emulator_url, self.credentials[d.service_role_arn], self.region)
        try:
            alarms = cloudwatch.describe_alarms(AlarmNames=list(d.alarms))["MetricAlarms"]
        except ClientError as error:
            self._fail(release, "ALARM_CONFIG_ERROR", f"the group's alarms could not be read: {error}")
            return False
        firing = [a["AlarmName"] for a in alarms if a.get("StateValue") == "ALARM"]
        if firing:
            release.say(f"alarm {firing[0]} in ALARM")
            release.error = {"code": "ALARM_ACTIVE", "message": f"alarm {firing[0]} is in ALARM"}
            return False
        return True

    def _shift(self, release: Release, weight: int, event: str) -> bool:
        d = release.definition
        if not self._as_role(release, "lambda:UpdateAlias", d.function_arn):
            return False
        release.say(f"{event}: {weight}% on version {d.version}")
        return True

    def _hook_environment(self, hook: HookDef) -> str:
        """The hook's execution environment (started at its first use): its inline code as `index.py`, its
        template environment, its role's keys; its SDK calls reach local up's Lambda and CodeDeploy APIs."""
        with self._lock:
            running = self.hooks.get(hook.name)
            if running is not None and running[0].poll() is None:
                return running[1]
            from servestack.local.hosting import free_port

            code = self.run_dir / "hooks" / hook.name
            code.mkdir(parents=True, exist_ok=True)
            (code / "index.py").write_text(hook.code)
            config = code / "function.json"
            config.write_text(json.dumps({"name": hook.name, "handler": "index.handler",
                                          "timeout_sec": hook.timeout_sec, "memory_mib": hook.memory_mib}))  # fmt: skip
            keys = self.identities.get(hook.role_arn.rsplit("/", 1)[-1], {})
            env = (
                self.env_base
                | hook.environment
                | {k: v for k, v in keys.items() if k.startswith("AWS_")}
                | {
                    "AWS_ENDPOINT_URL_LAMBDA": self.front_url,
                    "AWS_ENDPOINT_URL_CODEDEPLOY": self.front_url,
                    "AWS_LAMBDA_FUNCTION_NAME": hook.name,
                    "AWS_REGION": self.region,
                    "LAMBDA_TASK_ROOT": str(code),
                    "PYTHONPATH": str(code),
                }
            )
            port = free_port()
            argv = runner_command(config, port)
            process = subprocess.Popen(argv, env=env, cwd=code, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            self._ship_output(hook, process, keys)
            url = f"http://127.0.0.1:{port}"
            _wait_ready(url, process)
            self.hooks[hook.name] = (process, url)
            return url

    def _ship_output(self, hook: HookDef, process: subprocess.Popen[bytes], keys: dict[str, str]) -> None:
        """The hook's output to local up's and to its log group, written with its role's keys as Lambda writes
        a function's (servestack/local/logs/shipping.py): without its `logs:` grant, its lines are refused."""
        from servestack.local.emulator import client_as
        from servestack.local.iam import Credentials
        from servestack.local.logs import LogShipper, ensure_log_group, lambda_stream_name

        ensure_log_group(client_as("logs", self.emulator_url, self.access.developer, self.region), hook.log_group)
        role = Credentials(keys.get("arn", hook.role_arn), keys.get("AWS_ACCESS_KEY_ID", ""),
                           keys.get("AWS_SECRET_ACCESS_KEY", ""), keys.get("AWS_SESSION_TOKEN"))  # fmt: skip
        shipper = LogShipper(
            name=hook.name, group=hook.log_group, stream=lambda_stream_name(), role=role.arn,
            logs=client_as("logs", self.emulator_url, role, self.region),
            report=lambda line: print(line, file=sys.stderr, flush=True),
        )  # fmt: skip
        self.shippers.append(shipper)
        assert process.stdout is not None
        stream = process.stdout

        def pump() -> None:
            for raw in iter(stream.readline, b""):
                text = raw.decode(errors="replace").rstrip()
                print(f"[{hook.name}] {text}", flush=True)
                shipper(text)

        threading.Thread(target=pump, name=f"log-{hook.name}", daemon=True).start()


def _wait_ready(url: str, process: subprocess.Popen[bytes], timeout_sec: float = 60) -> None:
    import httpx

    deadline = time.monotonic() + timeout_sec
    while time.monotonic() < deadline and process.poll() is None:
        try:
            httpx.get(f"{url}/", timeout=2)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"the hook's execution environment did not start (exit {process.poll()})")


def _ok(body: dict[str, Any]) -> Reply:
    return Reply(200, {"Content-Type": "application/x-amz-json-1.1"}, json.dumps(body).encode())


def _error(status: int, code: str, message: str) -> Reply:
    body = {"__type": code, "message": message}
    return Reply(
        status, {"Content-Type": "application/x-amz-json-1.1", "x-amzn-ErrorType": code}, json.dumps(body).encode()
    )


def _wire(request: Request) -> Any:
    from servestack.local.iam import HttpRequest

    headers = {k.lower(): v for k, v in request.headers.items()}
    return HttpRequest(request.method, request.path, request.raw_query, headers, request.body, "127.0.0.1")
