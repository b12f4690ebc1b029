"""`local up --explain`'s account of how close each run is to the deploy: what is emulated (done as AWS does
it, under the same role), what is approximated (done differently, and how), and what is reported, not emulated
(a step of the deploy that no local process takes)."""

from __future__ import annotations

import platform
import sys
from pathlib import Path
from typing import Any

from servestack.local.sagemaker import ComponentDef, ContainerDef, VariantDef
from servestack.local.scheduler import TaskDef
from servestack.local.stack import StackTopology

EMULATED = "emulated"
APPROXIMATED = "approximated"
REPORTED = "reported, not emulated"


def _role_name(topology: StackTopology, logical_id: str | None) -> str:
    role = topology.roles.get(logical_id or "")
    return str(role.name) if role is not None else "?"


def _containers(topology: StackTopology) -> list[tuple[str, ContainerDef, str | None]]:
    """(variant or component name, container, execution role logical id) of every SageMaker container."""
    found: list[tuple[str, ContainerDef, str | None]] = []
    for endpoint in topology.endpoints.values():
        hosts: list[VariantDef | ComponentDef] = [*endpoint.variants, *endpoint.shadow_variants, *endpoint.components]
        for hosted in hosts:
            if hosted.container is not None:
                found.append((f"{endpoint.name}/{hosted.name}", hosted.container, hosted.execution_role))
    for transform in topology.transforms:
        found.append((f"transform {transform.schedule}", transform.container, transform.execution_role))
    return found


def fidelity_rows(topologies: list[StackTopology], out_dir: Path) -> list[tuple[str, str, str]]:
    """(class, subject, how) rows, in the order they are printed."""
    from servestack.local.cloudformation import image_asset
    from servestack.local.ecr import EcrImage
    from servestack.local.sagemaker import DockerfileError, read_image

    rows: list[tuple[str, str, str]] = []
    images_seen: set[str] = set()
    for topology in topologies:
        for name, container, role_id in _containers(topology):
            role = _role_name(topology, role_id)
            if container.mode == "MultiModel":
                rows.append(
                    (
                        EMULATED,
                        f"{name} model data",
                        f"TargetModel archives under {container.model_data_url} fetched on first use with role {role}",
                    )
                )
            elif container.model_data_url:
                rows.append(
                    (
                        EMULATED,
                        f"{name} model data",
                        f"{container.model_data_url} published as `cdk deploy` "
                        f"does, then fetched with role {role} and unpacked into the variant's /opt/ml/model",
                    )
                )
            asset = image_asset(out_dir, container.image)
            image_name = container.image.rsplit("/", 1)[-1]
            if asset is not None and EcrImage.parse(container.image) is not None and not name.startswith("transform "):
                rows.append(
                    (
                        EMULATED,
                        f"{name} image pull",
                        f"{image_name} pushed to the emulator's ECR as `cdk deploy` pushes it, then pulled with role "
                        f"{role} before each start of the container (ecr:GetAuthorizationToken, ecr:BatchGetImage: "
                        "the authorization and the manifest; no layer is pushed or downloaded, the files are the "
                        "staged build context)",
                    )
                )
            else:
                rows.append(
                    (
                        REPORTED,
                        f"{name} image pull",
                        f"ECR pull of {image_name} with role {role} (ecr:GetAuthorizationToken, "
                        "ecr:BatchGetImage...): not pulled locally",
                    )
                )
            if asset is None:
                rows.append(
                    (
                        REPORTED,
                        f"{name} container",
                        f"{container.image} is not an image asset of this "
                        "assembly: the working tree's `serve` entry stands for it",
                    )
                )
                continue
            if asset.tag in images_seen:
                continue
            images_seen.add(asset.tag)
            where = f"image {asset.tag[:12]} ({asset.dockerfile})"
            try:
                image = read_image(asset)
            except DockerfileError as error:
                rows.append((REPORTED, where, f"cannot run locally: {error}"))
                continue
            rows.append(
                (
                    EMULATED,
                    where,
                    "run from its staged build context in cdk.out: COPY (minus .dockerignore), "
                    f"ENV, WORKDIR {image.workdir}, ENTRYPOINT {list(image.entrypoint)} + SageMaker's `serve`",
                )
            )
            rows += _image_approximations(image, where)
            rows += _architecture_rows(asset.platform.rpartition("/")[2], where)
            rows.append((APPROXIMATED, where, "the instance type, its accelerators and its AMI are this machine's"))
        for endpoint in topology.endpoints.values():
            group = f"/aws/sagemaker/Endpoints/{endpoint.name}"
            rows.append(
                (
                    EMULATED,
                    f"{endpoint.name} logs",
                    f"to {group} with the execution role "
                    "(logs:CreateLogStream, logs:PutLogEvents); EMF lines become metrics once written",
                )
            )
            rows.append(
                (
                    APPROXIMATED,
                    f"{endpoint.name} logs",
                    "one stream for all of its variants' containers (SageMaker writes one per instance)",
                )
            )
            hosted: list[VariantDef | ComponentDef] = [*endpoint.variants, *endpoint.components]
            multi_model = any(h.container is not None and h.container.mode == "MultiModel" for h in hosted)
            if endpoint.async_config is None and not multi_model:  # the endpoints `local deploy` rehearses on
                rows.append(
                    (
                        EMULATED,
                        f"{endpoint.name} local deploy",
                        "the green fleet starts as a variant does: the image pulled and, for the version the "
                        "template's ModelDataUrl holds, the model data fetched with the execution role",
                    )
                )
                rows.append(
                    (
                        APPROXIMATED,
                        f"{endpoint.name} local deploy",
                        "another version comes from the model registry, fetched as the router (in AWS, `cdk deploy` "
                        "publishes it as a new model data asset that the execution role is granted)",
                    )
                )
        for function in topology.functions.values():
            if function.handler == "index.handler":
                continue  # inline code: run by CodeDeploy only
            rows += _architecture_rows(function.architecture, f"{function.name} code")
            rows.append(
                (
                    EMULATED,
                    f"{function.name} logs",
                    f"to {function.log_group} with role "
                    f"{_role_name(topology, function.role)} (logs:CreateLogStream, logs:PutLogEvents)",
                )
            )
        for task in topology.tasks.values():
            rows += _task_rows(topology, task, out_dir, images_seen)
            rows.append(
                (
                    REPORTED,
                    f"task {task.logical_id} logs",
                    "the awslogs driver's group is not written: its output goes to local up's (a scheduled run) or to "
                    "`local run-batch`'s",
                )
            )
        for release in topology.lambda_deployments:  # `local deploy` of a serverless deployment (codedeploy/)
            subject = f"release of {release.function}:{release.alias}"
            service_role = release.service_role_arn.rsplit("/", 1)[-1]
            if release.hook is not None:
                rows.append((EMULATED, subject, f"pre-traffic hook {release.hook.name} run from the template's "
                             f"inline code with role {release.hook.role_arn.rsplit('/', 1)[-1]}"))  # fmt: skip
            rows.append((EMULATED, subject, f"alias and provisioned-concurrency reads, hook invoke, alarm reads and "
                         f"alias updates with role {service_role} (its template statements)"))  # fmt: skip
            rows.append((APPROXIMATED, subject, "the alias's weights are recorded, not routed: every version runs "
                         "the working tree's code"))  # fmt: skip
            rows.append((APPROXIMATED, subject, "a hook that ends without reporting a status fails the release at "
                         "once (CodeDeploy waits for the lifecycle event's timeout, one hour)"))  # fmt: skip
    return rows


def _image_approximations(image: Any, where: str) -> list[tuple[str, str, str]]:
    return [(APPROXIMATED, where, line) for line in image.approximations()] + [
        (
            APPROXIMATED,
            where,
            f"the image's interpreter and packages ({image.env.get('VIRTUAL_ENV', '/')})"
            f" are the developer's venv ({sys.prefix})",
        )
    ]


def _task_rows(
    topology: StackTopology, task: TaskDef, out_dir: Path, images_seen: set[str]
) -> list[tuple[str, str, str]]:
    """An ECS task definition's container (servestack/local/ecs/tasks.py): how it starts, and from what."""
    from servestack.local.cloudformation import image_asset
    from servestack.local.sagemaker import DockerfileError, read_image

    subject = f"task {task.logical_id}"
    rows = [
        (
            EMULATED,
            f"{subject} start",
            "ecs:RunTask on the task definition and iam:PassRole of its roles (iam:PassedToService "
            "ecs-tasks.amazonaws.com) as the schedule's role: by the scheduler's ECS target, and by `local "
            "run-batch` through ECS RunTask on local up's AWS port",
        ),
        (
            APPROXIMATED,
            f"{subject} start",
            "`local run-batch` runs the task in its own process once RunTask is accepted (its output and exit "
            "code are the command's; DescribeTasks is not answered)",
        ),
        (
            APPROXIMATED,
            subject,
            f"the task role {_role_name(topology, task.task_role)}'s keys are environment variables (ECS serves "
            "them from the container credentials endpoint); Fargate's CPU, memory and architecture are this "
            "machine's",
        ),
        (
            REPORTED,
            f"{subject} image pull",
            f"ECR pull with the execution role {_role_name(topology, task.execution_role)}: no registry runs locally",
        ),
    ]
    asset = image_asset(out_dir, task.image)
    if asset is None:
        return [*rows, (REPORTED, subject, f"{task.image} is not an image asset of this assembly: not run")]
    where = f"image {asset.tag[:12]} ({asset.dockerfile})"
    try:
        image = read_image(asset)
    except DockerfileError as error:
        return [*rows, (REPORTED, where, f"cannot run locally: {error}")]
    rows.append(
        (
            EMULATED,
            subject,
            f"run from {where}'s staged build context in cdk.out: COPY (minus .dockerignore), ENV, WORKDIR "
            f"{image.workdir}, the task definition's EntryPoint {list(task.entry_point)} (the image's CMD dropped), "
            "Command and Environment; the model is the one the image carries",
        )
    )
    if asset.tag not in images_seen:
        images_seen.add(asset.tag)
        rows += _image_approximations(image, where)
        rows += _architecture_rows(asset.platform.rpartition("/")[2], where)
    return rows


# What a Docker platform, a Lambda architecture and `uname -m` call each CPU architecture.
_ARCHITECTURE_OF = {"amd64": "x86_64", "x86_64": "x86_64", "arm64": "arm64", "aarch64": "arm64"}


def _architecture_rows(declared: str, subject: str) -> list[tuple[str, str, str]]:
    """The approximation of running code built for another CPU architecture (an image for linux/arm64, an arm64
    function: AWS Graviton) on this machine: local mode runs its equivalent for this machine's architecture."""
    wanted = _ARCHITECTURE_OF.get(declared)
    here = _ARCHITECTURE_OF.get(platform.machine().lower(), platform.machine())
    if wanted is None or wanted == here:
        return []
    graviton = " (AWS Graviton)" if wanted == "arm64" else ""
    return [
        (
            APPROXIMATED,
            subject,
            f"built for {wanted}{graviton}, run here as its {here} equivalent: the same sources and locked "
            f"versions, with this machine's {here} wheels and interpreter (speed and numerics are {here}'s)",
        )
    ]


def fidelity(topologies: list[StackTopology], out_dir: Path) -> str:
    rows = fidelity_rows(topologies, out_dir)
    lines = ["\nhow each run compares with the deploy:"]
    for kind in (EMULATED, APPROXIMATED, REPORTED):
        mine = [(subject, how) for k, subject, how in rows if k == kind]
        if mine:
            lines.append(f"  {kind}:")
            lines += [f"    {subject}: {how}" for subject, how in mine]
    return "\n".join(lines)
