"""The Docker image assets of the cloud assembly `cdk synth` wrote: each image's tag (the asset hash) and the
build context staged for it in cdk.out (its `*.assets.json`), as `cdk deploy` publishes them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ImageAsset:
    tag: str  # the asset hash
    context: Path  # the staged build context in cdk.out
    dockerfile: str  # relative to the context


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
                    tag, out_dir / str(source["directory"]), str(source.get("dockerFile", "Dockerfile"))
                )
    return found


def image_asset(out_dir: Path, image_uri: str) -> ImageAsset | None:
    """The asset an image URI of the templates names (by its tag), or None for an image from elsewhere."""
    _, _, tag = image_uri.rpartition(":")
    return image_assets(out_dir).get(tag) if "/" not in tag else None
