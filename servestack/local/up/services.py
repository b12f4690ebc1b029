"""The AWS services `local up` plays in its own process, around its children: the AWS API front (SageMaker
Runtime, Lambda Invoke, inference components, transform jobs, the scheduler's API, CodeDeploy), the HTTP API
fronts, the SQS event source mappings, and the EventBridge schedules with their targets."""

from __future__ import annotations

# ------------------------------------------------------------------------------------------ the world
import functools
import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from servestack.local.planning import pump
from servestack.local.scheduler import ScheduleDef
from servestack.local.up.environment import (
    base_environment,
)
from servestack.local.up.options import UpError
from servestack.local.up.world import Plan, World

if TYPE_CHECKING:
    from servestack.local.hosting import Reply, Request
    from servestack.local.lambda_ import LambdaService
    from servestack.local.sagemaker import AsyncInvocations, ComponentState


def start_services(world: World, plan: Plan) -> list[Callable[[], None]]:
    import httpx

    from servestack.local.apigateway import HttpApiFront
    from servestack.local.cloudwatch import ServiceCounter
    from servestack.local.emulator import client_as
    from servestack.local.lambda_ import LambdaService, SqsPoller
    from servestack.local.sagemaker import SageMakerRuntime
    from servestack.local.scheduler import ScheduleRunner
    from servestack.local.up.aws_front import AwsFront

    closers: list[Callable[[], None]] = []
    # Lambda's and Scheduler's own metrics, counted as those services count them (failure alarms watch them)
    counter = ServiceCounter(client_as("cloudwatch", world.emulator_url, world.access.developer, world.region))
    lambdas = LambdaService(
        plan.functions, httpx.Client(timeout=httpx.Timeout(960.0, connect=5.0)), on_failure=counter.function_failed
    )
    closers.append(lambdas.close)
    from servestack.local.sagemaker import AsyncInferenceConfig, AsyncInvocations, AsyncTarget

    asynchronous: dict[str, AsyncTarget] = {}
    for name, hosted in plan.async_endpoints.items():
        invocations = AsyncInvocations(
            endpoint_name=name,
            container_url=hosted.url,
            config=AsyncInferenceConfig.from_endpoint_config({"AsyncInferenceConfig": hosted.config}),
            s3=client_as("s3", world.emulator_url, hosted.credentials, world.region),
            sns=client_as("sns", world.emulator_url, hosted.credentials, world.region),
        )
        closers.append(invocations.close)
        asynchronous[name] = AsyncTarget(_submitter(invocations))
    runtime = SageMakerRuntime(plan.endpoints, asynchronous, world.aws["s3"])
    from servestack.local.cloudformation import ACCOUNT
    from servestack.local.sagemaker import InferenceComponents, TransformJobs

    components = InferenceComponents(
        world.components, functools.partial(scale_component, world), functools.partial(serving_copies, world)
    )
    models = [model for topology in plan.topologies for model in topology.models]
    model_roles = {
        str(transform.job["ModelName"]): topology.roles[transform.execution_role].arn
        for topology in plan.topologies for transform in topology.transforms
    }  # fmt: skip
    jobs = TransformJobs(models, world.region, ACCOUNT, has_objects=functools.partial(has_objects, world.aws["s3"]),
                         model_roles=model_roles)  # fmt: skip
    from servestack.local.codedeploy import LocalCodeDeploy

    releases = [d for topology in plan.topologies for d in topology.lambda_deployments]
    codedeploy = LocalCodeDeploy(
        releases, world.access, emulator_url=world.emulator_url, front_url=plan.aws_api_url, region=world.region,
        env_base=base_environment() | {"AWS_ENDPOINT_URL": world.emulator_url, "AWS_DEFAULT_REGION": world.region},
        run_dir=world.work / "run", identities=plan.identities,
    )  # fmt: skip
    closers.append(codedeploy.close)
    for topology in plan.topologies:  # what `local deploy` names in CreateDeployment
        for release in topology.lambda_deployments:
            plan.deployments[topology.deployment]["codedeploy"] = {
                "application": release.application, "group": release.group,
            }  # fmt: skip
    from servestack.local.scheduler import SchedulerApi

    schedules = SchedulerApi(plan.schedules, world.region, ACCOUNT)
    from servestack.local.ecs import EcsRunTask
    from servestack.local.stack import BucketNotifications, HandlerRefused

    ecs = EcsRunTask(plan.tasks, world.access, world.region, ACCOUNT)
    notifications = BucketNotifications(plan.topologies, world.access, emulator_url=world.emulator_url,
                                        region=world.region, identities=plan.identities)  # fmt: skip
    try:  # CDK's notification handler, as CloudFormation runs it when it creates the stacks
        notifications.apply_all("Create")
    except HandlerRefused as refused:
        raise UpError(str(refused)) from None
    front = AwsFront(runtime, lambdas, world.access, plan.aws_port, components, jobs, codedeploy, schedules,
                     ecs=ecs, notifications=notifications)  # fmt: skip
    front = front.serve_in_background()
    closers.append(front.close)
    for api, port in plan.apis:
        http_front = HttpApiFront(
            api, lambdas, functools.partial(authorize_api, world), port=port
        ).serve_in_background()
        closers.append(http_front.close)
    stop = threading.Event()
    threads: list[threading.Thread] = []
    for mapping, function, credentials in plan.mappings:
        if not mapping.enabled:
            continue
        sqs = client_as("sqs", world.emulator_url, credentials, world.region)
        queue_url = next(q.url for t in plan.topologies for q in t.queues.values() if q.arn == mapping.queue_arn)
        poller = SqsPoller(
            sqs, queue_url, RemoteFunction(lambdas, function.name),
            batch_size=mapping.batch_size, batch_window_sec=mapping.window_sec,
            report_batch_item_failures=mapping.report_batch_item_failures,
        )  # fmt: skip
        thread = threading.Thread(target=poller.run, args=(stop,), name=f"esm-{function.name}", daemon=True)
        thread.start()
        threads.append(thread)
    runners = []
    for schedule in plan.schedules:
        start_job = None
        if schedule.universal is not None:
            start_job = transform_starter(world, plan, schedule)
            if start_job is None:  # an SDK action local mode does not make (servestack/local/stack/topology.py)
                print(f"schedule {schedule.name}: its {schedule.universal} target is not run locally", flush=True)
                continue
        role = schedule.role_arn.rsplit("/", 1)[-1]
        keys = plan.identities.get(role)
        runner = ScheduleRunner(
            schedule, lambdas, world.access.authorize, dead_letter_sender(world, keys),
            run_task=task_runner(world, plan, schedule.role_arn), start_job=start_job,
            before_run=seed_retirement(world, plan, schedule), on_target_error=counter.target_failed,
        )  # fmt: skip
        runners.append(runner.start())
        schedules.runners[schedule.name] = runner  # `POST /_servestack/schedules/{name}/fire`

    def stop_threads() -> None:
        stop.set()
        for runner in runners:
            runner.stop()
        for thread in threads:
            thread.join(timeout=5)

    closers.append(stop_threads)
    return closers


def has_objects(s3: Any, bucket: str, prefix: str) -> bool:
    """Whether any object is under the prefix (SageMaker's own listing before it creates a transform job)."""
    try:
        return int(s3.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1).get("KeyCount", 0)) > 0
    except Exception as error:  # a missing bucket holds no object; anything else is local up's to report
        if getattr(error, "response", {}).get("Error", {}).get("Code") == "NoSuchBucket":
            return False
        raise


def scale_component(world: World, component: ComponentState, copies: int) -> None:
    """Tell the component's router to run its copies (0 stops its container); returns once they serve."""
    from servestack.local.emulator import control

    url = f"{world.component_routers[component.name]}/_servestack/components/{component.name}"
    status, answer = control("POST", url, world.access.developer, world.region, {"copies": copies}, timeout_sec=180)
    if status != 200:
        raise RuntimeError(f"the endpoint's router answered {status}: {str(answer)[:300]}")


def serving_copies(world: World, component: ComponentState) -> tuple[int, int] | None:
    from servestack.local.sagemaker import copies_on_router

    return copies_on_router(
        world.component_routers[component.name], component.name, world.access.developer, world.region
    )


def authorize_api(world: World, request: Request, resource: str) -> dict[str, Any] | Reply:
    return world.access.check(request, "execute-api", resource)


def transform_starter(world: World, plan: Plan, schedule: ScheduleDef) -> Callable[[ScheduleDef], str | None] | None:
    """Scheduler's universal target `sagemaker:createTransformJob`: CreateTransformJob on local up's SageMaker
    API as the schedule's role (as `local run-batch` makes it), then the job, emulated, in the background."""
    if schedule.universal != "sagemaker:createTransformJob":
        return None
    found = [
        (name, entry) for name, entry in plan.deployments.items()
        if entry.get("transform") is not None and entry.get("schedule_name") == schedule.name
    ]  # fmt: skip
    if not found:
        return None
    name, entry = found[0]
    about = {
        "endpoint_url": world.emulator_url, "aws_api_url": plan.aws_api_url, "region": world.region,
        "identities": plan.identities, "developer": world.access.developer.to_dict(), "project": str(world.project),
    }  # fmt: skip

    def start(_: ScheduleDef) -> str | None:
        from servestack.local.emulator import sagemaker_runtime
        from servestack.local.sagemaker import JobRefused, create_job, execute_job

        try:
            job = create_job(about, entry["transform"])
        except JobRefused as refused:
            return str(refused)

        def run() -> None:  # the job's failure is its record (DescribeTransformJob), not the schedule's
            try:
                execute_job(about, name, entry["transform"], job, sagemaker_runtime(about))
            except Exception as error:  # the manifest step's invocation: reported, as EventBridge's would be
                print(f"transform job {job['TransformJobName']}: {error}", file=sys.stderr, flush=True)

        threading.Thread(target=run, name=f"transform-{job['TransformJobName']}", daemon=True).start()
        return None

    return start


def seed_retirement(world: World, plan: Plan, schedule: ScheduleDef) -> Callable[[ScheduleDef], None] | None:
    """Before a batch schedule's run, local up's sample leaves its input prefix once the user's input is there,
    as before `local run-batch` (servestack/local/batch/seed.py): a seeded row never ends up in the user's
    results."""
    from servestack.local.batch import retire_seeded_input

    entry = next((e for e in plan.deployments.values() if e.get("schedule_name") == schedule.name), {})
    source = entry.get("input") or {}
    bucket, prefix = source.get("bucket"), source.get("input_prefix")
    if not bucket or not prefix:
        return None

    def retire(_: ScheduleDef) -> None:
        retire_seeded_input(world.aws["s3"], bucket, prefix)

    return retire


def task_runner(world: World, plan: Plan, role_arn: str) -> Callable[[ScheduleDef], str | None]:
    """Scheduler's ECS target: as the schedule's role (ecs:RunTask on the task definition), start the task's
    container command as a process with its environment and task role."""

    def run(schedule: ScheduleDef) -> str | None:
        from servestack.local.ecs import report_task_stopped, run_task_refusal, task_endpoints, task_process
        from servestack.local.emulator import client_as

        stack = next((t.stack for t in plan.topologies if schedule in t.schedules), "")
        launch = plan.tasks.get(f"{stack}/{schedule.task}")  # logical ids repeat across stacks
        if launch is None:
            return f"task definition {schedule.task} is not in the templates"
        refused = run_task_refusal(world.access.authorize, role_arn, launch)
        if refused is not None:
            return refused
        argv, cwd, env = task_process(
            launch, host_environment=base_environment(),
            endpoints=task_endpoints(world.emulator_url, plan.aws_api_url, world.region),
            keys=plan.identities.get(launch.role or "", {}),
        )  # fmt: skip
        process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert process.stdout is not None
        pump(f"task {schedule.task}", process.stdout, sys.stdout)
        code = process.wait()
        # RunTask succeeded: whatever the task did is ECS's event for the rules, not the schedule's failure
        task_arn = f"{schedule.target_arn.replace(':cluster/', ':task/', 1)}/{uuid.uuid4().hex}"
        cloudwatch = client_as("cloudwatch", world.emulator_url, world.access.developer, world.region)
        try:
            states = report_task_stopped(plan.deployments, cloudwatch, region=world.region,
                                         cluster_arn=schedule.target_arn, task_arn=task_arn, launch=launch,
                                         exit_code=code)  # fmt: skip
        except Exception as error:  # the event's delivery is EventBridge's; the schedule keeps firing
            print(f"task {schedule.task}: its stop event was not delivered: {error}", file=sys.stderr, flush=True)
            return None
        for alarm, state in states.items():
            print(f"task {schedule.task} exited {code}: alarm {alarm} is {state}", flush=True)
        return None

    return run


def dead_letter_sender(world: World, keys: dict[str, str] | None) -> Callable[[str, str, dict[str, Any]], None]:
    from servestack.local.emulator import client_as
    from servestack.local.iam import Credentials
    from servestack.local.scheduler import send_dead_letter

    def send(queue_arn: str, body: str, attributes: dict[str, Any]) -> None:
        if keys is None:
            return
        credentials = Credentials.from_dict(keys)
        sqs = client_as("sqs", world.emulator_url, credentials, world.region)
        send_dead_letter(sqs, world.emulator_url, queue_arn, body, attributes)

    return send


# ------------------------------------------------------------------------------------ banner


# (bucket, key, content type, accept, inference id) -> (output location, failure location)
Submit = Callable[[str, str, str | None, str | None, str], tuple[str, str | None]]


def _submitter(invocations: AsyncInvocations) -> Submit:
    def submit(
        bucket: str, key: str, content_type: str | None, accept: str | None, inference_id: str
    ) -> tuple[str, str | None]:
        accepted = invocations.invoke(
            input_location=f"s3://{bucket}/{key}", content_type=content_type, accept=accept, inference_id=inference_id
        )
        return str(accepted.output_location), accepted.failure_location

    return submit


class RemoteFunction:
    """A function of the Lambda service, invoked synchronously; raises when the invocation failed."""

    def __init__(self, lambdas: LambdaService, name: str) -> None:
        self.lambdas = lambdas
        self.name = name

    def invoke(self, event: Any) -> Any:
        invocation = self.lambdas.invoke(self.name, json.dumps(event).encode())
        if invocation.status != 200 or invocation.function_error:
            raise RuntimeError(f"{self.name}: invocation failed ({invocation.status}): {invocation.body[:500]!r}")
        return json.loads(invocation.body) if invocation.body else None
