"""What `local up` hands its children: a project's paths, the environment without the caller's identity, and the
commands it prints for the developer to run."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from servestack.local.hosting import REPO_ROOT
from servestack.local.iam import Credentials
from servestack.local.planning import map_paths as map_paths  # its home is planning/; tests import it here

# ------------------------------------------------------------------------------------------ helpers


def project_of(spec_path: Path | None) -> Path:
    """serving.yaml: the given one, else the nearest in this folder or above, else servestack's own."""
    if spec_path is not None:
        return spec_path.resolve()
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / "serving.yaml").is_file():
            return folder / "serving.yaml"
    return REPO_ROOT / "serving.yaml"


def base_environment() -> dict[str, str]:
    """This process's environment without the caller's own AWS identity (children get their role's)."""
    dropped = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
               "AWS_DEFAULT_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_ENDPOINT_URL")  # fmt: skip
    return {k: v for k, v in os.environ.items() if k not in dropped} | {"PYTHONUNBUFFERED": "1"}


def curl_sigv4(url: str, region: str, developer: Credentials, sample: Path | None) -> str:
    data = f" -H 'Content-Type: application/json' --data @{shown(sample)}" if sample else ""
    method = " -X POST" if sample else ""
    user = f"{developer.access_key_id}:{developer.secret_access_key}"
    return f"curl -s --aws-sigv4 'aws:amz:{region}:execute-api' --user '{user}'{method} {url}{data}"


def shown(path: Path) -> str:
    relative = path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path
    return shlex.quote(str(relative))


def self_command() -> str:
    """How this CLI was started, so the printed command works without an activated venv."""
    argv0 = Path(sys.argv[0])
    if argv0.name == "servestack" and argv0.exists():
        return shown(argv0.resolve()) if not argv0.is_absolute() else shlex.quote(str(argv0))
    return f"{shlex.quote(sys.executable)} -m servestack.cli"
