"""The AWS API front of `local up`: one port where boto3's `sagemaker-runtime` and `lambda` clients work unchanged.

`boto3.client("sagemaker-runtime", endpoint_url=URL)` and `boto3.client("lambda", endpoint_url=URL)` talk to
this server (their paths do not collide). Every request is authenticated (SigV4) and authorized
(`sagemaker:InvokeEndpoint`, `lambda:InvokeFunction`...) as in the cloud, then:
- `/endpoints/{EndpointName}/...`: servestack/local/sagemaker/runtime_front.py;
- `/2015-03-31/functions/{FunctionName}/invocations`: the Lambda service (servestack/local/lambda_/service.py),
  by the template's function names, ARNs and qualifiers;
- `POST /` with `X-Amz-Target: SageMaker.DescribeInferenceComponent` or `...UpdateInferenceComponentRuntimeConfig`
  (boto3's `sagemaker` client): the templates' inference components
  (servestack/local/sagemaker/inference_components.py);
- `POST /` with `X-Amz-Target: SageMaker.CreateTransformJob` or `...DescribeTransformJob`: the transform jobs an
  engine: transform schedule creates (servestack/local/sagemaker/transform_jobs.py), and `POST
  /_servestack/transform-jobs/
  {name}`, local up's own route where `local run-batch` reports a job's end (signed by the developer, refused
  otherwise);
- `POST /` with `X-Amz-Target: CodeDeploy_20141006.<Op>`: CodeDeploy for the serverless deployments' releases
  (servestack/local/codedeploy/deployments.py);
- `POST /` with `X-Amz-Target: AmazonEC2ContainerServiceV20141113.RunTask`: ECS RunTask of the templates' task
  definitions, authorized as the caller's role (servestack/local/ecs/tasks.py);
- `GET /schedules/{Name}`: Scheduler's GetSchedule of the templates' schedules, and `POST /_servestack/schedules/
  {Name}/fire`, local up's own route that fires one now (servestack/local/scheduler/api.py);
- `/_servestack/iam/roles[/{name}]`: local up's own route to the running IAM store's roles
  (servestack/local/iam/roles_route.py);
- `POST /_servestack/cloudformation/stacks/{stack}/update`: local up's own route that runs a stack's
  bucket-notification handlers again, as a stack update does (servestack/local/stack/bucket_notifications.py).
Every route under `/_servestack/` (`CONTROL_ROUTES`, and any other path there) answers only the developer's
signature, checked before the route is looked up (servestack/local/iam/control.py), with or without `--no-iam`.
"""

from __future__ import annotations

from servestack.local.cloudformation import ACCOUNT
from servestack.local.cloudformation import DEFAULT_REGION as REGION
from servestack.local.codedeploy import LocalCodeDeploy
from servestack.local.ecs import EcsRunTask
from servestack.local.hosting import LocalHttpServer, Reply, Request
from servestack.local.iam import ControlGate, LocalAccess, RolePolicies, is_control_path
from servestack.local.lambda_ import INVOKE_PREFIX, INVOKE_SUFFIX, LambdaService, lambda_error
from servestack.local.sagemaker import (
    ENDPOINT_PREFIX,
    ComponentState,
    InferenceComponents,
    SageMakerRuntime,
    TransformJobs,
)
from servestack.local.scheduler import SchedulerApi
from servestack.local.stack import BucketNotifications

# Local up's own routes on this port, as (method, path with `{name}` placeholders): the unsigned sweep of
# tests/functional/test_control_routes.py walks them (and checks no other `/_servestack/` path is in the code).
CONTROL_ROUTES = (
    *TransformJobs.CONTROL_ROUTES,
    *SchedulerApi.CONTROL_ROUTES,
    *RolePolicies.CONTROL_ROUTES,
    *BucketNotifications.CONTROL_ROUTES,
)
MAX_BODY_BYTES = 7 * 1024 * 1024  # above both services' request limits (6 MB), which they check themselves


class AwsFront:
    """SageMaker Runtime and Lambda Invoke on one port."""

    def __init__(
        self,
        sagemaker: SageMakerRuntime,
        lambdas: LambdaService,
        access: LocalAccess,
        port: int = 0,
        components: InferenceComponents | None = None,
        transform_jobs: TransformJobs | None = None,
        codedeploy: LocalCodeDeploy | None = None,
        scheduler: SchedulerApi | None = None,
        ecs: EcsRunTask | None = None,
        notifications: BucketNotifications | None = None,
    ) -> None:
        self.sagemaker = sagemaker
        self.lambdas = lambdas
        self.access = access
        self.components = components or InferenceComponents({}, _no_scaling)
        self.transform_jobs = transform_jobs or TransformJobs((), REGION, ACCOUNT)
        self.codedeploy = codedeploy
        self.scheduler = scheduler
        self.ecs = ecs
        self.notifications = notifications
        # Local up's own routes (`/_servestack/...`) answer only the developer's signature (iam/control.py).
        self.control = ControlGate(
            access.store, access.developer, region=access.enforcer.region, log=access.enforcer.log
        )
        self.server = LocalHttpServer(
            "aws-api",
            self.handle,
            port,
            max_body_bytes=MAX_BODY_BYTES,
            too_large=lambda length: lambda_error(
                413, "RequestTooLargeException", f"Request must be smaller than {MAX_BODY_BYTES} bytes ({length})"
            ),
        )
        self.url = self.server.url

    def handle(self, request: Request) -> Reply:
        path = request.path
        if is_control_path(path):  # local up's own routes: the developer's signature, whatever the route
            refused = self.control.refusal_of(
                request.method, path, request.raw_query, request.headers, request.body, request.source_ip
            )
            if refused is not None:
                return refused
        if path.startswith(ENDPOINT_PREFIX):
            allowed = self.access.check(request, "sagemaker")
            return allowed if isinstance(allowed, Reply) else self.sagemaker.handle(request)
        if TransformJobs.is_control_plane(request):
            allowed = self.access.check(request, "sagemaker")
            return allowed if isinstance(allowed, Reply) else self.transform_jobs.handle(request)
        if self.codedeploy is not None and LocalCodeDeploy.is_api(request):  # it authorizes on the group's ARN
            return self.codedeploy.handle(request)
        if self.scheduler is not None and SchedulerApi.is_fire_route(request):  # local up's own: fire now
            return self.scheduler.fire(request)
        if self.scheduler is not None and SchedulerApi.is_api(request):
            allowed = self.access.check(request, "scheduler")
            return allowed if isinstance(allowed, Reply) else self.scheduler.handle(request)
        if self.ecs is not None and EcsRunTask.is_api(request):  # it authorizes RunTask and PassRole itself
            return self.ecs.handle(request)
        if RolePolicies.is_route(request):  # local up's own: the running IAM store's roles
            return RolePolicies(self.access).handle(request)
        if self.notifications is not None and BucketNotifications.is_route(request):  # it authorizes the caller
            return self.notifications.handle(request)
        if TransformJobs.is_report(request):
            return self.transform_jobs.report(request)
        if InferenceComponents.is_control_plane(request):
            allowed = self.access.check(request, "sagemaker")
            return allowed if isinstance(allowed, Reply) else self.components.handle(request)
        if request.method == "POST" and path.startswith(INVOKE_PREFIX) and path.endswith(INVOKE_SUFFIX):
            allowed = self.access.check(request, "lambda")
            if isinstance(allowed, Reply):
                return allowed
            name = LambdaService.invoke_path_name(path)
            return self.lambdas.forward(name, request.query.get("Qualifier") or None, request.headers, request.body)
        return lambda_error(
            404,
            "UnknownOperationException",
            f"{request.method} {path}: local up answers SageMaker Runtime InvokeEndpoint/InvokeEndpointAsync, "
            "SageMaker DescribeInferenceComponent/UpdateInferenceComponentRuntimeConfig/CreateTransformJob/"
            "DescribeTransformJob, ECS RunTask and Lambda Invoke here",
        )

    def serve_in_background(self) -> AwsFront:
        self.server.serve_in_background()
        return self

    def close(self) -> None:
        self.server.close()
        self.sagemaker.close()


def _no_scaling(component: ComponentState, copies: int) -> None:
    raise RuntimeError(f"{component.name}: this front runs no inference components")
