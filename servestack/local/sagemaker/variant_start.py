"""What SageMaker does with a model's execution role before one of its containers runs: pull the image
(servestack/local/ecr/images.py), then download the model data into the container's `/opt/ml/model`
(servestack/local/sagemaker/model_data.py). `local up` does it for each variant it starts, and the endpoint's router
for each green fleet a rehearsal starts (servestack/local/sagemaker/rehearsal.py), with the same `ContainerSource`:
what the template's `AWS::SageMaker::Model` says (image, ModelDataUrl, role) and the role's keys. A start
that one of them refuses fails with the error AWS gives (an AccessDenied naming the action).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from servestack.local.ecr import ImagePullError, pull_image
from servestack.local.sagemaker.model_data import ModelDataError, fetch_model_data

CONTAINER_MODEL_DIR = "/opt/ml/model"  # where SageMaker unpacks the model data in the container


class VariantStartError(RuntimeError):
    """The container could not start: its image pull or its model download was refused or failed."""


@dataclass(frozen=True)
class ContainerSource:
    """Where a SageMaker container comes from, and as whom it is fetched."""

    endpoint_url: str  # the emulator
    region: str
    credentials: dict[str, str]  # the execution role's keys (Credentials.to_dict())
    image: str | None = None  # an image URI published to the emulator's ECR (None: not pulled)
    model_data_url: str | None = None  # a single model's data (None: no download)
    model_version: str | None = None  # the version that data holds

    @property
    def role(self) -> str:
        return self.credentials["arn"]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, entry: dict[str, Any]) -> ContainerSource:
        return cls(**entry)

    def holds(self, version: str) -> bool:
        """Whether its ModelDataUrl holds `version` (a rehearsal of another version gets it elsewhere)."""
        return self.model_data_url is not None and self.model_version == version

    def client(self, service: str) -> Any:
        from servestack.local.emulator import client_as
        from servestack.local.iam import Credentials

        return client_as(service, self.endpoint_url, Credentials.from_dict(self.credentials), self.region)


def model_dir_under(root: Path) -> Path:
    """A container's `/opt/ml/model` under the local root standing for its instance's file system."""
    return root / CONTAINER_MODEL_DIR.lstrip("/")


def prepare(source: ContainerSource, model_root: Path | None) -> Path | None:
    """Pull the image, then (`model_root` given, and the source has model data) download and unpack the model
    data into `model_root`'s /opt/ml/model, both with the execution role; returns that model directory."""
    try:
        if source.image is not None:
            pull_image(source.client("ecr"), source.image, role=source.role)
        if model_root is None or source.model_data_url is None:
            return None
        url = source.model_data_url
        return fetch_model_data(
            source.client("s3"), url, model_dir_under(model_root), role=source.role, compressed=not url.endswith("/")
        )
    except (ImagePullError, ModelDataError) as error:
        raise VariantStartError(str(error)) from None
