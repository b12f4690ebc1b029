"""`servestack local up`'s options, its default ports and its error."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_PORT = 8080
DEFAULT_AWS_PORT = 8090


@dataclass
class UpOptions:
    spec_path: Path | None = None
    port: int | None = None  # the first realtime endpoint's container port
    aws_port: int | None = None
    emulator_port: int = 0
    endpoint_url: str | None = None
    state_path: Path | None = None
    workers: int = 1
    fresh: bool = False
    data_dir: Path | None = None  # the emulator's saved state (default: .servestack/emulator in the project)
    iam: bool = True
    explain: bool = False
    resynth: bool = False
    visibility_timeout_sec: int | None = None
    allow_reset: bool = False  # moto's admin API (`/moto-api/reset` ...) on the emulator port: refused unless set


class UpError(RuntimeError):
    """A problem local up reports in one line, with what to do (exit code 2)."""
