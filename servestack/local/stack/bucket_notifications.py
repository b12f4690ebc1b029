"""CDK's bucket notifications (`Custom::S3BucketNotifications`) as CloudFormation runs them: by their handler,
under the handler's role.

`bucket.add_event_notification(...)` does not write the bucket's `NotificationConfiguration`: it adds a custom
resource whose `ServiceToken` is CDK's singleton handler function (`BucketNotificationsHandler...`, inline
code), which CloudFormation invokes on every create and update of the stack. For a bucket the stack owns
(`Managed: true`) the handler puts the configuration as given: `PutBucketNotificationConfiguration`
(`s3:PutBucketNotification` on the bucket) with its role's credentials, S3 checking the destinations unless
`SkipDestinationValidation`. A refusal fails the resource, and so the stack's create or update.

Local up makes that call for the handler, on the emulator's S3, signed with the handler role's keys: the
template's statements decide it, through the same enforcer as every other call. On start (the stack's
creation) a refusal stops local up, naming the AccessDenied; `POST /_servestack/cloudformation/stacks/{stack}/
update` (local up's own route, signed by the developer: CloudFormation runs the handler again on a stack
update) re-applies a stack's configurations and answers the refusal the same way, S3 keeping the
configuration it had. The handler's code itself is not run (its one S3 call is made for it); an unmanaged
bucket (the handler would merge with the bucket's configuration) is refused as a template local mode does not
run.
"""

from __future__ import annotations

import json
from typing import Any

from servestack.local.cloudformation import ACCOUNT
from servestack.local.hosting import Reply, Request
from servestack.local.stack.notification_resources import BucketNotificationsDef

ROUTE_PREFIX = "/_servestack/cloudformation/stacks/"
ROUTE_SUFFIX = "/update"


class HandlerRefused(RuntimeError):
    """The handler's call was refused: the resource, and so the stack's create or update, fails."""


class BucketNotifications:
    """The stacks' bucket-notification resources, applied as their handler's role (on start and on a stack
    update through the route)."""

    CONTROL_ROUTES = (("POST", f"{ROUTE_PREFIX}{{stack}}{ROUTE_SUFFIX}"),)  # local up's own (the developer's signature)

    def __init__(
        self,
        topologies: list[Any],
        access: Any,
        *,
        emulator_url: str,
        region: str,
        identities: dict[str, dict[str, str]],
    ) -> None:
        self.by_stack: dict[str, list[BucketNotificationsDef]] = {
            t.stack: list(t.bucket_notifications) for t in topologies
        }
        self.access = access
        self.emulator_url = emulator_url
        self.region = region
        self.identities = identities  # role name -> keys, as the state file records them

    def apply(self, stack: str, request_type: str) -> list[str]:
        """Run the stack's handlers as CloudFormation would for `request_type` (Create, Update): the resources
        applied, or `HandlerRefused` naming the first refusal."""
        from servestack.local.emulator import client_as
        from servestack.local.iam import Credentials
        from servestack.local.stack.provisioning import ProvisionError, apply_notifications
        from servestack.local.stack.topology import BucketDef

        applied = []
        for d in self.by_stack.get(stack, []):
            role = d.role_arn.rsplit("/", 1)[-1]
            keys = self.identities.get(role)
            if keys is None:
                raise HandlerRefused(f"stack {stack}: {d.logical_id}: the handler's role {role} is not a role of it")
            s3 = client_as("s3", self.emulator_url, Credentials.from_dict(keys), self.region)
            bucket = BucketDef(d.bucket_logical_id, d.bucket, f"arn:aws:s3:::{d.bucket}", False, d.configuration)
            may_send = None if d.skip_destination_validation else self.access.may_send
            try:
                apply_notifications(s3, bucket, ACCOUNT, may_send)
            except ProvisionError as error:
                raise HandlerRefused(f"stack {stack}: {d.logical_id} ({request_type}): {error}") from None
            except Exception as error:  # S3's refusal of the handler's call (botocore's ClientError)
                said = getattr(error, "response", {}).get("Error", {})
                raise HandlerRefused(
                    f"stack {stack}: {d.logical_id} ({request_type}) failed: {d.handler}'s "
                    f"PutBucketNotificationConfiguration on bucket {d.bucket} as role {role}: "
                    f"{said.get('Code', type(error).__name__)}: {said.get('Message', error)}"
                ) from None
            applied.append(d.logical_id)
        return applied

    def apply_all(self, request_type: str = "Create") -> None:
        for stack in self.by_stack:
            self.apply(stack, request_type)

    # ------------------------------------------------------------------------------------ the route
    @staticmethod
    def is_route(request: Request) -> bool:
        return request.path.startswith(ROUTE_PREFIX) and request.path.endswith(ROUTE_SUFFIX)

    def handle(self, request: Request) -> Reply:
        stack = request.path[len(ROUTE_PREFIX) : -len(ROUTE_SUFFIX)]
        if request.method != "POST":
            return _refused(405, "method", request.method, f"POST {ROUTE_PREFIX}<stack>{ROUTE_SUFFIX}")
        if self.access.enabled:
            identity = self.access.enforcer.check_request(request, "cloudformation")
            if isinstance(identity, Reply):
                return identity
            arn = f"arn:aws:cloudformation:{self.region}:{ACCOUNT}:stack/{stack}/*"
            decision = self.access.enforcer.authorize(identity, "cloudformation:UpdateStack", arn)
            if not decision.allowed:
                message = f"{identity.arn} is not authorized to perform: cloudformation:UpdateStack on {arn}"
                return _reply(403, {"error": {"code": "AccessDenied", "message": message}})
        if stack not in self.by_stack:
            return _refused(404, "stack", stack, f"one of local up's stacks ({', '.join(sorted(self.by_stack))})")
        try:
            applied = self.apply(stack, "Update")
        except HandlerRefused as refused:  # CloudFormation: UPDATE_FAILED, then the rollback
            return _reply(409, {"error": {"code": "UPDATE_FAILED", "message": str(refused)}})
        return _reply(200, {"stack": stack, "updated": applied})


def _reply(status: int, body: dict[str, Any]) -> Reply:
    return Reply(status, {"Content-Type": "application/json"}, json.dumps(body).encode())


def _refused(status: int, field: str, value: str, allowed: str) -> Reply:
    message = f"{field}: {value!r} is not allowed; {allowed}"
    return _reply(status, {"error": {"field": field, "value": value, "allowed": allowed, "message": message}})
