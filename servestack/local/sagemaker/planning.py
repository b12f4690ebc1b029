"""SageMaker's part of `local up`'s plan: each endpoint of a stack as one child, its router, in front of one
container per variant (or inference component), each started as SageMaker would: its image pulled and its model
data fetched with the model's execution role; and what the runtime front, the asynchronous invocations and the
inference components' API need of it."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from servestack.local.iam import Credentials
from servestack.local.planning import Child, PlanContext, PlanError, ServicePlan, map_paths, shown
from servestack.local.sagemaker.container import staged_container
from servestack.local.sagemaker.definitions import ComponentDef, EndpointDef, VariantDef
from servestack.local.sagemaker.dockerfile import DockerfileError
from servestack.local.sagemaker.inference_components import ComponentState
from servestack.local.sagemaker.releases import apply as apply_release
from servestack.local.sagemaker.runtime_front import RealtimeTarget
from servestack.local.sagemaker.variant_start import (
    CONTAINER_MODEL_DIR,
    ContainerSource,
    VariantStartError,
    prepare,
)


class EndpointStack(Protocol):
    """What SageMaker's hosting reads of a stack's topology."""

    @property
    def deployment(self) -> str: ...
    @property
    def mode(self) -> str: ...
    @property
    def endpoints(self) -> dict[str, EndpointDef]: ...


@dataclass(frozen=True)
class HostingSettings:
    """What SageMaker's planner is given beyond a stack's context: `local up`'s options, the developer's keys
    (the router is SageMaker's side), and serving.yaml's models and registry, as callables."""

    realtime_port: int  # the first realtime endpoint's port (`--port`)
    spec_file: Path
    registry_uri: str
    workers: int
    state_dir: Path  # the emulator's saved state: each variant's model data under sagemaker/<endpoint>/<variant>
    developer: Credentials
    model_version: Callable[[str], str]  # a serving.yaml model -> its version
    model_sample: Callable[[str], Path | None]  # a serving.yaml model -> its sample request, None for no such model
    fetch_package: Callable[[str, str], Path]  # (model, version) -> its package from the registry
    seed_models: Callable[[str], None]  # serving.yaml's models under a multi-model endpoint's S3 prefix
    notices: list[str] = field(default_factory=list)  # releases `local deploy` left live, applied at start


@dataclass(frozen=True)
class AsyncEndpoint:
    """An asynchronous endpoint: its container, its AsyncInferenceConfig and the execution role's keys."""

    url: str
    config: dict[str, Any]
    credentials: Credentials


def _realtime_commands(url: str, components: dict[str, Any], sample: Path | None) -> list[str]:
    """The banner's curls for a realtime endpoint: its ping, and an invocation with the model's sample request
    (one per inference component that has one)."""
    lines = [f"curl -s {url}/ping"]
    for name, component in components.items():
        if component.get("sample"):
            lines.append(
                f"curl -s -X POST {url}/invocations -H 'Content-Type: application/json' "
                f"-H 'X-Amzn-SageMaker-Inference-Component: {name}' --data @{shown(Path(component['sample']))}"
            )
    if sample is not None and not components:
        lines.append(f"curl -s -X POST {url}/invocations -H 'Content-Type: application/json' --data @{shown(sample)}")
    return lines


def first_version(model_dir: Path, model: str) -> str:
    versions = sorted(p.parent.name for p in (model_dir / model).glob("*/manifest.json"))
    if not versions:
        raise PlanError(f"{model_dir}: the model data holds no {model}/<version>/manifest.json")
    return versions[0]


class SageMakerPlanner:
    """The endpoints of every stack planned so far: the runtime front's targets, the asynchronous ones, and the
    inference components with the control URL of the router that runs each."""

    name = "sagemaker"

    def __init__(self, settings: HostingSettings) -> None:
        self.settings = settings
        self.endpoints: dict[str, RealtimeTarget] = {}
        self.async_endpoints: dict[str, AsyncEndpoint] = {}
        self.components: dict[str, ComponentState] = {}
        self.component_routers: dict[str, str] = {}  # inference component -> router control URL
        self._realtime_port_taken = False

    def plan(self, topology: EndpointStack, context: PlanContext) -> ServicePlan:
        part = ServicePlan()
        for endpoint in topology.endpoints.values():
            port = context.free_port() if self._realtime_port_taken else self.settings.realtime_port
            self._realtime_port_taken = True
            child, target, control_url = self._endpoint(topology.deployment, endpoint, port, context)
            # SageMaker writes each container's output to the endpoint's group with the execution role.
            group = f"/aws/sagemaker/Endpoints/{endpoint.name}"
            hosts: tuple[ComponentDef, ...] | tuple[VariantDef, ...] = endpoint.components or endpoint.variants
            log_role = endpoint.execution_role or next((h.execution_role for h in hosts if h.execution_role), None)
            if log_role is not None:
                stream = f"{hosts[0].name}/local-{uuid.uuid4().hex[:17]}"
                child.sinks.append(context.log_shipper(child.name, group, context.credentials[log_role], stream))
                part.log_groups[endpoint.name] = group
            part.children.append(child)
            part.entry["control_url"] = control_url  # the router's admin routes, the CLI's
            if endpoint.async_config is not None:
                # An asynchronous endpoint: InvokeEndpointAsync only; SageMaker writes the outcome to S3 and
                # publishes it to SNS with the model's execution role.
                execution_role = endpoint.variants[0].execution_role
                assert execution_role is not None  # an asynchronous endpoint's variant hosts a model
                self.async_endpoints[endpoint.name] = AsyncEndpoint(
                    target.url, endpoint.async_config, context.credentials[execution_role]
                )
                part.entry |= {"endpoint_name": endpoint.name, "container_url": target.url}
            else:
                self.endpoints[endpoint.name] = target
                part.entry |= {"url": target.url, "endpoint_name": endpoint.name}
            if endpoint.components:
                part.entry["components"] = {
                    c.name: self._component_entry(c.container.environment.get("SERVESTACK_DEFAULT_MODEL", ""))
                    for c in endpoint.components
                }
        if topology.mode == "realtime" and part.entry.get("url"):
            part.commands = _realtime_commands(part.entry["url"], part.entry.get("components") or {}, context.sample)
        return part

    def _endpoint(
        self, deployment: str, endpoint: EndpointDef, port: int, context: PlanContext
    ) -> tuple[Child, RealtimeTarget, str]:
        multi_model_roots: dict[str, Path] = {}
        credentials = context.credentials

        def variant(v: VariantDef | ComponentDef, component: str | None = None) -> dict[str, Any]:
            """A variant's (or an inference component's) container as the router starts it."""
            container = v.container
            assert container is not None  # only variants that run a container are started
            assert v.execution_role is not None  # and each runs its model as its execution role
            env = dict(container.environment)
            if container.mode == "MultiModel":
                # SageMaker downloads TargetModel archives from the ModelDataUrl prefix into /opt/ml/models.
                root = context.work / "multi-model" / endpoint.name / v.name
                root.mkdir(parents=True, exist_ok=True)
                multi_model_roots[v.name] = root
                env["SERVESTACK_MULTI_MODEL_ROOT"] = str(root)
            # SageMaker's image pull and model download, with the model's execution role (variant_start.py);
            # the router starts each green fleet of a rehearsal with the same source.
            source, package_dir = self._start_container(endpoint.name, v, credentials[v.execution_role], context)
            if package_dir is not None:
                env = map_paths(env, {CONTAINER_MODEL_DIR: str(package_dir)})
            model = env.get("SERVESTACK_DEFAULT_MODEL", "")
            version = first_version(package_dir, model) if package_dir else self.settings.model_version(model)
            command, image_env = self._container_command(endpoint.name, container.image, context.work)
            env = image_env | env | credentials[v.execution_role].environment()  # the model's Environment wins
            source = replace(source, model_version=version if package_dir else None)
            return {"name": v.name, "model": model, "version": version, "weight": getattr(v, "weight", 1.0),
                    "package_dir": str(package_dir) if package_dir else None, "environment": env,
                    "component": component, "command": command, "source": source.to_dict()}  # fmt: skip

        if endpoint.components:
            # One container per inference component, from the model it names (its variant runs no model).
            variants = [variant(c, component=c.name) for c in endpoint.components]
        else:
            variants = [variant(v) for v in endpoint.variants]
        variants = [self._released(deployment, v, context.work) for v in variants]
        shadow = variant(endpoint.shadow_variants[0]) if endpoint.shadow_variants else None
        production_weight = sum(v["weight"] for v in variants) or 1.0
        config = {
            "deployment": deployment,
            "endpoint": endpoint.name,
            "variants": variants,
            "shadow": shadow,
            "shadow_percent": (shadow["weight"] / production_weight * 100) if shadow else 0.0,
            "registry_uri": self.settings.registry_uri,
            "workers": self.settings.workers,
            "cache_dir": str(context.work / "packages"),
            # What SageMaker lets through to the containers: the router refuses past it, as the engine does.
            "max_body_bytes": endpoint_payload_limit(endpoint),
        }
        role = next((v.execution_role for v in endpoint.variants if v.execution_role), None)
        if endpoint.data_capture is not None and role is not None:
            # SageMaker writes the captured records with the model's execution role (data_capture.py).
            config["capture"] = {
                "config": endpoint.data_capture, "emulator_url": context.emulator_url, "region": context.region,
                "credentials": credentials[role].to_dict(),
            }  # fmt: skip
        path = context.run_dir / f"endpoint-{endpoint.name}.json"
        path.touch(mode=0o600)
        path.chmod(0o600)  # it holds each variant's execution role keys: your user's alone, as the state file
        path.write_text(json.dumps(config, indent=2))
        control_url = f"http://127.0.0.1:{context.free_port()}"
        argv = [sys.executable, "-m", "servestack.local.sagemaker.endpoint", "--config", str(path), "--port", str(port),
                "--control-port", control_url.rsplit(":", 1)[1], "--spec", str(self.settings.spec_file)]  # fmt: skip
        # The router is SageMaker's side (it pulls new versions for rehearsals): the developer's keys.
        env = context.env_base | self.settings.developer.environment()
        url = f"http://127.0.0.1:{port}"
        names = tuple(v.name for v in endpoint.variants)
        child = Child(f"{deployment}/endpoint", argv, env, f"{url}/ping", ready_status=200)
        if endpoint.components:
            states = {
                c.name: ComponentState(
                    c.name, c.arn, endpoint.name, endpoint.arn, c.variant, c.model_name, c.compute, c.copies, c.copies
                )
                for c in endpoint.components
            }
            self.components.update(states)
            self.component_routers.update(dict.fromkeys(states, control_url))
            return child, RealtimeTarget(url, names, components=states), control_url
        multi = [v for v in endpoint.variants if v.container is not None and v.container.mode == "MultiModel"]
        if not multi:
            return child, RealtimeTarget(url, names, max_body_bytes=endpoint_payload_limit(endpoint)), control_url
        from servestack.local.emulator import client_as
        from servestack.local.sagemaker.multi_model import MultiModelFront

        v = multi[0]
        assert v.container is not None
        assert v.container.model_data_url is not None
        assert v.execution_role is not None
        self.settings.seed_models(v.container.model_data_url)
        front = MultiModelFront(
            endpoint_name=endpoint.name,
            container_url=url,
            model_data_url=v.container.model_data_url,
            cache_dir=multi_model_roots[v.name],
            # SageMaker fetches the archives with the model's execution role.
            s3=client_as("s3", context.emulator_url, credentials[v.execution_role], context.region),
            variant=v.name,
        )
        target = RealtimeTarget(url, names, multi_model=True, multi_model_front=front)
        return child, target, control_url

    def _start_container(
        self, endpoint: str, variant: VariantDef | ComponentDef, credentials: Credentials, context: PlanContext
    ) -> tuple[ContainerSource, Path | None]:
        """The variant's container source, its image pulled and its model data (single-model) unpacked under the
        state dir's sagemaker/<endpoint>/<variant>/opt/ml/model; the model directory, or None."""
        from servestack.local.ecr import published_images

        container = variant.container
        assert container is not None  # `plan` starts only variants that run a container
        single = container.mode != "MultiModel" and bool(container.model_data_url)
        source = ContainerSource(
            context.emulator_url, context.region, credentials.to_dict(),
            image=container.image if published_images(context.work / "cdk.out", [container.image]) else None,
            model_data_url=container.model_data_url if single else None,
        )  # fmt: skip
        root = self.settings.state_dir / "sagemaker" / endpoint / variant.name
        try:
            return source, prepare(source, root)
        except VariantStartError as error:
            raise PlanError(f"variant {variant.name} of endpoint {endpoint} failed: {error}") from None

    def _container_command(
        self, endpoint: str, image_uri: str, work: Path
    ) -> tuple[dict[str, Any] | None, dict[str, str]]:
        """`docker run IMAGE serve` (SageMaker's hosting command) as a process from the image's staged build
        context in cdk.out, and the image's ENV; (None, {}) for an image that is not an asset of the assembly."""
        try:
            staged = staged_container(work / "cdk.out", image_uri, work / "images", ("serve",))
        except DockerfileError as error:
            raise PlanError(f"endpoint {endpoint}: its image cannot run locally: {error}") from None
        if staged is None:
            return None, {}
        command = {"argv": list(staged.command.argv), "cwd": str(staged.command.cwd)}
        return command, dict(staged.command.environment)

    def _released(self, deployment: str, variant: dict[str, Any], work: Path) -> dict[str, Any]:
        """The version `local deploy` left live, when it is not the template's (releases.py)."""
        return apply_release(work, deployment, variant, self.settings.fetch_package, self.settings.notices)

    def _component_entry(self, model: str) -> dict[str, Any]:
        """What other commands need of a component: its model and that model's sample request."""
        sample = self.settings.model_sample(model)
        return {"model": model, "sample": str(sample) if sample is not None and sample.is_file() else None}


def endpoint_payload_limit(endpoint: EndpointDef) -> int:
    """The largest body SageMaker hands this endpoint's containers (servestack/aws_rules.py's table): an async
    endpoint's 1 GB payloads, Serverless Inference's 4 MB, an instance-backed endpoint's 6 MB."""
    from servestack.aws_rules import SAGEMAKER_ASYNC, SAGEMAKER_REALTIME, SAGEMAKER_SERVERLESS

    if endpoint.async_config is not None:
        return SAGEMAKER_ASYNC.max_payload_bytes
    if any(v.serverless is not None for v in endpoint.variants):
        return SAGEMAKER_SERVERLESS.max_payload_bytes
    return SAGEMAKER_REALTIME.max_payload_bytes
