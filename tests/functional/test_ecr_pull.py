"""The image pull SageMaker makes with a model's execution role before its container starts, against the
embedded emulator with IAM enforced as local up runs it: the image asset pushed to its bootstrap repository as
`cdk deploy` pushes it, then pulled with a role holding the template's two ECR statements, and refused, with
the action named, to a role missing either."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from servestack.local.ecr.images import EcrImage, ImagePullError, publish_images, pull_image
from servestack.local.emulator import EmbeddedEmulator, client_as
from servestack.local.iam.access import LocalAccess
from servestack.local.iam.identities import Credentials
from servestack.local.sagemaker.variant_start import ContainerSource, VariantStartError, prepare

REGION = "us-east-1"
TAG = "a" * 64
REPOSITORY = "cdk-hnb659fds-container-assets-123456789012-us-east-1"
URI = f"123456789012.dkr.ecr.us-east-1.amazonaws.com/{REPOSITORY}:{TAG}"
REPOSITORY_ARN = f"arn:aws:ecr:us-east-1:123456789012:repository/{REPOSITORY}"
# The execution role's statements, as `repository.grant_pull(role)` writes them in the realtime template.
TOKEN = {"Effect": "Allow", "Action": "ecr:GetAuthorizationToken", "Resource": "*"}
LAYERS = {
    "Effect": "Allow",
    "Action": ["ecr:BatchCheckLayerAvailability", "ecr:GetDownloadUrlForLayer", "ecr:BatchGetImage"],
    "Resource": REPOSITORY_ARN,
}


@pytest.fixture(scope="module")
def emulator() -> Iterator[tuple[LocalAccess, str]]:
    access = LocalAccess(log=lambda line: None)
    server = EmbeddedEmulator(middleware=access.middleware)
    yield access, server.url
    server.stop()


@pytest.fixture(scope="module")
def published(emulator: tuple[LocalAccess, str], tmp_path_factory: pytest.TempPathFactory) -> str:
    """The image asset pushed (twice: the second finds it there), as local up does at start."""
    access, url = emulator
    out_dir = tmp_path_factory.mktemp("assembly")
    (out_dir / "asset.image").mkdir()
    (out_dir / "asset.image" / "Dockerfile").write_text("FROM python:3.12-slim\n")
    destination = {"repositoryName": "cdk-hnb659fds-container-assets-${AWS::AccountId}-${AWS::Region}",
                   "imageTag": TAG}  # fmt: skip
    assets = {"dockerImages": {TAG: {"source": {"directory": "asset.image"}, "destinations": {"d": destination}}}}
    (out_dir / "stack.assets.json").write_text(json.dumps(assets))
    ecr = client_as("ecr", url, access.developer, REGION)
    elsewhere = "public.ecr.aws/docker/library/python:3.12"
    assert publish_images(ecr, out_dir, [URI, elsewhere]) == [f"{REPOSITORY}:{TAG}"]
    assert publish_images(ecr, out_dir, [URI]) == []
    return url


def role(access: LocalAccess, name: str, *statements: dict[str, Any]) -> Credentials:
    document = {"Version": "2012-10-17", "Statement": list(statements)}
    return access.credentials_for(f"arn:aws:iam::123456789012:role/{name}", (document,))


def test_an_ecr_image_uri_is_parsed_into_registry_region_repository_and_tag() -> None:
    assert EcrImage.parse(URI) == EcrImage("123456789012", "us-east-1", REPOSITORY, TAG)
    assert EcrImage.parse("python:3.12-slim") is None
    assert EcrImage.parse(f"123456789012.dkr.ecr.us-east-1.amazonaws.com/{REPOSITORY}@sha256:{TAG}") is None


def test_the_execution_role_pulls_the_pushed_image(emulator: tuple[LocalAccess, str], published: str) -> None:
    access, url = emulator
    puller = role(access, "puller", TOKEN, LAYERS)
    assert pull_image(client_as("ecr", url, puller, REGION), URI, role=puller.arn) == EcrImage.parse(URI)


@pytest.mark.parametrize(
    ("kept", "denied"), [((LAYERS,), "ecr:GetAuthorizationToken"), ((TOKEN,), "ecr:BatchGetImage")]
)
def test_without_either_ecr_statement_the_pull_is_refused_naming_the_action(
    emulator: tuple[LocalAccess, str], published: str, kept: tuple[dict[str, Any], ...], denied: str
) -> None:
    access, url = emulator
    puller = role(access, f"without-{denied.split(':')[1]}", *kept)
    with pytest.raises(ImagePullError) as raised:
        pull_image(client_as("ecr", url, puller, REGION), URI, role=puller.arn)
    said = str(raised.value)
    assert said.startswith(f"CannotPullContainerError: {URI} as role {puller.arn}: AccessDenied"), said
    assert denied in said


def test_a_tag_never_pushed_is_not_pulled(emulator: tuple[LocalAccess, str], published: str) -> None:
    access, url = emulator
    puller = role(access, "puller-other-tag", TOKEN, LAYERS)
    other = URI.replace(TAG, "b" * 64)
    with pytest.raises(ImagePullError, match="ImageNotFound"):
        pull_image(client_as("ecr", url, puller, REGION), other, role=puller.arn)


def test_a_variant_start_pulls_before_it_downloads_and_fails_on_the_pull(
    emulator: tuple[LocalAccess, str], published: str, tmp_path: Path
) -> None:
    access, url = emulator
    # GIVEN a role that may read every object but not pull the image
    reader = role(access, "reader-only", {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*"})
    source = ContainerSource(url, REGION, reader.to_dict(), image=URI, model_data_url="s3://nowhere/model.tar.gz")
    # WHEN the variant starts THEN it fails on the pull, before any model download
    with pytest.raises(VariantStartError, match="ecr:GetAuthorizationToken"):
        prepare(source, tmp_path / "variant")
    assert not (tmp_path / "variant").exists()
