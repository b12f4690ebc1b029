"""A realtime deployment's local endpoint as a process: the router (servestack/local/router.py) with its
variants from serving.yaml and the blue/green rehearsals (servestack/local/rehearsal.py) it can run.

`python -m servestack.local.endpoint DEPLOYMENT --spec serving.yaml --port N --model-dir DIR --registry URI`.
This module wires the two together, so that neither imports the other.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from servestack.local.rehearsal import Rehearsal
from servestack.local.router import Router, VariantPlan

# ------------------------------------------------------------------------------------------ from serving.yaml


def plans_for(spec: Any, deployment: str, model_dir: Path) -> tuple[list[VariantPlan], VariantPlan | None, float]:
    """The variants (default: one `primary` of the deployment's model) and the shadow, from serving.yaml."""
    from models.service import version_order
    from servestack.spec import RealtimeDeployment

    d = spec.deployments[deployment]
    if not isinstance(d, RealtimeDeployment):
        raise ValueError(f"{deployment}: mode {d.mode!r} is not 'realtime'")

    def plan(name: str, model: str, version: str | None, weight: float) -> VariantPlan:
        m = spec.model(model, version)
        if d.multi_model:
            return VariantPlan(name, m.name, m.version, weight, None)
        # As the container did before the router: every bundled package is served (so a TargetModel header can
        # pick another), unless that would serve a newer version of this model than the one pinned here.
        versions = [p.parent.name for p in (model_dir / m.name).glob("*/manifest.json")]
        newest = max(versions, key=version_order, default=m.version)
        package = model_dir if newest == m.version else model_dir / m.name / m.version
        return VariantPlan(name, m.name, m.version, weight, package)

    variants = [plan(v.name, v.model, v.version, v.weight) for v in d.variants] or [
        plan("primary", d.model, d.version, 1)
    ]
    shadow = plan(d.shadow.name, d.shadow.model, d.shadow.version, 0) if d.shadow else None
    return variants, shadow, float(d.shadow.sample_percent) if d.shadow else 0.0


def argv(deployment: str, spec: Path, port: int, model_dir: Path, registry_uri: str, *, workers: int = 1) -> list[str]:
    """How `local up` starts the router of a realtime deployment."""
    return [
        sys.executable,
        "-m",
        "servestack.local.endpoint",
        deployment,
        "--spec",
        str(spec),
        "--port",
        str(port),
        "--model-dir",
        str(model_dir),
        "--registry",
        registry_uri,
        "--workers",
        str(workers),
    ]


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="servestack.local.endpoint", description=__doc__)
    parser.add_argument("deployment")
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model-dir", type=Path, required=True, help="packages as <name>/<version>/")
    parser.add_argument("--registry", default="", help="registry URI: green versions and multi-model variants")
    parser.add_argument("--cache-dir", type=Path, default=None, help="where fetched packages go")
    parser.add_argument("--workers", type=int, default=1, help="worker processes of each realtime child")
    options = parser.parse_args(args)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stdout, force=True)
    import uvicorn

    from servestack.spec import load_spec

    spec = load_spec(options.spec)
    variants, shadow, shadow_percent = plans_for(spec, options.deployment, options.model_dir.resolve())
    cache_dir = options.cache_dir or Path(os.environ.get("TMPDIR", "/tmp")) / "servestack-local-packages"  # noqa: S108

    def rehearsal(router: Router, request: dict[str, Any]) -> Rehearsal:
        return Rehearsal.from_request(router, spec, options.deployment, request, cache_dir=cache_dir)

    from models.settings import ServingSettings

    limits = ServingSettings.from_environment()  # the children's own body limit and read deadline
    router = Router(
        options.deployment,
        variants,
        shadow=shadow,
        shadow_percent=shadow_percent,
        registry_uri=options.registry,
        child_env={"SERVESTACK_CACHE_DIR": str(cache_dir)},
        workers=options.workers,
        rehearsal_factory=rehearsal,
        max_body_bytes=limits.max_payload_bytes,
        body_read_timeout_sec=limits.body_read_timeout_sec,
    )
    uvicorn.run(
        router,
        host="127.0.0.1",
        port=options.port,
        log_level="warning",
        access_log=False,
        server_header=False,
        lifespan="on",
        timeout_graceful_shutdown=10,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
