"""A project's CDK app: one stack per deployment in its serving.yaml, plus the CI/CD pipeline on request.

A project's `app.py` calls `main(<its folder>, extend=...)`; `build_app` builds the same app for tests.

    make synth                                   # every deployment, offline
    cdk deploy servestack-digits-api             # one deployment
    cdk synth -c servestack:deployments=digits-api,cancer-async
    cdk synth -c servestack:pipeline=true -c servestack:repo=owner/name -c servestack:connection-arn=arn:...

The pipeline needs `servestack:repo` and `servestack:connection-arn` (a CodeConnections connection ARN); a
missing one exits 2 naming the `-c` flag to pass. Account and region are optional (servestack:account,
servestack:region): without them the pipeline stack is environment-agnostic.

serving.yaml is validated before anything is synthesized; a bad value stops here with its path, the value
and what is allowed. cdk-nag's AwsSolutions checks run on every synth.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from aws_cdk import App, Validations
from cdk_nag import AwsSolutionsChecks
from constructs import Construct

from servestack.cdk.deployment import DeploymentStack, add_deployments
from servestack.spec import SpecError, load_spec

# A project's own additions to the app: it gets the app and the deployment stacks servestack built.
Extend = Callable[[App, list[DeploymentStack]], None]


def add_serving(
    scope: Construct,
    *,
    project: Path | None = None,
    spec: str = "serving.yaml",
    deployments: Sequence[str] | None = None,
    name_prefix: str = "servestack-",
    entry_points: Path | None = None,
) -> list[DeploymentStack]:
    """A stack per deployment of a serving.yaml, added to `scope` (your `App`, or a `Stage`), each named
    `<name_prefix><deployment>`.

    - project: the folder of serving.yaml and its model packages (`models/artifacts/`); default: the current
      folder, which the CDK CLI makes the folder of cdk.json.
    - spec: serving.yaml's path, relative to `project`.
    - deployments: the deployments to add (default: all); an unknown name is refused with the known ones.
    - entry_points: a folder of entry modules the functions and containers run, shipped as the package
      `handlers` (see the example project's `handlers/`); default: servestack's own.

    serving.yaml is validated first: a bad value raises `SpecError` naming its path, the value and what is
    allowed. Model packages must be in the project."""
    folder = (project or Path.cwd()).resolve()
    loaded = load_spec(folder / spec, artifacts_root=folder, bundled=False)
    only = list(deployments) if deployments is not None else None
    return add_deployments(scope, loaded, folder, entry_points=entry_points, name_prefix=name_prefix, only=only)


def _flag(value: object) -> bool:
    return str(value).lower() in {"1", "true", "yes", "on"}


def build_app(
    *,
    root: Path,
    context: Mapping[str, Any] | None = None,
    outdir: str | None = None,
    nag: bool = True,
    builtin_validation: bool = True,
    extend: Extend | None = None,
) -> App:
    """Build (not synthesize) the app for `root`'s serving.yaml. Context keys (cdk.json / `-c`):
    servestack:spec (path, default serving.yaml), servestack:deployments (comma list, default all),
    servestack:project (the folder of serving.yaml and the model packages, default `root`),
    servestack:prefix (stack and resource name prefix, default `servestack-`), servestack:pipeline (true to
    add the pipeline stack; it then reads servestack:repo, servestack:branch, servestack:connection-arn,
    servestack:account, servestack:region).

    `builtin_validation=False` skips aws-cdk-lib's own CloudFormation validation, as `cdk synth --no-validation`
    does: unless the context sets `@aws-cdk/core:validateAgainstDefaultRules`, its findings are only warnings,
    and it is over half of a synth's CPU. cdk-nag and the constructs' own checks run either way. `extend` adds
    the project's own resources (its `stacks/`)."""
    app = App(context=dict(context or {}), outdir=outdir, builtin_cloud_formation_validation=builtin_validation)
    ctx = app.node.try_get_context
    # The project (serving.yaml and its model packages) is this app's folder, unless servestack:project names
    # another: a project of its own that uses servestack's constructs and sources from here.
    project = Path(str(ctx("servestack:project"))) if ctx("servestack:project") else root
    spec_file = str(ctx("servestack:spec") or "serving.yaml")
    only = [n.strip() for n in str(ctx("servestack:deployments") or "").split(",") if n.strip()] or None
    prefix = str(ctx("servestack:prefix") or "servestack-")
    pipeline = _flag(ctx("servestack:pipeline"))
    if pipeline:
        from servestack.cdk.pipeline import required_context

        required_context(app)  # before any stack is built: a missing flag fails in a second, not a minute
    # A project's `handlers/` are the entry points its functions and containers run (the example project's
    # layout); without one, servestack's default entry points.
    entry_points = project / "handlers" if (project / "handlers").is_dir() else None
    stacks = add_serving(
        app, project=project, spec=spec_file, deployments=only, name_prefix=prefix, entry_points=entry_points
    )
    if extend is not None:
        extend(app, stacks)
    if pipeline:
        from servestack.cdk.pipeline import pipeline_stack

        spec = load_spec(project / spec_file, artifacts_root=project, bundled=False)
        pipeline_stack(app, spec=spec, root=project, entry_points=entry_points, deployments=only)
    if nag:
        Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return app


def main(root: Path, *, extend: Extend | None = None) -> None:
    """Synthesize the app of the project in `root`; a serving.yaml or context problem is one line, exit 2."""
    from servestack.cdk.pipeline import MissingContext
    from servestack.cdk.scaling_guard import DeployedChangeRefused
    from servestack.cdk.sources import RequirementsError

    try:
        app = build_app(root=root, extend=extend)
    except (SpecError, MissingContext, DeployedChangeRefused, RequirementsError) as exc:
        print(f"servestack: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except FileNotFoundError as exc:  # a package without its sample request/response: the message says how
        print(f"servestack: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    app.synth()
