"""The assets of the cloud assembly `cdk synth` wrote (its `*.assets.json`), as `cdk deploy` publishes them: each
Docker image's tag (the asset hash) and the build context staged for it in cdk.out, and each file asset's object
key with the folder or file it is made from."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ImageAsset:
    tag: str  # the asset hash
    context: Path  # the staged build context in cdk.out
    dockerfile: str  # relative to the context
    platform: str = ""  # what `cdk deploy` builds it for (`linux/amd64`, `linux/arm64`); "" when undeclared


def image_assets(out_dir: Path) -> dict[str, ImageAsset]:
    """Every Docker image asset of the cloud assembly, by image tag."""
    found: dict[str, ImageAsset] = {}
    for assets_file in sorted(out_dir.glob("*.assets.json")):
        images = json.loads(assets_file.read_text(encoding="utf-8")).get("dockerImages", {})
        for asset_hash, entry in images.items():
            source = entry.get("source", {})
            if "directory" not in source:
                continue  # an image built by a command (executable): nothing staged to read
            for destination in entry.get("destinations", {}).values():
                tag = str(destination.get("imageTag", asset_hash))
                found[tag] = ImageAsset(
                    tag,
                    out_dir / str(source["directory"]),
                    str(source.get("dockerFile", "Dockerfile")),
                    str(source.get("platform", "")),
                )
    return found


def image_asset(out_dir: Path, image_uri: str) -> ImageAsset | None:
    """The asset an image URI of the templates names (by its tag), or None for an image from elsewhere."""
    _, _, tag = image_uri.rpartition(":")
    return image_assets(out_dir).get(tag) if "/" not in tag else None


def file_asset_sources(out_dir: Path) -> dict[str, Path]:
    """Every file asset of the cloud assembly: its S3 object key (`<hash>.zip`, what a template's `Code.S3Key`
    names) -> the folder or file it is made from (in cdk.out, or where the app staged it when bundling was
    skipped)."""
    found: dict[str, Path] = {}
    for assets_file in sorted(out_dir.glob("*.assets.json")):
        files = json.loads(assets_file.read_text(encoding="utf-8")).get("files", {})
        for entry in files.values():
            path = entry.get("source", {}).get("path")
            if path is None:
                continue
            for destination in entry.get("destinations", {}).values():
                key = destination.get("objectKey")
                if key:
                    found[str(key)] = out_dir / str(path)  # an absolute path stays itself
    return found
