"""What `local up` hands its children: a project's paths, and the environment without the caller's identity."""

from __future__ import annotations

import os
from pathlib import Path

from servestack.local.planning import map_paths as map_paths  # its home is planning/; tests import it here

# ------------------------------------------------------------------------------------------ helpers


def project_of(spec_path: Path | None) -> Path | None:
    """serving.yaml: the given one, else the nearest in this folder or above; None when there is none."""
    if spec_path is not None:
        return spec_path.resolve()
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / "serving.yaml").is_file():
            return folder / "serving.yaml"
    return None


def base_environment() -> dict[str, str]:
    """This process's environment without the caller's own AWS identity (children get their role's) and
    endpoint (children get local up's)."""
    from servestack.local.hosting import without_identity

    kept = without_identity(os.environ)
    kept.pop("AWS_ENDPOINT_URL", None)
    return kept | {"PYTHONUNBUFFERED": "1"}
