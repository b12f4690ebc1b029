"""boto3 clients as every handler builds them."""

from __future__ import annotations

from typing import Any

import boto3
from botocore.config import Config


def aws_client(service: str, *, endpoint_url: str | None = None) -> Any:
    """A boto3 client honouring AWS_ENDPOINT_URL (an emulator), with botocore's `standard` retry mode and
    path-style S3 addressing, so any endpoint host works."""
    config = Config(s3={"addressing_style": "path"}, retries={"mode": "standard"})
    return boto3.client(service, endpoint_url=endpoint_url, config=config)
