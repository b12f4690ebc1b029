"""The commands the banner shows for trying a service: paths as the developer types them, a SigV4-signed curl,
and this CLI as it was started."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from servestack.local.iam import Credentials


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
    return f"{shlex.quote(sys.executable)} -m servestack.cli.main"
