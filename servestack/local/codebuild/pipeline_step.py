"""A CodeBuild step of the delivery pipeline (`SmokeTestStaging`, `SmokeTestProduction`), run against the running
`local up` as CodePipeline runs it after a stage's deploy: the step's own commands, its environment and its
role, from the synthesized pipeline template (`servestack-pipeline.template.json`).

    python -m servestack.local.codebuild.pipeline_step SmokeTestStaging [--state FILE] [--template FILE | --synth]

The template is the project's `cdk synth -c servestack:pipeline=true ...` output (`cdk.out/`), a file given, or
with `--synth` the app synthesized now with its pipeline (cdk.json's context names the repository). From it:
the pipeline action named STEP, its CodeBuild project's buildspec (`build` phase commands; the `install` phase
is reported, not run: this machine's environment stands for it), the project's environment variables and the
action's (`#{<stack namespace>.<Output>}` taken from local up's stack outputs), and the project's service role
with its policies, resolved to local ARNs. local up's stacks are the stage's when the app runs with the stage's
name prefix (`servestack:prefix` = `servestack-staging-` in cdk.json), which the step's statements name.

The role is given to local up's IAM store (servestack/local/iam/roles_route.py) and the commands run with its keys
and local up's endpoints (`AWS_ENDPOINT_URL` the emulator; SageMaker Runtime, Lambda and Scheduler on local up's
AWS API port), so every call the step makes is enforced against its statements. Exit status: the commands'.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from servestack.failures import CommandError, ExitCode
from servestack.local.cloudformation import LocalValues, Resolver, StackTemplate, logical_id_of
from servestack.local.emulator import state

PIPELINE_TEMPLATE = "servestack-pipeline.template.json"
VARIABLE = re.compile(r"#\{([^.}]+)\.([^}]+)\}")


def read_step(template: StackTemplate, resolver: Resolver, step: str) -> dict[str, Any]:
    """The step's commands, environment and role (name and resolved policy documents) from the template."""
    resources = template.body["Resources"]
    actions = [
        action
        for r in resources.values()
        if r["Type"] == "AWS::CodePipeline::Pipeline"
        for stage in r["Properties"]["Stages"]
        for action in stage["Actions"]
    ]
    action = next((a for a in actions if a["Name"] == step), None)
    if action is None:
        steps = sorted(a["Name"] for a in actions if a["ActionTypeId"]["Provider"] == "CodeBuild")
        raise CommandError(f"step: {step!r} is not a CodeBuild step of the pipeline ({', '.join(steps)})")
    project_id = logical_id_of(action["Configuration"]["ProjectName"])
    project = resources[project_id]["Properties"]
    buildspec = json.loads(resolver.resolve(project["Source"]["BuildSpec"]))
    phases = buildspec.get("phases", {})
    environment = {
        str(v["Name"]): str(resolver.resolve(v["Value"]))
        for v in project.get("Environment", {}).get("EnvironmentVariables", [])
    }
    action_variables = json.loads(action["Configuration"].get("EnvironmentVariables") or "[]")
    role_id = logical_id_of(project["ServiceRole"])
    assert role_id is not None
    documents = [resolver.resolve(p["PolicyDocument"]) for p in resources[role_id]["Properties"].get("Policies", [])]
    documents += [
        resolver.resolve(r["Properties"]["PolicyDocument"])
        for r in resources.values()
        if r["Type"] == "AWS::IAM::Policy"
        and any(logical_id_of(x) == role_id for x in r["Properties"].get("Roles", []))
    ]
    return {
        "install": list(phases.get("install", {}).get("commands", [])),
        "commands": [
            c for phase in ("pre_build", "build", "post_build") for c in phases.get(phase, {}).get("commands", [])
        ],
        "environment": environment,
        "action_variables": {str(v["name"]): str(v["value"]) for v in action_variables},
        "role": resolver.physical_name(role_id),
        "policies": {f"policy-{i}": d for i, d in enumerate(documents)},
    }


def stack_output(about: dict[str, Any], namespace: str, output: str) -> str:
    """`#{<namespace>.<output>}`: CDK Pipelines names a stack's variable namespace after its construct path (the
    stack name without its dashes, in it); the value is that local up stack's output."""
    squashed = namespace.lower()
    stacks = about.get("stacks", {})
    found = [name for name in stacks if name.replace("-", "").lower() in squashed]
    if not found:
        raise CommandError(f"{namespace}.{output}: no stack of the running local up ({', '.join(stacks)}) is in it")
    name = max(found, key=len)
    outputs = stacks[name].get("outputs", {})
    if output not in outputs:
        raise CommandError(f"{namespace}.{output}: stack {name} has no output {output}")
    return str(outputs[output])


def pipeline_template(about: dict[str, Any], *, synth: bool) -> Path:
    """The pipeline template of `cdk synth -c servestack:pipeline=true ...` in the project's `cdk.out`; with
    `synth`, synthesized now (the app with its pipeline, cdk.json's context) into `.servestack/pipeline.out`."""
    from servestack.local.cloudformation import SynthError, synthesize

    project = Path(about["project"])
    if not synth:
        path = project / "cdk.out" / PIPELINE_TEMPLATE
        if not path.is_file():
            raise CommandError(
                f"{path}: no pipeline template; run `cdk synth -c servestack:pipeline=true -c servestack:repo=... "
                "-c servestack:connection-arn=...` in the project, pass --template, or --synth",
                ExitCode.NOT_FOUND,
            )
        return path
    out_dir = project / ".servestack" / "pipeline.out"
    try:
        synthesize(project, Path(about["spec"]), out_dir, artifacts=project / "models" / "artifacts", pipeline=True)
    except SynthError as error:
        raise CommandError(str(error)) from None
    return out_dir / PIPELINE_TEMPLATE


def run_step(
    step: str, *, state_path: Path | None = None, template_path: Path | None = None, synth: bool = False
) -> int:
    from servestack.local.emulator import developer, signed
    from servestack.local.iam import ROUTE

    about = state.read(state_path)
    project = Path(about["project"])
    path = template_path or pipeline_template(about, synth=synth)
    region = about.get("region", "us-east-1")
    template = StackTemplate.load(path, "servestack-pipeline")
    resolver = Resolver(template, LocalValues(region=region, emulator_url=about["endpoint_url"], api_urls={}))
    read = read_step(template, resolver, step)
    body = json.dumps({"policies": read["policies"]}).encode()
    status, answer = signed("PUT", f"{about['aws_api_url']}{ROUTE}/{read['role']}", developer(about), region,
                            body=body, service="iam")  # fmt: skip
    if status != 200:
        raise CommandError(f"{step}: local up refused the step's role: {answer[:300]!r}", ExitCode.AWS)
    keys = json.loads(answer)
    variables = {
        name: VARIABLE.sub(lambda m: stack_output(about, m.group(1), m.group(2)), value)
        for name, value in read["action_variables"].items()
    }
    front = about["aws_api_url"]
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
        **read["environment"],
        **variables,
        "AWS_ACCESS_KEY_ID": keys["AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": keys["AWS_SECRET_ACCESS_KEY"],
        "AWS_SESSION_TOKEN": keys.get("AWS_SESSION_TOKEN", ""),
        "AWS_DEFAULT_REGION": region,
        "AWS_REGION": region,
        "AWS_ENDPOINT_URL": about["endpoint_url"],
        "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME": front,
        "AWS_ENDPOINT_URL_LAMBDA": front,
        "AWS_ENDPOINT_URL_SCHEDULER": front,
        "CODEBUILD_SRC_DIR": str(project),
    }
    for command in read["install"]:
        print(f"[{step}] install (reported, not run: this machine's environment stands for it): {command}", flush=True)
    print(f"[{step}] as {keys['arn']}", flush=True)
    for command in read["commands"]:
        print(f"[{step}] {command}", flush=True)
        result = subprocess.run(["bash", "-c", command], cwd=project, env=env, check=False)
        if result.returncode != 0:
            print(f"[{step}] failed: `{command}` exited {result.returncode}", file=sys.stderr, flush=True)
            return 1
    print(f"[{step}] succeeded", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m servestack.local.codebuild.pipeline_step", description=__doc__)
    parser.add_argument("step", help="the pipeline's CodeBuild step (SmokeTestStaging, SmokeTestProduction)")
    parser.add_argument("--state", type=Path, default=None, help="state file of local up (default: the project's)")
    parser.add_argument(
        "--template", type=Path, default=None, help=f"default: the project's cdk.out/{PIPELINE_TEMPLATE}"
    )
    parser.add_argument("--synth", action="store_true", help="synthesize the app with its pipeline first")
    args = parser.parse_args(argv)
    try:
        return run_step(args.step, state_path=args.state, template_path=args.template, synth=args.synth)
    except CommandError as error:
        print(f"servestack: {error.message}", file=sys.stderr)
        return int(error.code)


if __name__ == "__main__":
    sys.exit(main())
