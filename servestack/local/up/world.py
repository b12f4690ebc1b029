"""The world `local up` runs from the templates: its plan, a loop over the service packages' planners (Lambda's
execution environments, API Gateway's fronts, the schedules, ECS's tasks, SageMaker's endpoint routers, a batch
deployment's data) that gives the children and the state file's entries, and the banner that says where
everything is."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servestack.local.apigateway import ApiGatewayPlanner, HttpApiDef
from servestack.local.batch import BatchPlanner
from servestack.local.cloudwatch import AlarmsPlanner
from servestack.local.ecs import EcsPlanner, TaskLaunch
from servestack.local.events import EventsPlanner
from servestack.local.hosting import free_port
from servestack.local.iam import Credentials, LocalAccess
from servestack.local.lambda_ import EventSourceMappingDef, FunctionDef, HostedFunction, LambdaPlanner
from servestack.local.logs import LogShipper
from servestack.local.planning import Child, LocalService, PlanContext, PlanError, ServicePlan, StagedImage
from servestack.local.sagemaker import (
    AsyncEndpoint,
    ComponentState,
    HostingSettings,
    RealtimeTarget,
    SageMakerPlanner,
)
from servestack.local.scheduler import ScheduleDef, SchedulerPlanner
from servestack.local.stack import StackTopology
from servestack.local.up.options import (
    UpError,
    UpOptions,
)
from servestack.spec import ServingSpec

# ------------------------------------------------------------------------------------------ the world


@dataclass
class Plan:
    children: list[Child] = field(default_factory=list)
    functions: list[HostedFunction] = field(default_factory=list)
    endpoints: dict[str, RealtimeTarget] = field(default_factory=dict)
    async_endpoints: dict[str, AsyncEndpoint] = field(default_factory=dict)
    apis: list[tuple[HttpApiDef, int]] = field(default_factory=list)  # (API, port)
    mappings: list[tuple[EventSourceMappingDef, FunctionDef, Credentials]] = field(default_factory=list)
    schedules: list[ScheduleDef] = field(default_factory=list)
    tasks: dict[str, TaskLaunch] = field(default_factory=dict)  # "<stack>/<task definition id>" -> its launch
    deployments: dict[str, dict[str, Any]] = field(default_factory=dict)
    identities: dict[str, dict[str, str]] = field(default_factory=dict)
    curls: list[str] = field(default_factory=list)
    aws_port: int = 0
    topologies: list[StackTopology] = field(default_factory=list)
    log_shippers: list[LogShipper] = field(default_factory=list)  # one per child

    @property
    def aws_api_url(self) -> str:
        return f"http://127.0.0.1:{self.aws_port}"


class StackResources:
    """The stack's own resources other commands find by the state file: its data bucket, queues and tables."""

    name = "stack"

    def plan(self, topology: StackTopology, context: PlanContext) -> ServicePlan:
        part = ServicePlan()
        buckets = [b for b in topology.buckets.values() if "accesslogs" not in b.logical_id.lower()]
        if buckets:
            part.entry["bucket"] = buckets[0].name
        if topology.queues:
            part.entry["queues"] = {queue.logical_id: queue.url for queue in topology.queues.values()}
        if topology.tables:
            part.entry["tables"] = {table.logical_id: table.name for table in topology.tables.values()}
        return part


@dataclass
class World:
    options: UpOptions
    spec: ServingSpec
    spec_file: Path
    project: Path  # serving.yaml's folder: its model packages
    work: Path
    region: str
    emulator_url: str
    access: LocalAccess
    aws: dict[str, Any]
    registry_uri: str
    service_endpoints: dict[str, str] = field(default_factory=dict)  # AWS_ENDPOINT_URL_<SERVICE> for functions
    components: dict[str, ComponentState] = field(default_factory=dict)  # inference component name -> its state
    component_routers: dict[str, str] = field(default_factory=dict)  # inference component -> router control URL
    notices: list[str] = field(default_factory=list)  # lines for the developer (releases applied at start)
    # (stack, stream logical id) -> its player, shared by the children whose log groups feed the stream
    firehose_players: dict[tuple[str, str], Callable[[list[str]], None]] = field(default_factory=dict)

    # ------------------------------------------------------------------------------------ what to run
    def plan(
        self,
        topologies: list[StackTopology],
        realtime_port: int,
        aws_port: int,
        api_ports: dict[tuple[str, str], int],
        env_base: dict[str, str],
    ) -> Plan:
        plan = Plan(aws_port=aws_port, topologies=topologies)
        # botocore's service-specific endpoints: a function calling SageMaker Runtime or Lambda reaches local up's
        # front for them; everything else goes to the emulator (AWS_ENDPOINT_URL).
        front = plan.aws_api_url
        self.service_endpoints = {"AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME": front, "AWS_ENDPOINT_URL_LAMBDA": front}
        run_dir = self.work / "run"
        run_dir.mkdir(parents=True, exist_ok=True)
        lambdas, apis = LambdaPlanner(), ApiGatewayPlanner(self.access.developer)
        schedules, tasks = SchedulerPlanner(), EcsPlanner()
        sagemaker = SageMakerPlanner(self._hosting_settings(realtime_port))
        from servestack.local.emulator import client_as

        alarms = AlarmsPlanner(client_as("cloudwatch", self.emulator_url, self.access.developer, self.region))
        # A fixed order: the state file's entry keeps its keys in the order they were always written.
        services: tuple[LocalService[StackTopology], ...] = (
            lambdas, apis, schedules, tasks, sagemaker, StackResources(), BatchPlanner(self.aws["s3"]),
            EventsPlanner(), alarms,
        )  # fmt: skip
        for topology in topologies:
            d = self.spec.deployments.get(topology.deployment)
            model = self.spec.model(d.model, d.version) if d is not None else None
            sample = self.project / model.artifact_path / "sample-request.json" if model else None
            entry: dict[str, Any] = {"mode": topology.mode, "stack": topology.stack, "outputs": topology.outputs}
            if sample is not None:
                entry["sample"] = str(sample)
            credentials = {
                r.logical_id: self.access.credentials_for(r.arn, r.policies) for r in topology.roles.values()
            }
            for role in topology.roles.values():
                plan.identities[role.name] = credentials[role.logical_id].to_dict()
            context = self._context(plan, topology, run_dir, env_base, credentials, api_ports, sample)
            for service in services:
                try:
                    part = service.plan(topology, context)
                except PlanError as error:
                    raise UpError(str(error)) from None
                plan.children += part.children
                if part.log_groups:
                    entry.setdefault("log_groups", {}).update(part.log_groups)
                entry |= part.entry
                plan.curls += part.commands
            plan.deployments[topology.deployment] = entry
        plan.functions, plan.mappings = lambdas.functions, lambdas.mappings
        plan.apis, plan.schedules, plan.tasks = apis.apis, schedules.schedules, tasks.tasks
        plan.endpoints, plan.async_endpoints = sagemaker.endpoints, sagemaker.async_endpoints
        self.components, self.component_routers = sagemaker.components, sagemaker.component_routers
        return plan

    def _context(
        self, plan: Plan, topology: StackTopology, run_dir: Path, env_base: dict[str, str],
        credentials: dict[str, Credentials], api_ports: dict[tuple[str, str], int], sample: Path | None,
    ) -> PlanContext:  # fmt: skip
        """What the service packages' planners are given of this world for one stack."""

        def log_shipper(name: str, group: str, keys: Credentials, stream: str | None) -> Callable[[str], None]:
            subscribers = self._subscribers(topology, group, credentials)
            return self._log_shipper(plan, name, group, keys, stream, subscribers)

        return PlanContext(
            region=self.region, emulator_url=self.emulator_url, work=self.work,
            run_dir=run_dir, env_base=env_base, service_endpoints=self.service_endpoints,
            credentials=credentials,
            api_ports={lid: port for (stack, lid), port in api_ports.items() if stack == topology.stack},
            free_port=free_port, log_shipper=log_shipper, sample=sample, stage_image=self._stage_image,
        )  # fmt: skip

    def _stage_image(self, image_uri: str) -> StagedImage | None:
        """An image asset's files as its Dockerfile places them (servestack/local/sagemaker/dockerfile.py)."""
        from servestack.local.cloudformation import image_asset
        from servestack.local.sagemaker import DockerfileError, image_requirements, read_image, stage_root

        asset = image_asset(self.work / "cdk.out", image_uri)
        if asset is None:
            return None
        try:
            image = read_image(asset)
            root = stage_root(image, asset.context, self.work / "images" / asset.tag[:24] / "rootfs")
            return StagedImage(root, image_requirements(image, root), image.cmd)
        except DockerfileError as error:
            raise PlanError(f"image {image_uri}: it cannot run locally: {error}") from None

    def _hosting_settings(self, realtime_port: int) -> HostingSettings:
        """What SageMaker's planner is given of local up's options, serving.yaml and its registry."""

        def model_sample(model: str) -> Path | None:
            declared = next((m for m in self.spec.models if m.name == model), None)
            return self.project / declared.artifact_path / "sample-request.json" if declared else None

        def fetch_package(model: str, version: str) -> Path:
            from servestack.registry import open_registry

            return open_registry(self.registry_uri, client=self.aws["s3"]).fetch(model, version, self.work / "packages")

        return HostingSettings(
            realtime_port=realtime_port, spec_file=self.spec_file, registry_uri=self.registry_uri,
            workers=self.options.workers, state_dir=self.options.data_dir or self.work / "emulator",
            developer=self.access.developer, model_version=lambda model: self.spec.model(model, None).version,
            model_sample=model_sample, fetch_package=fetch_package, seed_models=self._seed_models,
            notices=self.notices,
        )  # fmt: skip

    def _subscribers(
        self, topology: StackTopology, group: str, credentials: dict[str, Credentials]
    ) -> list[Callable[[list[str]], None]]:
        """The Firehose streams the log group's subscription filters feed, each played once per stack with its
        role's keys (servestack/local/firehose/)."""
        from servestack.local.emulator import client_as
        from servestack.local.firehose import FirehosePlayer

        found: list[Callable[[list[str]], None]] = []
        for delivery in topology.deliveries:
            if group not in delivery.groups or delivery.role not in credentials:
                continue
            key = (topology.stack, delivery.logical_id)
            if key not in self.firehose_players:
                s3 = client_as("s3", self.emulator_url, credentials[delivery.role], self.region)
                self.firehose_players[key] = FirehosePlayer(delivery, s3, _report)
            found.append(self.firehose_players[key])
        return found

    def _log_shipper(
        self,
        plan: Plan,
        name: str,
        group: str,
        credentials: Credentials,
        stream: str | None = None,
        subscribers: list[Callable[[list[str]], None]] | None = None,
    ) -> Callable[[str], None]:
        from servestack.local.emulator import client_as
        from servestack.local.logs import LogShipper, ensure_log_group, lambda_stream_name

        ensure_log_group(self.aws["logs"], group)  # the template's log group, created by the deploy
        shipper = LogShipper(
            name=name, group=group, stream=stream or lambda_stream_name(), role=credentials.arn,
            logs=client_as("logs", self.emulator_url, credentials, self.region),
            metrics=client_as("cloudwatch", self.emulator_url, self.access.developer, self.region),
            report=lambda line: print(line, file=sys.stderr, flush=True), subscribers=subscribers,
        )  # fmt: skip
        plan.log_shippers.append(shipper)
        return shipper

    def _seed_models(self, prefix: str) -> None:
        """The serving.yaml models under a multi-model endpoint's prefix (`<name>/<version>.tar.gz`), as
        `servestack models push --registry <prefix>` would put them there, so that TargetModel works at once."""
        from servestack.registry import seed_local

        seed_local(self.aws["s3"], self.spec, self.project / "models" / "artifacts", uri=prefix)

    # ------------------------------------------------------------------------------------ services
    def banner(self, plan: Plan, state_file: Path, timings: list[tuple[str, float]]) -> str:
        lines = [f"\naws emulator: {self.emulator_url}  (state: {state_file})"]
        keys = self.access.developer
        enforced = "enforced from the templates" if self.access.enabled else "NOT enforced"
        lines.append(f"IAM: {enforced}; developer keys {keys.access_key_id} / {keys.secret_access_key}")
        lines.append(f"{'deployment':<20} {'mode':<11} {'stack':<28} url / names")
        for name, entry in plan.deployments.items():
            where = (
                entry.get("url") or f"s3://{entry.get('input', {}).get('bucket', '?')}/{entry.get('input_prefix', '')}"
            )
            lines.append(f"{name:<20} {entry['mode']:<11} {entry['stack']:<28} {where}")
            for logical_id, function in entry.get("lambda_functions", {}).items():
                lines.append(f"{'':<20} {'':<11} {'  function ' + logical_id:<28} {function}")
            if "endpoint_name" in entry:
                lines.append(f"{'':<20} {'':<11} {'  sagemaker endpoint':<28} {entry['endpoint_name']}")
            for component in entry.get("components", {}):
                lines.append(f"{'':<20} {'':<11} {'  inference component':<28} {component}")
            for key, value in sorted(entry.get("outputs", {}).items()):
                if key not in ("SmokeKind", "SmokeTarget"):
                    lines.append(f"{'':<20} {'':<11} {'  output ' + key:<28} {value}")
        lines.append(f"{'(aws apis)':<20} {'boto3':<11} {'':<28} {plan.aws_api_url}")
        lines.append("")
        lines += plan.curls
        lines.append(f"\n# boto3: endpoint_url={plan.aws_api_url!r} for sagemaker-runtime and lambda, "
                     f"{self.emulator_url!r} for the rest; the developer keys above (docs/boto3-local.md)")  # fmt: skip
        lines.append("\nstartup: " + ", ".join(f"{what} {sec:.1f}s" for what, sec in timings))
        lines.append("\nCtrl-C stops everything.")
        return "\n".join(lines)


def _report(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
