"""`servestack local up`'s run: synth, read the templates, start the emulator and provision it, plan the world,
start its children and services, write the state file, and supervise until Ctrl-C or SIGTERM."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from servestack.local.emulator import state
from servestack.local.hosting import free_port, port_is_free
from servestack.local.planning import PlanError
from servestack.local.stack import StackTopology
from servestack.local.up.children import Child, Supervisor, stop_children
from servestack.local.up.devices import gpu_notes
from servestack.local.up.environment import (
    base_environment,
    project_of,
)
from servestack.local.up.options import (
    DEFAULT_AWS_PORT,
    DEFAULT_PORT,
    UpError,
    UpOptions,
)
from servestack.local.up.services import start_services
from servestack.local.up.world import World

# ------------------------------------------------------------------------------------------ local up


def run(options: UpOptions) -> int:
    try:
        return _run(options)
    except (UpError, PlanError) as error:
        print(f"servestack local up: {error}", file=sys.stderr)
        return 2


def _run(options: UpOptions) -> int:
    from servestack.local.cloudformation import (
        LocalValues,
        Resolver,
        StackTemplate,
        SynthError,
        TemplateError,
        stack_templates,
        synthesize,
    )
    from servestack.local.stack import read_stack
    from servestack.spec import SpecError, load_spec

    timings: list[tuple[str, float]] = []
    clock = time.monotonic()

    def mark(what: str) -> None:
        nonlocal clock
        now = time.monotonic()
        timings.append((what, now - clock))
        clock = now

    spec_file = project_of(options.spec_path)
    if spec_file is None:
        from servestack.project import not_found_hint

        raise UpError(f"{not_found_hint()} (servestack init writes a new project)")
    try:
        spec = load_spec(spec_file)
    except (SpecError, OSError) as error:
        raise UpError(str(error)) from None
    project = spec_file.parent
    work = project / ".servestack"
    from servestack.progress import Progress

    progress = Progress()
    notices: list[str] = []  # what the developer must see: ports that moved, deployments that failed, releases
    try:
        with progress.step("synth") as step:
            synth = synthesize(
                project, spec_file, work / "cdk.out", force=options.resynth, artifacts=project / "models" / "artifacts",
                on_decision=step.update,
            )  # fmt: skip
            step.finish("reused (inputs unchanged)" if synth.reused else "templates written")
    except SynthError as error:
        raise UpError(str(error)) from None
    mark("synth (reused: inputs unchanged)" if synth.reused else "synth")
    templates = stack_templates(synth.out_dir)
    prefix = _context_prefix(project)
    wanted = {f"{prefix}{name}": name for name in spec.deployments}
    missing = [s for s in wanted if s not in templates]
    if missing:
        raise UpError(f"the cloud assembly has no stack {', '.join(missing)}; run with --resynth")

    realtime_port = _port(options.port, DEFAULT_PORT, "--port", notices=notices)
    aws_port = _port(options.aws_port, DEFAULT_AWS_PORT, "--aws-port", taken={realtime_port}, notices=notices)
    external = options.endpoint_url or os.environ.get("AWS_ENDPOINT_URL")
    emulator_port = options.emulator_port or free_port()
    emulator_url = external or f"http://127.0.0.1:{emulator_port}"
    region = os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"

    loaded = {name: StackTemplate.load(templates[name], name) for name in wanted}
    api_ports = {
        (stack, r.logical_id): free_port() for stack, t in loaded.items() for r in t.of_type("AWS::ApiGatewayV2::Api")
    }
    topologies = []
    try:
        for stack, template in loaded.items():
            urls = {lid: f"http://127.0.0.1:{port}" for (s, lid), port in api_ports.items() if s == stack}
            resolver = Resolver(template, LocalValues(region=region, emulator_url=emulator_url, api_urls=urls))
            topologies.append(read_stack(template, resolver))
    except TemplateError as error:
        raise UpError(str(error)) from None
    mark("templates read")
    if options.explain:
        from servestack.local.up.fidelity import fidelity

        print(explain(topologies))
        print(fidelity(topologies, work / "cdk.out"))
        for note in gpu_notes(topologies):
            print(note)
        return 0

    from servestack.local.iam import LocalAccess

    why_off = "--no-iam" if not options.iam else f"{external} is an external emulator"
    access = LocalAccess(enforced=options.iam and external is None, disabled_because=why_off)

    stop_requested = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        stop_requested.set()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    emulator = None
    saved: Any = None
    children: list[Child] = []
    closers: list[Callable[[], None]] = []
    state_file = options.state_path or state.default_path(project)
    try:
        from servestack.local.emulator import EmbeddedEmulator, clients_for

        if external is None:
            emulator = EmbeddedEmulator(emulator_port, middleware=access.middleware, allow_admin=options.allow_reset)
        aws = clients_for(emulator_url, access.developer, region)
        for topology in topologies:
            access.add_resource_policies(topology.resource_policies)
        from servestack.local.stack import ProvisionError, provision

        try:
            with progress.step("provisioning", f"{len(topologies)} stack(s) in {emulator_url}"):
                provision(
                    aws, topologies, account=_account(), may_send=access.may_send,
                    visibility_timeout_sec=options.visibility_timeout_sec,
                )  # fmt: skip
        except ProvisionError as error:
            raise UpError(str(error)) from None
        mark("resources created")
        if emulator is not None:
            from servestack.local.emulator import EmulatorState

            saved = EmulatorState(options.data_dir or work / "emulator", account=_account(), region=region)
            if options.fresh:
                saved.clear()
            elif saved.has_snapshot():
                for line in saved.restore().lines():
                    print(f"restored: {line}", flush=True)
            mark("saved state restored" if not options.fresh else "saved state cleared (--fresh)")

        from servestack.registry import LOCAL_URI, seed_local

        artifacts = project / "models" / "artifacts"  # synth checked that serving.yaml's packages are there
        registry_uri = seed_local(aws["s3"], spec, artifacts)
        from servestack.local.sagemaker import model_data_urls, publish_model_data

        # `cdk deploy` publishes the model data assets before CloudFormation creates the SageMaker models.
        publish_model_data(aws["s3"], work / "cdk.out", model_data_urls(topologies))
        from servestack.local.ecr import image_uris, publish_images
        from servestack.local.emulator import client_as

        ecr = client_as("ecr", emulator_url, access.developer, region)  # and the images to their repositories
        publish_images(ecr, work / "cdk.out", image_uris(topologies))
        environment_base = base_environment() | {"AWS_ENDPOINT_URL": emulator_url, "AWS_DEFAULT_REGION": region}
        world = World(options, spec, spec_file, project, work, region, emulator_url, access, aws, registry_uri)
        world.notices = notices
        if options.fresh:
            from servestack.local.sagemaker import releases

            releases.forget(work)
        plan = world.plan(topologies, realtime_port, aws_port, api_ports, environment_base)
        children = plan.children
        from servestack.local import logs
        from servestack.local.commands import lifecycle

        for child in children:
            child.log_path = logs.start_fresh(logs.child_log(work, child.name))
        lifecycle.start_children(children, progress, notices)
        lifecycle.child_processes(children, plan.deployments)
        mark("functions and endpoints ready")
        closers = [shipper.close for shipper in plan.log_shippers] + start_services(world, plan)
        if saved is not None:
            saved.start_autosave()
        mark("fronts, event sources and schedules running")

        about = {
            "endpoint_url": emulator_url,
            "aws_api_url": plan.aws_api_url,
            "spec": str(spec_file),
            "project": str(project),
            "pid": os.getpid(),
            "region": region,
            "iam_enforced": access.enabled,
            "registry": registry_uri if registry_uri else LOCAL_URI,
            "developer": access.developer.to_dict(),
            "identities": plan.identities,
            "stacks": {t.stack: {"outputs": t.outputs, "deployment": t.deployment} for t in topologies},
            "notices": notices,
            "restarts": dict.fromkeys((child.name for child in children), 0),
        }
        state.write(state_file, about, plan.deployments)
        print(world.banner(plan, state_file, timings), flush=True)
        for note in gpu_notes(topologies):
            print(note, flush=True)
        for notice in notices:  # after the banner too, where the eye lands
            print(notice, file=sys.stderr, flush=True)

        def record_restarts() -> None:  # `local status` reads them; each endpoint's router counts its variants'
            state.write(state_file, {**about, "restarts": dict(supervisor.restarts)}, plan.deployments)

        supervisor = Supervisor(children, lambda line: print(line, file=sys.stderr, flush=True), record_restarts)
        while not stop_requested.wait(0.5):
            supervisor.tick()
        return 0
    finally:
        for close in reversed(closers):
            close()
        stop_children(children)
        if saved is not None:
            saved.stop()  # one last save, once nothing writes any more
        if emulator is not None:
            emulator.stop()
        state.remove(state_file)
        if access.denials:
            print(f"IAM denied {len(access.denials)} call(s) during this run; the first: {access.denials[0]}")
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        print("stopped", flush=True)


def _account() -> str:
    from servestack.local.cloudformation import ACCOUNT

    return ACCOUNT


def _context_prefix(project: Path) -> str:
    """The stack name prefix the app was given: `servestack:prefix` of the context the synth passed it."""
    from servestack.local.cloudformation import project_context

    return str(project_context(project).get("servestack:prefix") or "servestack-")


def _port(
    wanted: int | None, default: int, flag: str, taken: set[int] | None = None, notices: list[str] | None = None
) -> int:
    port = wanted if wanted is not None else default
    if port_is_free(port) and port not in (taken or set()):
        return port
    if wanted is not None:
        raise UpError(f"port {port} is in use; pick another with {flag}")
    moved = free_port()
    notice = f"port {default} is taken: using {moved} instead (pass {flag} N to choose one)"
    print(notice, file=sys.stderr, flush=True)
    if notices is not None:
        notices.append(notice)
    return moved


def explain(topologies: list[StackTopology]) -> str:
    """`local up --explain`: each resource, its physical name, and whether local mode emulates it."""
    lines = []
    for topology in topologies:
        lines.append(f"\n{topology.stack} ({topology.mode})")
        for row in sorted(topology.report, key=lambda r: (not r.emulated, r.type, r.logical_id)):
            flag = "emulated" if row.emulated else "reported"
            lines.append(f"  {flag:<9} {row.type:<44} {row.physical_name:<58} {row.how}")
    kinds: dict[str, bool] = {}
    for topology in topologies:
        for row in topology.report:
            kinds[row.type] = row.emulated
    lines.append(
        "\nresource types: " + ", ".join(f"{k} ({'emulated' if v else 'reported'})" for k, v in sorted(kinds.items()))
    )
    return "\n".join(lines)
