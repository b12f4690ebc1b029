"""The model registry as the CLI and `local up` use it: the emulator's registry URI and its seeding.

The store itself (S3 or a directory) is `servestack/adapters/aws/registry.py`, which the multi-model container runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from servestack.adapters.aws.registry import open_registry
from servestack.inference.registry import ModelRegistry

__all__ = ["LOCAL_BUCKET", "LOCAL_URI", "ensure_bucket", "open_registry", "seed", "seed_local"]

LOCAL_BUCKET = "servestack-registry"
LOCAL_URI = f"s3://{LOCAL_BUCKET}/models/"


def ensure_bucket(uri: str, s3: Any) -> None:
    """Create the registry's bucket on an emulator when it does not exist yet (`local up`)."""
    parsed = urlsplit(uri)
    if parsed.scheme != "s3":
        return
    try:
        s3.head_bucket(Bucket=parsed.netloc)
    except Exception:
        s3.create_bucket(Bucket=parsed.netloc)


def seed(registry: ModelRegistry, packages: list[Path]) -> list[str]:
    """Push bundled packages (unchanged bytes are no-ops) and point `live` at each model's first one."""
    lines: list[str] = []
    for package in packages:
        pushed = registry.push_package(package)
        name = pushed.manifest.name
        if "live" not in registry.aliases(name):
            registry.promote(name, pushed.manifest.version)
        lines.append(f"{pushed.manifest.key} ({'pushed' if pushed.created else 'present'})")
    return lines


def seed_local(s3: Any, spec: Any, artifacts: Path, uri: str = LOCAL_URI) -> str:
    """`local up`: the emulator's registry holding every model of serving.yaml (`live` -> its version), and
    every other package in `artifacts` (what `servestack models push` wrote there), so that pushed versions
    outlive a restart of the emulator."""
    ensure_bucket(uri, s3)
    from servestack.inference.errors import ServingError

    registry = open_registry(uri, client=s3)
    declared = [artifacts / m.name / m.version for m in spec.models]
    seed(registry, declared)
    for package in sorted(path.parent for path in artifacts.glob("*/*/manifest.json")):
        if package not in declared:
            try:
                seed(registry, [package])
            except ServingError as error:  # a package serving.yaml does not use must not stop local up
                print(f"registry: skipped {package}: {error.message}", flush=True)
    return uri
