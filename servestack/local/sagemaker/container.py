"""A template's container image, run from the build context `cdk synth` staged in cdk.out.

An image URI in a template (`<account>.dkr.ecr.<region>.<suffix>/cdk-...-container-assets-...:<tag>`) names a
`DockerImageAsset` whose tag is the asset hash; the assembly's `*.assets.json` gives that asset's directory
(the staged build context) and Dockerfile. `staged_container` reads the Dockerfile
(servestack/local/sagemaker/dockerfile.py), copies what its COPYs take from that context into a root of its own under
local mode's work folder (once per asset), and returns the process that `docker run IMAGE ARGUMENTS` would
start there. `cdk deploy` builds the image from that same directory, so what runs here is what ships, up to
the approximations the image lists.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from servestack.local.cloudformation import ImageAsset, image_asset
from servestack.local.sagemaker.dockerfile import (
    ContainerCommand,
    DockerfileError,
    Image,
    container_command,
    image_requirements,
    parse,
    stage_root,
)


def read_image(asset: ImageAsset) -> Image:
    dockerfile = asset.context / asset.dockerfile
    if not dockerfile.is_file():
        raise DockerfileError(f"{dockerfile}: the image asset's Dockerfile is not in the staged context")
    # The base image's PATH is this machine's: `ENV PATH=/opt/venv/bin:$PATH` extends it.
    return parse(
        dockerfile.read_text(encoding="utf-8"), name=asset.dockerfile, base_env={"PATH": os.environ.get("PATH", "")}
    )


@dataclass(frozen=True)
class StagedContainer:
    asset: ImageAsset
    image: Image
    root: Path  # the image's files, as its COPYs place them
    command: ContainerCommand


def staged_container(
    out_dir: Path, image_uri: str, images_dir: Path, arguments: tuple[str, ...] | None
) -> StagedContainer | None:
    """The container of `image_uri` with its files staged under `images_dir/<tag>/rootfs`, started as
    `docker run IMAGE ARGUMENTS`; None when the URI names no asset of this assembly."""
    asset = image_asset(out_dir, image_uri)
    if asset is None:
        return None
    image = read_image(asset)
    root = stage_root(image, asset.context, images_dir / asset.tag[:24] / "rootfs")
    return StagedContainer(asset, image, root, container_command(image, root, arguments, venv=image_venv(image, root)))


def image_venv(image: Image, root: Path) -> str | None:
    """The image's own virtual environment: what its RUN steps install, built for this machine; None (the
    developer's) for an image that installs nothing from a requirements file."""
    from servestack.local.hosting import installed

    requirements = image_requirements(image, root)
    if requirements is None:
        return None
    return str(installed(requirements, "venv", what=f"image {image.base or '?'}"))
