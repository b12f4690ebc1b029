"""What `local run-batch` prints once a run has written its manifest, whichever engine ran it."""

from __future__ import annotations

import json
from typing import Any


def print_manifest(session: Any, config: Any, about: dict[str, Any], manifest_url: str) -> None:
    """The manifest's location, then a one-line summary read back from the emulator (rows, parts, model)."""
    print(manifest_url)
    bucket, _, key = manifest_url.removeprefix("s3://").partition("/")
    s3 = session.client("s3", endpoint_url=about["endpoint_url"], config=config)
    manifest = json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    print(json.dumps({"rows": manifest["rows"], "parts": len(manifest["parts"]), "model": manifest["model"]}))
