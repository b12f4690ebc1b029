"""A template's container images in the emulator's ECR: published as `cdk deploy` publishes them, and pulled
with the execution role before each container starts, as SageMaker pulls them.

`cdk deploy` pushes each Docker image asset to the bootstrap repository its `*.assets.json` names
(`cdk-<qualifier>-container-assets-<account>-<region>`), tagged with the asset hash; `publish_images` does the
same on the emulator as the developer (the deploying identity): the repository, then an image manifest under
that tag. No layer is uploaded: the image's files are the build context `cdk synth` staged in cdk.out, which is
what the local container runs from (servestack/local/sagemaker/container.py).

SageMaker pulls the image of a model's container with the model's execution role: an authorization token
(`ecr:GetAuthorizationToken`), then the manifest (`ecr:BatchGetImage` on the repository), then the layers
(`ecr:GetDownloadUrlForLayer`). `pull_image` makes the first two calls with the role's keys, so a role without
either grant, or a tag that was never pushed, fails the start as it does in AWS; the layers are not
downloaded (nothing to download: the files come from the staged context).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servestack.local.cloudformation import image_assets

MANIFEST_MEDIA_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_MEDIA_TYPE = "application/vnd.docker.container.image.v1+json"
# `<registry id>.dkr.ecr.<region>.<suffix>/<repository>:<tag>`: an ECR image URI with a tag.
ECR_IMAGE = re.compile(
    r"^(?P<registry>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.[^/]+/(?P<repository>[^:@]+):(?P<tag>[^:/@]+)$"
)


class ImagePullError(RuntimeError):
    """The image could not be pulled: the message says which image, as whom, and the ECR error."""


@dataclass(frozen=True)
class EcrImage:
    registry: str  # the account id
    region: str
    repository: str
    tag: str

    @classmethod
    def parse(cls, uri: str) -> EcrImage | None:
        """The ECR image a URI names, or None for an image from elsewhere (a public registry, a digest)."""
        found = ECR_IMAGE.match(uri)
        return cls(**found.groupdict()) if found else None

    def __str__(self) -> str:
        return f"{self.repository}:{self.tag}"


def _code(error: Exception) -> str:
    return str(getattr(error, "response", {}).get("Error", {}).get("Code", type(error).__name__))


def _message(error: Exception) -> str:
    return str(getattr(error, "response", {}).get("Error", {}).get("Message", error))


def manifest(tag: str) -> str:
    """A schema 2 manifest standing for the asset `tag`: its config blob is named after the asset hash (the
    same asset, the same manifest) and it lists no layer (none is pushed)."""
    config_digest = "sha256:" + hashlib.sha256(f"servestack image asset {tag}".encode()).hexdigest()
    return json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "config": {"mediaType": CONFIG_MEDIA_TYPE, "size": 0, "digest": config_digest},
            "layers": [],
        },
        sort_keys=True,
    )


def published_images(out_dir: Path, uris: Iterable[str]) -> list[EcrImage]:
    """The ECR images of `uris` that are Docker image assets of the cloud assembly (by tag), once each."""
    assets = image_assets(out_dir)
    found: dict[str, EcrImage] = {}
    for uri in uris:
        image = EcrImage.parse(uri)
        if image is not None and image.tag in assets:
            found[str(image)] = image
    return [found[key] for key in sorted(found)]


def publish_images(ecr: Any, out_dir: Path, uris: Iterable[str]) -> list[str]:
    """Push each image asset `uris` name to its repository under its tag, with the client `ecr` (the deploying
    identity), creating the repository (`cdk bootstrap` creates it in an account). Returns what was pushed."""
    pushed = []
    for image in published_images(out_dir, uris):
        try:
            ecr.create_repository(repositoryName=image.repository)
        except Exception as error:
            if _code(error) != "RepositoryAlreadyExistsException":
                raise
        try:
            ecr.put_image(repositoryName=image.repository, imageManifest=manifest(image.tag), imageTag=image.tag)
        except Exception as error:
            if _code(error) != "ImageAlreadyExistsException":  # asset tags are content hashes: same tag, same image
                raise
            continue
        pushed.append(str(image))
    return pushed


def pull_image(ecr: Any, uri: str, *, role: str) -> EcrImage:
    """SageMaker's pull of `uri` before a container starts, with the client `ecr` signing as the execution role
    named `role`: the authorization token, then the image's manifest by its tag. Raises ImagePullError with
    the ECR error (an AccessDenied names the action and the repository)."""
    image = EcrImage.parse(uri)
    if image is None:
        raise ImagePullError(f"{uri}: not an ECR image URI (<account>.dkr.ecr.<region>.<suffix>/<repository>:<tag>)")
    try:
        ecr.get_authorization_token()
        answer = ecr.batch_get_image(
            registryId=image.registry, repositoryName=image.repository, imageIds=[{"imageTag": image.tag}]
        )
    except Exception as error:
        if not hasattr(error, "response"):
            raise
        said = f"{_code(error)}: {_message(error)}"
        raise ImagePullError(f"CannotPullContainerError: {uri} as role {role}: {said}") from None
    if not answer.get("images"):
        failures = "; ".join(f"{f.get('failureCode')}: {f.get('failureReason')}" for f in answer.get("failures", []))
        raise ImagePullError(f"CannotPullContainerError: {uri} as role {role}: {failures or 'no such image'}")
    return image


def image_uris(topologies: Iterable[Any]) -> list[str]:
    """The image URIs of every SageMaker container the topologies run (variants, shadows, inference
    components, transform jobs)."""
    uris = []
    for topology in topologies:
        for endpoint in topology.endpoints.values():
            for hosted in (*endpoint.variants, *endpoint.shadow_variants, *endpoint.components):
                if hosted.container is not None:
                    uris.append(hosted.container.image)
        uris += [t.container.image for t in topology.transforms]
    return uris
