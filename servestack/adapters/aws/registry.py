"""The model registry on S3 (or the local emulator's S3, or a directory): `open_registry(uri)` for every caller.

URIs: `s3://bucket/prefix/` (boto3 honours `AWS_ENDPOINT_URL`, which `local up` sets to its emulator), or a
local directory (`/path`, `file:///path`). The layout below the prefix is `servestack/inference/registry.py`'s:
`<name>/<version>/{model.onnx,manifest.json}` and `<name>/aliases.json`. The multi-model container reads it
at run time (servestack/adapters/app.py); the CLI pushes and promotes through the same code (servestack/registry.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from servestack.inference.errors import RegistryError
from servestack.inference.registry import DirectoryStore, ModelRegistry


class S3Store:
    """An `ObjectStore` on an S3 bucket and key prefix."""

    def __init__(self, bucket: str, prefix: str = "", client: Any = None, endpoint_url: str | None = None) -> None:
        if client is None:
            from servestack.adapters.aws.clients import aws_client

            client = aws_client("s3", endpoint_url=endpoint_url)
        self.client = client
        self.bucket = bucket
        self.root = prefix
        self.uri = f"s3://{bucket}/{prefix}"

    def read(self, key: str) -> bytes | None:
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self.root + key)
        except self.client.exceptions.NoSuchKey:
            return None
        data: bytes = response["Body"].read()
        return data

    def write(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self.root + key, Body=data)

    def keys(self, prefix: str) -> list[str]:
        found: list[str] = []
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.root + prefix)
        for page in pages:
            found += [item["Key"][len(self.root) :] for item in page.get("Contents", [])]
        return found


def open_registry(uri: str, *, endpoint_url: str | None = None, client: Any = None) -> ModelRegistry:
    """The registry at `uri`; the error lists the accepted forms."""
    parsed = urlsplit(uri)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise RegistryError(
                f"registry: {uri!r} has no bucket", field="registry", value=uri, allowed="s3://bucket/prefix/"
            )
        prefix = parsed.path.lstrip("/")
        prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
        return ModelRegistry(S3Store(parsed.netloc, prefix, client=client, endpoint_url=endpoint_url), prefix="")
    if parsed.scheme in ("", "file"):
        return ModelRegistry(DirectoryStore(Path(parsed.path if parsed.scheme else uri)), prefix="")
    raise RegistryError(
        f"registry: {uri!r} is not a registry URI",
        field="registry",
        value=uri,
        allowed="s3://bucket/prefix/, file:///path or a directory path",
    )
