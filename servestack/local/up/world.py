"""The world `local up` runs from the templates: the plan of its children (Lambda execution environments,
endpoint routers, containers, pollers), the services it plays in its own process around them, and the banner
that says where everything is."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servestack.local.batch import retire_seeded_input, seed_batch_input
from servestack.local.hosting import free_port
from servestack.local.up.children import Child, _pump
from servestack.local.up.environment import (
    base_environment,
    curl_sigv4,
    extract_model_data,
    first_version,
    lambda_environment,
    map_paths,
    self_command,
    shown,
)
from servestack.local.up.options import (
    CONTAINER_MODEL_DIR,
    CONTAINER_WORKDIR,
    LAMBDA_TASK_ROOT,
    UpError,
    UpOptions,
)

# ------------------------------------------------------------------------------------------ the world


@dataclass
class Plan:
    children: list[Child] = field(default_factory=list)
    functions: list[Any] = field(default_factory=list)  # HostedFunction
    endpoints: dict[str, Any] = field(default_factory=dict)  # endpoint name -> RealtimeTarget
    async_endpoints: dict[str, tuple[str, dict[str, Any], Any]] = field(default_factory=dict)  # (url, config, keys)
    apis: list[tuple[Any, int]] = field(default_factory=list)  # (HttpApiDef, port)
    mappings: list[tuple[Any, Any, Any]] = field(default_factory=list)  # (mapping, function, credentials)
    schedules: list[Any] = field(default_factory=list)
    tasks: dict[str, tuple[str, list[str], dict[str, str]]] = field(default_factory=dict)  # id -> arn, argv, env
    deployments: dict[str, dict[str, Any]] = field(default_factory=dict)
    identities: dict[str, dict[str, str]] = field(default_factory=dict)
    curls: list[str] = field(default_factory=list)
    aws_port: int = 0
    topologies: list[Any] = field(default_factory=list)
    log_shippers: list[Any] = field(default_factory=list)  # LogShipper, one per child

    @property
    def aws_api_url(self) -> str:
        return f"http://127.0.0.1:{self.aws_port}"


@dataclass
class World:
    options: UpOptions
    spec: Any
    spec_file: Path
    project: Path  # serving.yaml's folder: its model packages
    code_root: Path  # the CDK app's folder: the handlers' code (Lambda's /var/task)
    work: Path
    region: str
    emulator_url: str
    access: Any
    aws: dict[str, Any]
    registry_uri: str
    service_endpoints: dict[str, str] = field(default_factory=dict)  # AWS_ENDPOINT_URL_<SERVICE> for functions
    components: dict[str, Any] = field(default_factory=dict)  # inference component name -> ComponentState
    component_routers: dict[str, str] = field(default_factory=dict)  # inference component -> router control URL
    control_urls: dict[str, str] = field(default_factory=dict)  # endpoint name -> its router's control port URL
    notices: list[str] = field(default_factory=list)  # lines for the developer (releases applied at start)

    # ------------------------------------------------------------------------------------ what to run
    def plan(
        self,
        topologies: list[Any],
        realtime_port: int,
        aws_port: int,
        api_ports: dict[tuple[str, str], int],
        env_base: dict[str, str],
    ) -> Plan:
        from servestack.local.lambda_ import HostedFunction

        plan = Plan(aws_port=aws_port, topologies=topologies)
        # botocore's service-specific endpoints: a function calling SageMaker Runtime or Lambda reaches local up's
        # front for them; everything else goes to the emulator (AWS_ENDPOINT_URL).
        front = plan.aws_api_url
        self.service_endpoints = {"AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME": front, "AWS_ENDPOINT_URL_LAMBDA": front}
        run_dir = self.work / "run"
        run_dir.mkdir(parents=True, exist_ok=True)
        first_realtime = True
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
            versioned = topology.versioned
            hosted = {}
            for function in topology.functions.values():
                if function.handler == "index.handler":
                    continue  # inline code (the CodeDeploy pre-traffic hook): run only by CodeDeploy
                port = free_port()
                config = run_dir / f"{function.name}.json"
                config.write_text(json.dumps({
                    "name": function.name, "handler": function.handler,
                    "timeout_sec": function.timeout_sec, "memory_mib": function.memory_mib,
                }))  # fmt: skip
                env = (
                    env_base
                    | self.service_endpoints
                    | lambda_environment(function, self.region, self.code_root)
                    | map_paths(
                        function.environment,
                        # The bundle holds the deployment's own packages only; the rest of /var/task is the code.
                        {
                            f"{LAMBDA_TASK_ROOT}/models/artifacts": str(self._bundle_view(topology.deployment)),
                            LAMBDA_TASK_ROOT: str(self.code_root),
                        },
                    )
                    | credentials[function.role].environment()
                )
                argv = [
                    sys.executable,
                    "-m",
                    "servestack.local.lambda_.runner",
                    "--config",
                    str(config),
                    "--port",
                    str(port),
                ]
                url = f"http://127.0.0.1:{port}"
                child = Child(f"{topology.deployment}/{function.logical_id}", argv, env, f"{url}/")
                child.sinks.append(self._log_shipper(plan, child.name, function.log_group, credentials[function.role]))
                entry.setdefault("log_groups", {})[function.name] = function.log_group
                plan.children.append(child)
                hosted[function.logical_id] = HostedFunction(function, url, function.logical_id in versioned)
            plan.functions += hosted.values()
            entry["lambda_functions"] = {f.definition.logical_id: f.name for f in hosted.values()}
            for api in topology.apis.values():
                port = api_ports[(topology.stack, api.logical_id)]
                plan.apis.append((api, port))
                entry["url"] = f"http://127.0.0.1:{port}"
                entry["api_id"] = api.api_id
            for mapping in topology.mappings:
                function = topology.functions[mapping.function]
                plan.mappings.append((mapping, function, credentials[function.role]))
            plan.schedules += topology.schedules
            for task in topology.tasks.values():
                role = topology.roles.get(task.task_role or "")
                keys = credentials[role.logical_id].environment() if role is not None else {}
                # `python` in the image is this interpreter here; the image's working directory is the code root.
                argv = [sys.executable if a == "python" else a for a in task.argv]
                task_env = map_paths(
                    task.environment,
                    {
                        f"{CONTAINER_WORKDIR}/models/artifacts": str(self._bundle_view(topology.deployment)),
                        CONTAINER_WORKDIR: str(self.code_root),
                    },
                )
                plan.tasks[task.logical_id] = (task.arn, argv, env_base | self.service_endpoints | task_env | keys)
                # The mapped environment: `local run-batch` runs the task here, where the image's paths are not.
                entry["task"] = {"arn": task.arn, "argv": argv, "environment": task_env,
                                 "role": role.name if role else None}  # fmt: skip
            for endpoint in topology.endpoints.values():
                port = realtime_port if first_realtime else free_port()
                first_realtime = False
                child, target = self._endpoint(topology, endpoint, port, run_dir, env_base, credentials)
                # SageMaker writes each container's output to the endpoint's group with the execution role.
                group = f"/aws/sagemaker/Endpoints/{endpoint.name}"
                hosted = endpoint.components or endpoint.variants
                role = endpoint.execution_role or next((h.execution_role for h in hosted if h.execution_role), None)
                if role is not None:
                    stream = f"{hosted[0].name}/local-{uuid.uuid4().hex[:17]}"
                    child.sinks.append(self._log_shipper(plan, child.name, group, credentials[role], stream))
                    entry.setdefault("log_groups", {})[endpoint.name] = group
                plan.children.append(child)
                entry["control_url"] = self.control_urls[endpoint.name]  # the router's admin routes, the CLI's
                if endpoint.async_config is not None:
                    # An asynchronous endpoint: InvokeEndpointAsync only; SageMaker writes the outcome to S3 and
                    # publishes it to SNS with the model's execution role.
                    role = credentials[endpoint.variants[0].execution_role]
                    plan.async_endpoints[endpoint.name] = (target.url, endpoint.async_config, role)
                    entry |= {"endpoint_name": endpoint.name, "container_url": target.url}
                else:
                    plan.endpoints[endpoint.name] = target
                    entry |= {"url": target.url, "endpoint_name": endpoint.name}
                if endpoint.components:
                    entry["components"] = {
                        c.name: self._component_entry(c.container.environment.get("SERVESTACK_DEFAULT_MODEL", ""))
                        for c in endpoint.components
                    }
            buckets = [b for b in topology.buckets.values() if "accesslogs" not in b.logical_id.lower()]
            if buckets:
                entry["bucket"] = buckets[0].name
            for queue in topology.queues.values():
                entry.setdefault("queues", {})[queue.logical_id] = queue.url
            for table in topology.tables.values():
                entry.setdefault("tables", {})[table.logical_id] = table.name
            self._batch_entry(topology, entry, sample)
            plan.deployments[topology.deployment] = entry
            plan.curls += self._curls(topology, entry, sample)
        return plan

    def _endpoint(
        self, topology: Any, endpoint: Any, port: int, run_dir: Path, env_base: dict[str, str],
        credentials: dict[str, Any],
    ) -> tuple[Child, Any]:  # fmt: skip
        from servestack.local.sagemaker import RealtimeTarget

        multi_model_roots: dict[str, Path] = {}

        def variant(v: Any, component: str | None = None) -> dict[str, Any]:
            """A variant's (or an inference component's) container as the router starts it."""
            container = v.container
            env = dict(container.environment)
            package_dir = None
            if container.mode == "MultiModel":
                # SageMaker downloads TargetModel archives from the ModelDataUrl prefix into /opt/ml/models.
                root = self.work / "multi-model" / endpoint.name / v.name
                root.mkdir(parents=True, exist_ok=True)
                multi_model_roots[v.name] = root
                env["SERVESTACK_MULTI_MODEL_ROOT"] = str(root)
            elif container.model_data_url:
                # SageMaker's download, with the model's execution role, into the variant's /opt/ml/model.
                package_dir = self._fetch_model_data(endpoint.name, v, credentials[v.execution_role])
                env = map_paths(env, {CONTAINER_MODEL_DIR: str(package_dir)})
            model = env.get("SERVESTACK_DEFAULT_MODEL", "")
            version = first_version(package_dir, model) if package_dir else self.spec.model(model, None).version
            command, image_env = self._container_command(endpoint.name, container.image)
            env = image_env | env | credentials[v.execution_role].environment()  # the model's Environment wins
            return {"name": v.name, "model": model, "version": version, "weight": getattr(v, "weight", 1.0),
                    "package_dir": str(package_dir) if package_dir else None, "environment": env,
                    "component": component, "command": command}  # fmt: skip

        if endpoint.components:
            # One container per inference component, from the model it names (its variant runs no model).
            variants = [variant(c, component=c.name) for c in endpoint.components]
        else:
            variants = [variant(v) for v in endpoint.variants]
        variants = [self._released(topology.deployment, v) for v in variants]
        shadow = variant(endpoint.shadow_variants[0]) if endpoint.shadow_variants else None
        production_weight = sum(v["weight"] for v in variants) or 1.0
        config = {
            "deployment": topology.deployment,
            "endpoint": endpoint.name,
            "variants": variants,
            "shadow": shadow,
            "shadow_percent": (shadow["weight"] / production_weight * 100) if shadow else 0.0,
            "registry_uri": self.registry_uri,
            "workers": self.options.workers,
            "cache_dir": str(self.work / "packages"),
        }
        path = run_dir / f"endpoint-{endpoint.name}.json"
        path.write_text(json.dumps(config, indent=2))
        control_url = self.control_urls[endpoint.name] = f"http://127.0.0.1:{free_port()}"
        argv = [sys.executable, "-m", "servestack.local.sagemaker.endpoint", "--config", str(path), "--port", str(port),
                "--control-port", control_url.rsplit(":", 1)[1], "--spec", str(self.spec_file)]  # fmt: skip
        # The router is SageMaker's side (it pulls new versions for rehearsals): the developer's keys.
        env = env_base | self.access.developer.environment()
        url = f"http://127.0.0.1:{port}"
        names = tuple(v.name for v in endpoint.variants)
        child = Child(f"{topology.deployment}/endpoint", argv, env, f"{url}/ping", ready_status=200)
        if endpoint.components:
            from servestack.local.sagemaker import ComponentState

            states = {
                c.name: ComponentState(
                    c.name, c.arn, endpoint.name, endpoint.arn, c.variant, c.model_name, c.compute, c.copies, c.copies
                )
                for c in endpoint.components
            }
            self.components.update(states)
            self.component_routers.update(dict.fromkeys(states, control_url))
            return child, RealtimeTarget(url, names, components=states)
        multi = [v for v in endpoint.variants if v.container is not None and v.container.mode == "MultiModel"]
        if not multi:
            return child, RealtimeTarget(url, names)
        from servestack.local.emulator import client_as
        from servestack.local.sagemaker import MultiModelFront

        v = multi[0]
        assert v.container.model_data_url is not None
        self._seed_models(v.container.model_data_url)
        front = MultiModelFront(
            endpoint_name=endpoint.name,
            container_url=url,
            model_data_url=v.container.model_data_url,
            cache_dir=multi_model_roots[v.name],
            # SageMaker fetches the archives with the model's execution role.
            s3=client_as("s3", self.emulator_url, credentials[v.execution_role], self.region),
            variant=v.name,
        )
        return child, RealtimeTarget(url, names, multi_model=True, multi_model_front=front)

    def _log_shipper(
        self, plan: Plan, name: str, group: str, credentials: Any, stream: str | None = None
    ) -> Callable[[str], None]:
        from servestack.local.emulator import client_as
        from servestack.local.logs import LogShipper, ensure_log_group, lambda_stream_name

        ensure_log_group(self.aws["logs"], group)  # the template's log group, created by the deploy
        shipper = LogShipper(
            name=name, group=group, stream=stream or lambda_stream_name(), role=credentials.arn,
            logs=client_as("logs", self.emulator_url, credentials, self.region),
            metrics=client_as("cloudwatch", self.emulator_url, self.access.developer, self.region),
            report=lambda line: print(line, file=sys.stderr, flush=True),
        )  # fmt: skip
        plan.log_shippers.append(shipper)
        return shipper

    def _fetch_model_data(self, endpoint: str, variant: Any, credentials: Any) -> Path:
        from servestack.local.emulator import client_as
        from servestack.local.sagemaker import ModelDataError, fetch_model_data

        url = variant.container.model_data_url
        root = (self.options.data_dir or self.work / "emulator") / "sagemaker" / endpoint / variant.name
        s3 = client_as("s3", self.emulator_url, credentials, self.region)
        try:
            return fetch_model_data(
                s3, url, root / CONTAINER_MODEL_DIR.lstrip("/"), role=credentials.arn, compressed=not url.endswith("/")
            )
        except ModelDataError as error:
            raise UpError(f"variant {variant.name} of endpoint {endpoint} failed: {error}") from None

    def _container_command(self, endpoint: str, image_uri: str) -> tuple[dict[str, Any] | None, dict[str, str]]:
        """`docker run IMAGE serve` (SageMaker's hosting command) as a process from the image's staged build
        context in cdk.out, and the image's ENV; (None, {}) for an image that is not an asset of the assembly."""
        from servestack.local.sagemaker import DockerfileError, staged_container

        try:
            staged = staged_container(self.work / "cdk.out", image_uri, self.work / "images", ("serve",))
        except DockerfileError as error:
            raise UpError(f"endpoint {endpoint}: its image cannot run locally: {error}") from None
        if staged is None:
            return None, {}
        command = {"argv": list(staged.command.argv), "cwd": str(staged.command.cwd)}
        return command, dict(staged.command.environment)

    def _released(self, deployment: str, variant: dict[str, Any]) -> dict[str, Any]:
        """The version `local deploy` left live, when it is not the template's
        (servestack/local/sagemaker/releases.py)."""
        from servestack.local.sagemaker import releases
        from servestack.registry import open_registry

        def fetch(model: str, version: str) -> Path:
            return open_registry(self.registry_uri, client=self.aws["s3"]).fetch(model, version, self.work / "packages")

        return releases.apply(self.work, deployment, variant, fetch, self.notices)

    def _component_entry(self, model: str) -> dict[str, Any]:
        """What other commands need of a component: its model and that model's sample request."""
        declared = next((m for m in self.spec.models if m.name == model), None)
        sample = self.project / declared.artifact_path / "sample-request.json" if declared else None
        return {"model": model, "sample": str(sample) if sample is not None and sample.is_file() else None}

    def _bundle_view(self, deployment: str) -> Path:
        """What the deployment's Lambda bundle carries under models/artifacts: its own pinned packages only
        (stacks/bundling.py), as links into the project."""
        view = self.work / "bundles" / deployment / "models" / "artifacts"
        if view.exists():
            shutil.rmtree(view)
        for model in self.spec.models_of(deployment):
            link = view / model.name / model.version
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to((self.project / model.artifact_path).resolve(), target_is_directory=True)
        return view

    def _seed_models(self, prefix: str) -> None:
        """The serving.yaml models under a multi-model endpoint's prefix (`<name>/<version>.tar.gz`), as
        `servestack models push --registry <prefix>` would put them there, so that TargetModel works at once."""
        from servestack.registry import seed_local

        seed_local(self.aws["s3"], self.spec, self.project / "models" / "artifacts", uri=prefix)

    def _batch_entry(self, topology: Any, entry: dict[str, Any], sample: Path | None) -> None:
        for schedule in topology.schedules:
            payload = json.loads(schedule.input or "{}")
            entry |= {
                "schedule": f"{schedule.expression} {schedule.timezone}",
                "schedule_name": schedule.name,
                "target": schedule.target_arn,
                "schedule_role": schedule.role_arn,
                "input": payload,
            }
            if schedule.universal is not None:
                entry["universal"] = schedule.universal
            bucket, prefix = payload.get("bucket"), payload.get("input_prefix")
            if bucket and prefix and sample is not None and sample.is_file():
                retire_seeded_input(self.aws["s3"], bucket, prefix)
                entry["seeded"] = seed_batch_input(self.aws["s3"], bucket, prefix, sample)
                entry |= {"input_prefix": prefix, "output_prefix": payload.get("output_prefix")}
        for transform in topology.transforms:
            entry["transform"] = self._transform_entry(topology, transform)
            source = transform.job["TransformInput"]["DataSource"]["S3DataSource"]["S3Uri"]
            bucket, _, prefix = str(source).removeprefix("s3://").partition("/")
            output = str(transform.job["TransformOutput"]["S3OutputPath"]).removeprefix("s3://").partition("/")[2]
            entry |= {"input": {"bucket": bucket, "input_prefix": prefix, "output_prefix": output.rstrip("/") + "/"}}
            if sample is not None and sample.is_file():
                retire_seeded_input(self.aws["s3"], bucket, prefix)
                entry["seeded"] = seed_batch_input(self.aws["s3"], bucket, prefix, sample)
                entry |= {"input_prefix": prefix, "output_prefix": output.rstrip("/") + "/"}

    def _transform_entry(self, topology: Any, transform: Any) -> dict[str, Any]:
        """What `local run-batch` needs to run an engine: transform job: the request, the container's
        environment with the model data extracted here, the roles' names and the function run at the end."""
        from servestack.local.cloudformation import file_asset

        env = dict(transform.container.environment)
        url = transform.container.model_data_url
        if url:
            archive = file_asset(self.work / "cdk.out", url.split("/", 3)[-1])
            if archive is None:
                raise UpError(f"{transform.schedule}: model data {url} is not in the cloud assembly")
            package_dir = extract_model_data(archive, self.work / "model-data")
            env = map_paths(env, {CONTAINER_MODEL_DIR: str(package_dir)})
        on_end = topology.functions.get(transform.on_end or "")
        return {
            "job": transform.job,
            "environment": env,
            "execution_role": topology.roles[transform.execution_role].name,
            "scheduler_role": transform.scheduler_role,
            "on_end": on_end.name if on_end is not None else None,
        }

    def _curls(self, topology: Any, entry: dict[str, Any], sample: Path | None) -> list[str]:
        lines: list[str] = []
        url = entry.get("url")
        if topology.mode == "realtime" and url:
            lines += [f"curl -s {url}/ping"]
            components: dict[str, Any] = entry.get("components") or {}
            for name, component in components.items():
                if component.get("sample"):
                    lines.append(
                        f"curl -s -X POST {url}/invocations -H 'Content-Type: application/json' "
                        f"-H 'X-Amzn-SageMaker-Inference-Component: {name}' --data @{shown(Path(component['sample']))}"
                    )
            if sample is not None and not components:
                lines.append(
                    f"curl -s -X POST {url}/invocations -H 'Content-Type: application/json' --data @{shown(sample)}"
                )
        elif topology.mode == "serverless" and url:
            lines.append(curl_sigv4(f"{url}/invocations", self.region, self.access.developer, sample))
        elif topology.mode == "async" and url:
            lines.append(curl_sigv4(f"{url}/jobs", self.region, self.access.developer, sample))
            lines.append(curl_sigv4(f"{url}/jobs/JOB_ID", self.region, self.access.developer, None))
        elif topology.mode == "batch":
            lines.append(f"{self_command()} local run-batch {topology.deployment}")
        return lines

    # ------------------------------------------------------------------------------------ services
    def start_services(self, plan: Plan) -> list[Callable[[], None]]:
        import httpx

        from servestack.local.apigateway import HttpApiFront
        from servestack.local.emulator import client_as
        from servestack.local.lambda_ import LambdaService, SqsPoller
        from servestack.local.sagemaker import SageMakerRuntime
        from servestack.local.scheduler import ScheduleRunner
        from servestack.local.up.aws_front import AwsFront

        closers: list[Callable[[], None]] = []
        lambdas = LambdaService(plan.functions, httpx.Client(timeout=httpx.Timeout(960.0, connect=5.0)))
        closers.append(lambdas.close)
        from servestack.local.sagemaker import AsyncInferenceConfig, AsyncInvocations, AsyncTarget

        asynchronous: dict[str, AsyncTarget] = {}
        for name, (url, config, keys) in plan.async_endpoints.items():
            invocations = AsyncInvocations(
                endpoint_name=name,
                container_url=url,
                config=AsyncInferenceConfig.from_endpoint_config({"AsyncInferenceConfig": config}),
                s3=client_as("s3", self.emulator_url, keys, self.region),
                sns=client_as("sns", self.emulator_url, keys, self.region),
            )
            closers.append(invocations.close)
            asynchronous[name] = AsyncTarget(_submitter(invocations))
        runtime = SageMakerRuntime(plan.endpoints, asynchronous, self.aws["s3"])
        from servestack.local.cloudformation import ACCOUNT
        from servestack.local.sagemaker import InferenceComponents, TransformJobs

        components = InferenceComponents(self.components, self._scale_component, self._serving_copies)
        models = [model for topology in plan.topologies for model in topology.models]
        jobs = TransformJobs(models, self.region, ACCOUNT)
        from servestack.local.codedeploy import LocalCodeDeploy

        releases = [d for topology in plan.topologies for d in topology.lambda_deployments]
        codedeploy = LocalCodeDeploy(
            releases, self.access, emulator_url=self.emulator_url, front_url=plan.aws_api_url, region=self.region,
            env_base=base_environment() | {"AWS_ENDPOINT_URL": self.emulator_url, "AWS_DEFAULT_REGION": self.region},
            run_dir=self.work / "run", identities=plan.identities,
        )  # fmt: skip
        closers.append(codedeploy.close)
        for topology in plan.topologies:  # what `local deploy` names in CreateDeployment
            for release in topology.lambda_deployments:
                plan.deployments[topology.deployment]["codedeploy"] = {
                    "application": release.application, "group": release.group,
                }  # fmt: skip
        from servestack.local.scheduler import SchedulerApi

        schedules = SchedulerApi(plan.schedules, self.region, ACCOUNT)
        front = AwsFront(runtime, lambdas, self.access, plan.aws_port, components, jobs, codedeploy, schedules)
        front = front.serve_in_background()
        closers.append(front.close)
        for api, port in plan.apis:
            http_front = HttpApiFront(api, lambdas, self._authorize_api, port=port).serve_in_background()
            closers.append(http_front.close)
        stop = threading.Event()
        threads: list[threading.Thread] = []
        for mapping, function, credentials in plan.mappings:
            if not mapping.enabled:
                continue
            sqs = client_as("sqs", self.emulator_url, credentials, self.region)
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
                start_job = self._transform_starter(plan, schedule)
                if start_job is None:  # an SDK action local mode does not make (servestack/local/stack/topology.py)
                    print(f"schedule {schedule.name}: its {schedule.universal} target is not run locally", flush=True)
                    continue
            role = schedule.role_arn.rsplit("/", 1)[-1]
            keys = plan.identities.get(role)
            runner = ScheduleRunner(
                schedule, lambdas, self.access.authorize, self._dead_letter_sender(keys),
                run_task=self._task_runner(plan, schedule.role_arn), start_job=start_job,
            )  # fmt: skip
            runners.append(runner.start())

        def stop_threads() -> None:
            stop.set()
            for runner in runners:
                runner.stop()
            for thread in threads:
                thread.join(timeout=5)

        closers.append(stop_threads)
        return closers

    def _scale_component(self, component: Any, copies: int) -> None:
        """Tell the component's router to run its copies (0 stops its container); returns once they serve."""
        import httpx

        url = f"{self.component_routers[component.name]}/_servestack/components/{component.name}"
        response = httpx.post(url, json={"copies": copies}, timeout=180)
        if response.status_code != 200:
            raise RuntimeError(f"the endpoint's router answered {response.status_code}: {response.text[:300]}")

    def _serving_copies(self, component: Any) -> tuple[int, int] | None:
        from servestack.local.sagemaker import copies_on_router

        return copies_on_router(self.component_routers[component.name], component.name)

    def _authorize_api(self, request: Any, resource: str) -> Any:
        return self.access.check(request, "execute-api", resource)

    def _transform_starter(self, plan: Plan, schedule: Any) -> Callable[[Any], str | None] | None:
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
            "endpoint_url": self.emulator_url, "aws_api_url": plan.aws_api_url, "region": self.region,
            "identities": plan.identities, "developer": self.access.developer.to_dict(), "project": str(self.project),
        }  # fmt: skip

        def start(_: Any) -> str | None:
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

    def _task_runner(self, plan: Plan, role_arn: str) -> Callable[[Any], str | None]:
        """Scheduler's ECS target: as the schedule's role (ecs:RunTask on the task definition), start the task's
        container command as a process with its environment and task role."""

        def run(schedule: Any) -> str | None:
            if schedule.task not in plan.tasks:
                return f"task definition {schedule.task} is not in the templates"
            arn, argv, env = plan.tasks[schedule.task]
            denied = self.access.authorize(role_arn, "ecs:RunTask", arn)
            if denied is not None:
                return f"AccessDeniedException: {denied}"
            process = subprocess.Popen(
                argv, cwd=self.code_root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
            assert process.stdout is not None
            _pump(f"task {schedule.task}", process.stdout, sys.stdout)
            return None

        return run

    def _dead_letter_sender(self, keys: dict[str, str] | None) -> Callable[[str, str, dict[str, Any]], None]:
        from servestack.local.emulator import client_as
        from servestack.local.iam import Credentials
        from servestack.local.scheduler import send_dead_letter

        def send(queue_arn: str, body: str, attributes: dict[str, Any]) -> None:
            if keys is None:
                return
            credentials = Credentials.from_dict(keys)
            sqs = client_as("sqs", self.emulator_url, credentials, self.region)
            send_dead_letter(sqs, self.emulator_url, queue_arn, body, attributes)

        return send

    # ------------------------------------------------------------------------------------ banner
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


def _submitter(invocations: Any) -> Callable[[str, str, str | None, str | None, str], tuple[str, str | None]]:
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

    def __init__(self, lambdas: Any, name: str) -> None:
        self.lambdas = lambdas
        self.name = name

    def invoke(self, event: Any) -> Any:
        invocation = self.lambdas.invoke(self.name, json.dumps(event).encode())
        if invocation.status != 200 or invocation.function_error:
            raise RuntimeError(f"{self.name}: invocation failed ({invocation.status}): {invocation.body[:500]!r}")
        return json.loads(invocation.body) if invocation.body else None
