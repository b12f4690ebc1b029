"""CDK Pipelines for users' CI/CD: source (CodeStar connection) -> synth (`make setup`, `make test`,
`make synth` by default) -> staging -> smoke test of every deployment -> manual approval -> production -> smoke
test.

`PipelineStack` is a construct a CDK app adds itself; `pipeline_stack` builds it from context: `-c
servestack:pipeline=true -c servestack:repo=owner/name -c servestack:connection-arn=arn:aws:codeconnections:...
[-c servestack:branch=main] [-c servestack:account=... -c servestack:region=...]
[-c servestack:pipeline-deployments=a,b]`, and, for a project not built with `make`, its own commands as JSON
lists in cdk.json's context: `servestack:pipeline-install-commands`, `servestack:pipeline-build-commands`,
`servestack:pipeline-smoke-commands`.

The synth step compares each deployment's SageMaker variants with its deployed stack's template
(servestack/cdk/scaling_guard.py: its checkout is fresh, so there is no earlier synth to compare with): it sets
SERVESTACK_COMPARE_WITH=deployed, and its role may call cloudformation:GetTemplate, and no other CloudFormation
action, on the app's deployment stacks (those of both stages, and the app's own).

The container images are built by CDK Pipelines' asset stage, in CodeBuild, whose outbound IPs are shared: their
base images come from ECR Public, pulled without credentials (servestack/cdk/images.py says why), so the
pipeline passes no `docker_credentials` and logs in to no registry to build them. Those CodeBuild hosts are x86_64:
when a stage builds a linux/arm64 image (an AWS Graviton endpoint, an arm64 Fargate task or container-image
function), the asset projects first register QEMU's arm64 emulator with the kernel (`binfmt_misc`, from the image
that docker/setup-qemu-action also uses, on ECR Public), so that the image's `RUN` steps execute as arm64.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from aws_cdk import Aws, Environment, Stack, Stage, Token, pipelines
from aws_cdk import aws_codebuild as codebuild
from aws_cdk import aws_iam as iam
from constructs import Construct

from servestack.cdk.deployment import DeploymentStack, add_deployments
from servestack.cdk.scaling_guard import COMPARE_ENVIRONMENT, DEPLOYED
from servestack.cdk.shared import acknowledge, logical_id
from servestack.spec import ServingSpec

# The defaults build a project that `servestack init` wrote (its Makefile's `setup`, `test` and `synth`, its
# .venv); a project built otherwise passes its own commands (props, or the context keys of `pipeline_stack`).
INSTALL_COMMANDS = ("make setup",)
# Registers QEMU's arm64 emulator on an x86_64 Docker host (privileged, as CDK Pipelines' image asset projects are),
# so that `docker build --platform linux/arm64` can run the image's RUN steps. The image is EKS Distro's binfmt
# build on ECR Public (pulled without credentials, like the base images), pinned to its QEMU version.
BINFMT_IMAGE = "public.ecr.aws/eks-distro-build-tooling/binfmt-misc:qemu-v7.0.0"
REGISTER_ARM64_EMULATOR = f"docker run --privileged --rm {BINFMT_IMAGE} --install arm64"
BUILD_COMMANDS = ("make test", "make synth")
SMOKE_COMMANDS = (".venv/bin/python -m servestack.cdk.smoke",)


class ServingStage(Stage):
    """Every chosen deployment as its own stack, named `servestack-<stage>-<deployment>`."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        spec: ServingSpec,
        root: Path,
        deployments: list[str] | None,
        entry_points: Path | None = None,
        env: Environment | None = None,
    ) -> None:
        super().__init__(scope, id, env=env)
        self.deployment_stacks: list[DeploymentStack] = add_deployments(
            self, spec, root, entry_points=entry_points, name_prefix=f"servestack-{id.lower()}-", only=deployments
        )


def smoke_statements(stage: ServingStage) -> list[iam.PolicyStatement]:
    """The least the smoke test needs: per action, exactly the stage's resources servestack/cdk/smoke.py calls
    (InvokeEndpoint on its endpoints, InvokeFunction on its functions' aliases, GetSchedule on its schedules)."""
    resources: dict[str, list[str]] = {}
    for stack in stage.deployment_stacks:
        grant = stack.smoke_grant
        resources.setdefault(grant.action, []).extend(
            f"arn:{Aws.PARTITION}:{grant.service}:{Aws.REGION}:{Aws.ACCOUNT_ID}:{r}" for r in grant.resources
        )
    return [iam.PolicyStatement(actions=[action], resources=arns) for action, arns in sorted(resources.items())]


def smoke_step(
    stage: ServingStage,
    *,
    install_commands: Sequence[str] = INSTALL_COMMANDS,
    commands: Sequence[str] = SMOKE_COMMANDS,
) -> pipelines.CodeBuildStep:
    """Invoke each deployment of `stage` once with its model's sample request (servestack/cdk/smoke.py), under a
    role that may call exactly those deployments."""
    env_outputs = {}
    env = {}
    for i, stack in enumerate(stage.deployment_stacks):
        env[f"SMOKE_{i}_DEPLOYMENT"] = stack.deployment
        env_outputs[f"SMOKE_{i}_KIND"] = stack.smoke_kind
        env_outputs[f"SMOKE_{i}_TARGET"] = stack.smoke_target
    return pipelines.CodeBuildStep(
        f"SmokeTest{stage.stage_name}",
        env=env,
        env_from_cfn_outputs=env_outputs,
        install_commands=list(install_commands),
        commands=list(commands),
        role_policy_statements=smoke_statements(stage),
    )


class PipelineStack(Stack):
    """The self-mutating delivery pipeline of a project's serving.yaml: source (a CodeConnections connection to
    `repo`) -> synth (`install_commands`, then `build_commands`, leaving `cdk.out`) -> staging -> smoke test ->
    manual approval -> production -> smoke test. The commands' defaults build a project `servestack init` wrote."""

    def _generated_role_findings(self) -> dict[str, str]:
        projects = [
            logical_id(c) for c in self.node.find_all() if isinstance(c, codebuild.CfnProject) and Stack.of(c) is self
        ]
        return _generated_findings_for(
            self, projects, logical_id(self.pipeline.pipeline.artifact_bucket), read_stacks=self.compared_stacks
        )

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        spec: ServingSpec,
        root: Path,
        repo: str,
        connection_arn: str,
        branch: str = "main",
        deployments: list[str] | None = None,
        entry_points: Path | None = None,
        install_commands: Sequence[str] = INSTALL_COMMANDS,
        build_commands: Sequence[str] = BUILD_COMMANDS,
        smoke_commands: Sequence[str] = SMOKE_COMMANDS,
        env: Environment | None = None,
    ) -> None:
        super().__init__(scope, id, env=env, description="servestack delivery pipeline")
        for prop, commands in (("install_commands", install_commands), ("build_commands", build_commands),
                               ("smoke_commands", smoke_commands)):  # fmt: skip
            if isinstance(commands, str) or not commands or not all(isinstance(c, str) and c for c in commands):
                raise MissingContext(f"PipelineStack: {prop}={commands!r} is not a non-empty list of shell commands")
        if repo.count("/") != 1 or repo.startswith("/") or repo.endswith("/"):
            raise MissingContext(f"PipelineStack: repo={repo!r} is not 'owner/name' (-c servestack:repo=owner/name)")
        source = pipelines.CodePipelineSource.connection(repo, branch, connection_arn=connection_arn)
        stages = [
            ServingStage(self, name, spec=spec, root=root, deployments=deployments, entry_points=entry_points, env=env)
            for name in ("Staging", "Production")
        ]
        # Every deployment stack the synth builds compares with its deployed template (the stages' and, when the
        # app added them before this stack, the app's own), so the synth's role may read exactly those.
        self.compared_stacks = sorted(
            {c.stack_name for c in self.node.root.node.find_all() if isinstance(c, DeploymentStack)}
        )
        self.builds_arm64_images = any(
            "arm64" in stack.image_architectures for stage in stages for stack in stage.deployment_stacks
        )
        self.pipeline = pipelines.CodePipeline(
            self,
            "Pipeline",
            pipeline_name="servestack",
            synth=pipelines.CodeBuildStep(
                "Synth",
                input=source,
                install_commands=list(install_commands),
                commands=list(build_commands),
                primary_output_directory="cdk.out",
                env={COMPARE_ENVIRONMENT: DEPLOYED},
                role_policy_statements=[template_read_statement(self, self.compared_stacks)],
            ),
            code_build_defaults=pipelines.CodeBuildOptions(
                build_environment=codebuild.BuildEnvironment(
                    build_image=codebuild.LinuxBuildImage.STANDARD_7_0, compute_type=codebuild.ComputeType.MEDIUM
                )
            ),
            asset_publishing_code_build_defaults=arm64_emulation() if self.builds_arm64_images else None,
            docker_enabled_for_synth=False,
            enable_key_rotation=True,
            cross_account_keys=True,
        )
        for stage in stages:
            smoke = smoke_step(stage, install_commands=install_commands, commands=smoke_commands)
            pre = [pipelines.ManualApprovalStep("PromoteToProduction", comment="Staging smoke test passed?")]
            self.pipeline.add_stage(stage, pre=pre if stage is not stages[0] else None, post=[smoke])
        self.staging, self.production = stages
        self.pipeline.build_pipeline()
        acknowledge(self, self._generated_role_findings())
        acknowledge(
            self,
            {
                "AwsSolutions-S1": "The pipeline's artifact bucket is written only by CodePipeline and CodeBuild, "
                "whose every action is logged by CloudTrail; S3 access logs would duplicate that.",
                "AwsSolutions-CB4": "CodeBuild projects encrypt their artifacts with the pipeline's own KMS key "
                "(cross_account_keys=True); CDK Pipelines does not expose a separate key per project.",
            },
        )


def arm64_emulation() -> pipelines.CodeBuildOptions:
    """The asset projects' install phase registers the arm64 emulator before cdk-assets builds any image."""
    return pipelines.CodeBuildOptions(
        partial_build_spec=codebuild.BuildSpec.from_object(
            {"version": "0.2", "phases": {"install": {"commands": [REGISTER_ARM64_EMULATOR]}}}
        )
    )


def template_read_statement(stack: Stack, stack_names: Sequence[str]) -> iam.PolicyStatement:
    """cloudformation:GetTemplate on the named stacks of `stack`'s account and region: GetTemplate takes a stack
    ARN, whose last part is the stack's id, unknown before it is created
    (https://docs.aws.amazon.com/service-authorization/latest/reference/list_awscloudformation.html)."""
    return iam.PolicyStatement(
        actions=["cloudformation:GetTemplate"],
        resources=[
            stack.format_arn(service="cloudformation", resource="stack", resource_name=f"{name}/*")
            for name in stack_names
        ],
    )


_ARTIFACT_ACCESS = (
    "CDK Pipelines' generated role: read/write of the pipeline's own artifact bucket and its KMS key, with the "
    "wildcard actions CDK's grants use (s3:GetObject*, kms:GenerateDataKey*, ...); scoped to those resources."
)


def _generated_findings_for(
    stack: Stack, projects: list[str], artifact_bucket: str, *, read_stacks: Sequence[str] = ()
) -> dict[str, str]:
    # cdk-nag names an unresolved pseudo parameter `<AWS::...>`: the partition always is one (CDK writes
    # `arn:${AWS::Partition}:` so the same template deploys to aws, aws-cn and aws-us-gov); the region and the
    # account are too unless the stack has a concrete environment.
    partition = "<AWS::Partition>" if Token.is_unresolved(stack.partition) else stack.partition
    region = "<AWS::Region>" if Token.is_unresolved(stack.region) else stack.region
    account = "<AWS::AccountId>" if Token.is_unresolved(stack.account) else stack.account
    findings = {
        f"AwsSolutions-IAM5[Action::{a}]": _ARTIFACT_ACCESS
        for a in (
            "kms:GenerateDataKey*",
            "kms:ReEncrypt*",
            "s3:Abort*",
            "s3:DeleteObject*",
            "s3:GetBucket*",
            "s3:GetObject*",
            "s3:List*",
        )
    }
    findings[f"AwsSolutions-IAM5[Resource::<{artifact_bucket}.Arn>/*]"] = _ARTIFACT_ACCESS
    findings["AwsSolutions-IAM5[Resource::*]"] = (
        "CDK Pipelines' self-mutation and asset roles call APIs without resource-level permissions "
        "(cloudformation:DescribeStacks, ecr:GetAuthorizationToken)."
    )
    findings[f"AwsSolutions-IAM5[Resource::arn:*:iam::{account}:role/*]"] = (
        "Self-mutation assumes the CDK bootstrap roles (cdk-*-deploy/file-publishing roles) of this account; "
        "their names carry the bootstrap qualifier, so CDK grants on the role path."
    )
    codebuild = f"arn:{partition}:codebuild:{region}:{account}:report-group/"
    logs = f"arn:{partition}:logs:{region}:{account}:log-group:/aws/codebuild/"
    reason = "A CodeBuild project of this pipeline writes its own logs and test reports (names end in a suffix)."
    findings[f"AwsSolutions-IAM5[Resource::{codebuild}*]"] = reason
    findings[f"AwsSolutions-IAM5[Resource::{logs}*]"] = reason
    for project in projects:
        findings[f"AwsSolutions-IAM5[Resource::{codebuild}<{project}>-*]"] = reason
        findings[f"AwsSolutions-IAM5[Resource::{logs}<{project}>:*]"] = reason
    for name in read_stacks:
        findings[f"AwsSolutions-IAM5[Resource::arn:{partition}:cloudformation:{region}:{account}:stack/{name}/*]"] = (
            "The synth step reads the deployed template of this one stack (cloudformation:GetTemplate); a stack "
            "ARN ends in the stack's id, which CloudFormation assigns at creation."
        )
    return findings


class MissingContext(ValueError):
    """A context value the pipeline cannot do without; the message names the `-c` flag to pass."""


# Context the pipeline needs, with the form of its value (the message of a missing one shows the flag to add).
REQUIRED_CONTEXT = {
    "servestack:repo": "owner/name",
    "servestack:connection-arn": "arn:aws:codeconnections:<region>:<account>:connection/<id>",
}


def required_context(scope: Construct) -> dict[str, str]:
    """The pipeline's required context values; `MissingContext` names every missing one and its flag."""
    ctx = scope.node.try_get_context
    values = {key: str(ctx(key) or "").strip() for key in REQUIRED_CONTEXT}
    missing = [key for key, value in values.items() if not value]
    if missing:
        flags = " ".join(f"-c {key}={REQUIRED_CONTEXT[key]}" for key in missing)
        raise MissingContext(
            f"servestack:pipeline=true needs {', '.join(missing)}: pass {flags} "
            "(the pipeline's source is that repository, reached through that CodeConnections connection)"
        )
    return values


def _commands(scope: Construct, key: str, default: Sequence[str]) -> Sequence[str]:
    """A list of shell commands from the context key `key` (a JSON list in cdk.json, or one command with `-c`)."""
    value = scope.node.try_get_context(key)
    if value is None:
        return default
    return [value] if isinstance(value, str) else value  # a wrong shape is refused by PipelineStack, by name


def pipeline_stack(
    scope: Construct,
    *,
    spec: ServingSpec,
    root: Path,
    deployments: list[str] | None,
    entry_points: Path | None = None,
) -> PipelineStack:
    """The pipeline stack from context (see the module docstring); `MissingContext` names a missing flag."""
    ctx = scope.node.try_get_context
    needed = required_context(scope)
    account, region = ctx("servestack:account"), ctx("servestack:region")
    only = [n.strip() for n in str(ctx("servestack:pipeline-deployments") or "").split(",") if n.strip()]
    return PipelineStack(
        scope,
        "servestack-pipeline",
        spec=spec,
        root=root,
        repo=needed["servestack:repo"],
        connection_arn=needed["servestack:connection-arn"],
        branch=str(ctx("servestack:branch") or "main"),
        deployments=only or deployments,
        entry_points=entry_points,
        install_commands=_commands(scope, "servestack:pipeline-install-commands", INSTALL_COMMANDS),
        build_commands=_commands(scope, "servestack:pipeline-build-commands", BUILD_COMMANDS),
        smoke_commands=_commands(scope, "servestack:pipeline-smoke-commands", SMOKE_COMMANDS),
        env=Environment(account=str(account), region=str(region)) if account and region else None,
    )
