"""Which request `servestack loadtest` sends when `--data` is not given: the target deployment's own sample.

The deployment is `--deployment NAME`, or the one of the running `local up` (this project's state file) whose
URL, endpoint name or function name the target names; its model package's `sample-request.json` is the body.
A target that is no deployment of the project is refused, asking for `--data`: a sample of another model would
only measure how fast the target refuses it.
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Any

from servestack.failures import CommandError, ExitCode


def deployment_sample(target: str, deployment: str | None) -> tuple[Path, str]:
    """The sample request of the deployment `target` is, and what to call it ("NAME (model M@V)")."""
    from servestack import artifacts, project
    from servestack.spec import load_spec

    spec_file = project.spec_path()
    if spec_file is None:
        raise CommandError(
            f"--data: no request body given, and {project.not_found_hint(instead='--data FILE')} (from a project, "
            "loadtest sends the target deployment's sample request)"
        )
    root = spec_file.resolve().parent
    spec = load_spec(spec_file)
    name = deployment or deployment_of(target, running_state(root))
    if name is None:
        raise CommandError(
            f"--data: no request body given, and {target} is no deployment of this project's running local up: "
            f"pass --data FILE, or --deployment NAME (one of {', '.join(spec.deployments)}) to send its sample "
            "request"
        )
    if name not in spec.deployments:
        raise CommandError(
            f"--deployment {name}: not a deployment in {spec_file} (one of {', '.join(spec.deployments)})",
            ExitCode.NOT_FOUND,
        )
    chosen = spec.deployments[name]
    model = spec.model(chosen.model, chosen.version)
    try:
        return artifacts.sample_file(model, root, "request"), f"{name} (model {model.key})"
    except FileNotFoundError as missing:
        raise CommandError(f"{missing}; or pass --data FILE") from None


def running_state(root: Path) -> dict[str, Any]:
    """The state of the project's running local up, or {} when none runs."""
    from servestack.local import state

    try:
        return state.read(state.default_path(root))
    except FileNotFoundError:  # state.NotRunning: no local up, or one that has exited
        return {}


def deployment_of(target: str, about: dict[str, Any]) -> str | None:
    """The deployment of a local up state that `target` names: an http URL on one of its ports (the container,
    the HTTP API front, or the SageMaker front's /endpoints/NAME/ path), `sagemaker://ENDPOINT` or
    `lambda://FUNCTION[:QUALIFIER]`."""
    parsed = urllib.parse.urlsplit(target)
    named = (parsed.netloc + parsed.path).strip("/").split(":")[0]
    front = urllib.parse.urlsplit(str(about.get("aws_api_url") or "")).netloc
    for name, entry in (about.get("deployments") or {}).items():
        if _names(parsed, named, front, str(name), entry):
            return str(name)
    return None


def _names(parsed: urllib.parse.SplitResult, named: str, front: str, name: str, entry: dict[str, Any]) -> bool:
    if parsed.scheme in ("http", "https"):
        ports = {urllib.parse.urlsplit(str(entry[key])).netloc for key in ("url", "container_url") if entry.get(key)}
        through_front = f"/endpoints/{entry.get('endpoint_name')}/" in parsed.path + "/"
        return parsed.netloc in ports or (parsed.netloc == front and through_front)
    if parsed.scheme == "sagemaker":
        return named in (entry.get("endpoint_name"), name)
    if parsed.scheme == "lambda":
        return named == name or named in (entry.get("lambda_functions") or {}).values()
    return False
