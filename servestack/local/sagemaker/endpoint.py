"""A SageMaker endpoint of the templates as a local process: the router (servestack/local/sagemaker/router.py) in front
of one realtime container per production variant (and the shadow), and the blue/green rehearsals
(servestack/local/sagemaker/rehearsal.py) it can run.

`python -m servestack.local.sagemaker.endpoint --config ENDPOINT.json --port N [--control-port M] [--spec
serving.yaml]`;
the router's admin routes (metrics, rehearsals, component copies) answer only on the control port, and only to
a request signed with the developer's keys (local up runs the router with them: `control_gate`). The config is
what `local up` read from the endpoint's `AWS::SageMaker::EndpointConfig` and `AWS::SageMaker::Model`s:
each variant's name, weight, container environment (with `/opt/ml/model` mapped to the extracted model
data) and execution role credentials; the shadow variants and their sampling. On an endpoint hosting
inference components, each entry of `variants` is a component (`"component": its name`), from its
`AWS::SageMaker::InferenceComponent` and the model it names. `--spec` is only for
rehearsals (`servestack local deploy`), which take their strategy and alarms from serving.yaml.
This module wires the router and the rehearsal together, so that neither imports the other.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servestack.local.sagemaker.backends import VariantPlan
from servestack.local.sagemaker.data_capture import NativeCapture
from servestack.local.sagemaker.rehearsal import Rehearsal
from servestack.local.sagemaker.router import DEFAULT_MAX_IN_FLIGHT, Router
from servestack.local.sagemaker.variant_start import ContainerSource

if TYPE_CHECKING:
    from servestack.local.iam import ControlGate


def plan_of(entry: dict[str, Any]) -> VariantPlan:
    package = entry.get("package_dir")
    command = entry.get("command") or {}
    return VariantPlan(
        entry["name"],
        entry["model"],
        entry["version"],
        float(entry["weight"]),
        Path(package) if package else None,
        dict(entry.get("environment", {})),
        entry.get("component"),
        tuple(command["argv"]) if command.get("argv") else None,
        Path(command["cwd"]) if command.get("cwd") else None,
        ContainerSource.from_dict(entry["source"]) if entry.get("source") else None,
    )


def read_timeout_sec(own: float, variants: list[VariantPlan]) -> float:
    """How long the router waits for a body: as long as the longest its containers wait (an async endpoint's
    take 300 s, servestack/cdk/realtime.py's LARGE_BODY_READ_TIMEOUT_SEC: SageMaker streams a payload of up to
    1 GB from S3), so that a body the container would take is never cut off in front of it."""
    found = [float(v.environment["SERVESTACK_BODY_READ_TIMEOUT_SEC"]) for v in variants
             if v.environment.get("SERVESTACK_BODY_READ_TIMEOUT_SEC")]  # fmt: skip
    return max([own, *found])


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="servestack.local.sagemaker.endpoint", description=__doc__)
    parser.add_argument("--config", type=Path, required=True, help="the endpoint's variants, from the template")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--control-port", type=int, default=None, help="the port of the admin routes (the CLI's)")
    parser.add_argument("--spec", type=Path, default=None, help="serving.yaml, for rehearsals")
    options = parser.parse_args(args)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stdout, force=True)
    import uvicorn

    config = json.loads(options.config.read_text(encoding="utf-8"))
    deployment = config["deployment"]
    cache_dir = Path(config.get("cache_dir") or Path(os.environ.get("TMPDIR", "/tmp")) / "servestack-local-packages")  # noqa: S108
    variants = [plan_of(v) for v in config["variants"]]
    shadow = plan_of(config["shadow"]) if config.get("shadow") else None
    rehearsal_factory = None
    if options.spec is not None:
        from servestack.spec import load_spec

        spec = load_spec(options.spec, check_artifacts=False)  # local up checked the packages before starting us

        def rehearsal(router: Router, request: dict[str, Any]) -> Rehearsal:
            return Rehearsal.from_request(router, spec, deployment, request, cache_dir=cache_dir)

        rehearsal_factory = rehearsal
    from servestack.inference.settings import ServingSettings

    limits = ServingSettings.from_environment()  # the children's own body limit and read deadline
    router = Router(
        deployment,
        variants,
        shadow=shadow,
        shadow_percent=float(config.get("shadow_percent", 0.0)),
        registry_uri=str(config.get("registry_uri", "")),
        child_env={"SERVESTACK_CACHE_DIR": str(cache_dir), **config.get("environment", {})},
        workers=int(config.get("workers", 1)),
        rehearsal_factory=rehearsal_factory,
        max_body_bytes=int(config.get("max_body_bytes", limits.max_payload_bytes)),
        body_read_timeout_sec=read_timeout_sec(limits.body_read_timeout_sec, [*variants, *filter(None, [shadow])]),
        control_port=options.control_port,
        max_in_flight=int(config.get("max_in_flight", DEFAULT_MAX_IN_FLIGHT)),
        control_gate=control_gate(os.environ),
        capture=_capture(config),
    )
    # The router's socket is bound before its lifespan starts the variants: each variant takes a free port
    # then, and an unbound router port could be handed to one of them (seen once in twenty runs).
    sockets = [_bound(options.port)]
    if options.control_port is not None:
        sockets.append(_bound(options.control_port))
    server = uvicorn.Server(
        uvicorn.Config(
            router,
            log_level="warning",
            access_log=False,
            server_header=False,
            lifespan="on",
            timeout_graceful_shutdown=10,
        )
    )
    server.run(sockets=sockets)
    return 0


def _capture(config: Mapping[str, Any]) -> NativeCapture | None:
    """The endpoint's data capture (its DataCaptureConfig), writing as its execution role; None without one."""
    found = config.get("capture")
    if not found:
        return None
    from servestack.local.emulator import client_as
    from servestack.local.iam import Credentials

    keys = Credentials.from_dict(found["credentials"])
    s3 = client_as("s3", found["emulator_url"], keys, found["region"])
    return NativeCapture(str(config.get("endpoint") or config["deployment"]), found["config"], s3)


def control_gate(environ: Mapping[str, str]) -> ControlGate:
    """The check of the control port's admin routes: the developer's signature, by the keys local up gives this
    router (its own environment's, as the SageMaker side of local mode); with none, nothing may drive it."""
    from servestack.local.iam import DEVELOPER, ControlGate, Credentials

    key, secret = environ.get("AWS_ACCESS_KEY_ID"), environ.get("AWS_SECRET_ACCESS_KEY")
    developer = Credentials(DEVELOPER.arn, key, secret) if key and secret else None
    return ControlGate.for_developer(developer, region=environ.get("AWS_DEFAULT_REGION") or "us-east-1")


def _bound(port: int) -> socket.socket:
    listening = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listening.bind(("127.0.0.1", port))
    return listening


if __name__ == "__main__":
    sys.exit(main())
