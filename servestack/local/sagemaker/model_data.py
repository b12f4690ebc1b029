"""A SageMaker model's data as SageMaker gets it: published where the template says, then fetched with the
model's execution role and unpacked under the container's `/opt/ml/model`.

`cdk deploy` publishes each file asset to the bucket and key its `*.assets.json` names (the bootstrap assets
bucket, `cdk-<qualifier>-assets-<account>-<region>`); `publish_model_data` does the same on the emulator, as
the developer (the deploying identity). When SageMaker starts a variant, it downloads `ModelDataUrl` with the
execution role of the `AWS::SageMaker::Model` and extracts the `model.tar.gz` into `/opt/ml/model`; a
`ModelDataSource` with `S3DataType: S3Prefix` and `CompressionType: None` is copied key by key instead.
`fetch_model_data` does that with the role's keys, into a local root per variant, so a template whose role
cannot read the object fails here as it fails there.
"""

from __future__ import annotations

import json
import shutil
import tarfile
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# SageMaker's failure reason when a model's data cannot be downloaded (DescribeEndpoint's FailureReason).
DOWNLOAD_FAILED = (
    'Failed to download model data for container "container_1" from URL: "{url}". Please ensure that there is '
    "an object located at the URL and that the role passed to CreateModel has permissions to download the object."
)


class ModelDataError(RuntimeError):
    """The model data could not be fetched or unpacked; the message says which URL, as whom, and why."""


def split_s3_url(url: str) -> tuple[str, str]:
    if not url.startswith("s3://"):
        raise ModelDataError(f"model data {url!r} is not an s3:// URL")
    bucket, _, key = url.removeprefix("s3://").partition("/")
    return bucket, key


def _code(error: Exception) -> str:
    return str(getattr(error, "response", {}).get("Error", {}).get("Code", type(error).__name__))


def _message(error: Exception) -> str:
    return str(getattr(error, "response", {}).get("Error", {}).get("Message", error))


def file_assets(out_dir: Path) -> dict[str, Path]:
    """Each file asset's S3 object key -> its file in the cloud assembly (templates themselves left out)."""
    found: dict[str, Path] = {}
    for assets_file in sorted(out_dir.glob("*.assets.json")):
        files = json.loads(assets_file.read_text(encoding="utf-8")).get("files", {})
        for entry in files.values():
            source = out_dir / str(entry["source"]["path"])
            if source.suffix == ".json" or not source.is_file():
                continue  # templates; directory assets (Lambda bundles: not built when bundling is skipped)
            for destination in entry.get("destinations", {}).values():
                found[str(destination["objectKey"])] = source
    return found


def model_data_urls(topologies: Iterable[Any]) -> list[str]:
    """The single-model data URLs of every SageMaker container the topologies run (variants, shadows,
    inference components, transform jobs); multi-model prefixes are the registry's, not assets."""
    urls = []
    for topology in topologies:
        for endpoint in topology.endpoints.values():
            for hosted in (*endpoint.variants, *endpoint.shadow_variants, *endpoint.components):
                container = hosted.container
                if container is not None and container.model_data_url and container.mode != "MultiModel":
                    urls.append(container.model_data_url)
        urls += [t.container.model_data_url for t in topology.transforms if t.container.model_data_url]
    return urls


def publish_model_data(s3: Any, out_dir: Path, urls: Iterable[str]) -> list[str]:
    """Upload the file assets the model data `urls` name to the bucket and key in each URL (creating the
    bucket, which `cdk bootstrap` creates in an account), unless already there. Returns what was uploaded."""
    assets = file_assets(out_dir)
    uploaded = []
    for url in sorted(set(urls)):
        bucket, key = split_s3_url(url)
        source = assets.get(key)
        if source is None:
            continue  # not an asset of this assembly (a registry prefix, a bucket the user fills)
        try:
            s3.head_object(Bucket=bucket, Key=key)
            continue  # asset keys are content hashes: same key, same bytes
        except Exception as error:
            if _code(error) not in ("404", "NoSuchKey", "NotFound", "NoSuchBucket"):
                raise
        try:
            s3.head_bucket(Bucket=bucket)
        except Exception as error:
            if _code(error) not in ("404", "NoSuchBucket", "NotFound"):
                raise
            s3.create_bucket(Bucket=bucket)
        s3.upload_file(str(source), bucket, key)
        uploaded.append(url)
    return uploaded


def fetch_model_data(s3: Any, url: str, model_dir: Path, *, role: str, compressed: bool = True) -> Path:
    """SageMaker's download of `url` into `model_dir` (emptied first) with the client `s3`, signed as the
    execution role named `role`: a `model.tar.gz` object extracted, or (`compressed=False`) every object
    under an S3 prefix copied. Raises ModelDataError with SageMaker's failure reason and the S3 error."""
    bucket, key = split_s3_url(url)
    if model_dir.exists():
        shutil.rmtree(model_dir)
    model_dir.mkdir(parents=True)
    try:
        if compressed and not key.endswith("/"):
            with tempfile.TemporaryDirectory(prefix="model-data-") as scratch:
                archive = Path(scratch) / "model.tar.gz"
                _download(s3, bucket, key, archive)
                with tarfile.open(archive) as tar:
                    tar.extractall(model_dir, filter="data")  # refuses absolute paths, `..` and links out
        else:
            prefix = key if key.endswith("/") or not key else key + "/"
            pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            for page in pages:
                for item in page.get("Contents", []):
                    relative = str(item["Key"])[len(prefix) :]
                    if not relative or relative.endswith("/"):
                        continue
                    target = (model_dir / relative).resolve()
                    if not target.is_relative_to(model_dir.resolve()):
                        raise ModelDataError(f"{url}: key {item['Key']} would land outside {model_dir}")
                    target.parent.mkdir(parents=True, exist_ok=True)
                    _download(s3, bucket, str(item["Key"]), target)
    except ModelDataError:
        raise
    except (tarfile.TarError, OSError) as error:
        raise ModelDataError(f"{DOWNLOAD_FAILED.format(url=url)} ({type(error).__name__}: {error})") from None
    except Exception as error:
        code = _code(error)
        if code == type(error).__name__ and not hasattr(error, "response"):
            raise
        raise ModelDataError(f"{DOWNLOAD_FAILED.format(url=url)} As role {role}: {code}: {_message(error)}") from None
    return model_dir


def _download(s3: Any, bucket: str, key: str, target: Path) -> None:
    """GetObject streamed to `target` (not boto3's download_file: its HeadObject answers a denial with a bare
    403, where GetObject's error names the action and the resource, as AWS's does)."""
    body = s3.get_object(Bucket=bucket, Key=key)["Body"]
    with target.open("wb") as out:
        for chunk in iter(lambda: body.read(1 << 20), b""):
            out.write(chunk)
