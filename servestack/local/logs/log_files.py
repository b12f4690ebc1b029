"""One log file per child of `local up`, and `servestack local logs [DEPLOYMENT] [-f] [--since]` to read them.

Each child's output (a Lambda function's execution environment, an endpoint's router and its containers) goes
to `.servestack/logs/<deployment>/<child>.log`, each line prefixed with the UTC time it was read, as well as
to local up's own output (tagged `[deployment/child]`, as before). A new `local up` moves the files of the
previous one to `<child>.log.1`, so the lines of a run that crashed survive one restart. The files stay after
`local down`, as `docker compose logs` shows a stopped service's output.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, TextIO

from servestack.failures import CommandError, ExitCode

LOGS_DIR = "logs"
_UNSAFE = re.compile(r"[^A-Za-z0-9._/-]+")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def logs_dir(work: Path) -> Path:
    """`work` is the project's `.servestack` folder."""
    return work / LOGS_DIR


def child_log(work: Path, child_name: str) -> Path:
    """`.servestack/logs/<deployment>/<child>.log` for the child `deployment/child`."""
    safe = _UNSAFE.sub("_", child_name).strip("/.") or "child"
    return logs_dir(work) / f"{safe}.log"


def start_fresh(path: Path) -> Path:
    """A new run's file: the previous run's moves to `<name>.log.1` (replacing the one before)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.replace(path.with_name(path.name + ".1"))
    path.touch()
    return path


def stamp(now: float | None = None) -> str:
    moment = datetime.fromtimestamp(time.time() if now is None else now, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


class LineLog:
    """Appends stamped lines to one child's file (opened per child process; closed when its output ends)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file: IO[str] = path.open("a", encoding="utf-8", errors="replace")

    def write(self, text: str) -> None:
        self.file.write(f"{stamp()} {text}\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


# ------------------------------------------------------------------------------------------ reading


@dataclass(frozen=True)
class Line:
    at: datetime | None
    source: str  # deployment/child
    text: str
    raw_time: str


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """`--since`: a duration back from now (`90s`, `10m`, `2h`, `1d`) or a time (`2026-12-01T17:00:00`, UTC
    unless it names its zone)."""
    moment = now or datetime.now(UTC)
    found = _DURATION.match(text.strip())
    if found:
        return moment - timedelta(seconds=float(found.group(1)) * _UNITS[found.group(2)])
    try:
        parsed = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise CommandError(
            f"--since: {text!r} is neither a duration (30s, 10m, 2h, 1d) nor a time (2026-12-01T17:00:00Z)"
        ) from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _parse(line: str, source: str) -> Line:
    head, _, rest = line.partition(" ")
    try:
        at = datetime.fromisoformat(head.replace("Z", "+00:00"))
    except ValueError:
        return Line(None, source, line, "")
    return Line(at, source, rest, head)


def log_files(work: Path, deployment: str | None) -> dict[str, Path]:
    """`deployment/child` -> its current log file, of one deployment or of all."""
    root = logs_dir(work)
    base = root / deployment if deployment else root
    if not base.is_dir():
        return {}
    return {str(p.relative_to(root).with_suffix("")): p for p in sorted(base.rglob("*.log")) if p.is_file()}


def check_deployment(work: Path, deployment: str | None, known: list[str]) -> None:
    """A deployment name that neither serving.yaml nor the log folder knows: NOT_FOUND, naming the known ones."""
    if deployment is None or deployment in known or (logs_dir(work) / deployment).is_dir():
        return
    raise CommandError(
        f"{deployment}: not a deployment of this project ({', '.join(known) or 'serving.yaml has none'})",
        ExitCode.NOT_FOUND,
    )


def show(
    work: Path,
    deployment: str | None,
    *,
    follow: bool = False,
    since: datetime | None = None,
    tail: int | None = None,
    timestamps: bool = False,
    out: TextIO | None = None,
    poll_sec: float = 0.25,
    follow_for_sec: float | None = None,
) -> int:
    """Print the children's lines in time order (`[deployment/child] text`); with `follow`, keep printing new
    ones until interrupted (or `follow_for_sec`)."""
    sink = out or sys.stdout
    files = log_files(work, deployment)
    if not files and not follow:
        print(f"no logs yet under {logs_dir(work)}{'/' + deployment if deployment else ''}", file=sys.stderr)
        return 0
    lines: list[Line] = []
    offsets: dict[str, int] = {}
    for source, path in files.items():
        data = path.read_bytes()
        offsets[source] = len(data)
        lines += [_parse(text, source) for text in data.decode(errors="replace").splitlines()]
    lines.sort(key=lambda line: line.raw_time)  # stable: a file's own order holds within one millisecond
    if since is not None:
        lines = [line for line in lines if line.at is not None and line.at >= since]
    if tail is not None:
        lines = lines[-tail:] if tail > 0 else []
    for line in lines:
        sink.write(_shown(line, timestamps))
    sink.flush()
    if not follow:
        return 0
    deadline = None if follow_for_sec is None else time.monotonic() + follow_for_sec
    try:
        while deadline is None or time.monotonic() < deadline:
            time.sleep(poll_sec)
            for source, path in log_files(work, deployment).items():
                _follow_one(source, path, offsets, sink, timestamps)
    except KeyboardInterrupt:  # Ctrl-C is how `logs -f` ends
        return 0
    return 0


def _follow_one(source: str, path: Path, offsets: dict[str, int], sink: TextIO, timestamps: bool) -> None:
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return
    offset = offsets.get(source, 0)
    if size < offset:  # a new local up started the file again
        offset = 0
    if size == offset:
        return
    with path.open("rb") as handle:
        handle.seek(offset)
        data = handle.read()
    complete = data[: data.rfind(b"\n") + 1]  # a line being written is printed once whole
    offsets[source] = offset + len(complete)
    for text in complete.decode(errors="replace").splitlines():
        sink.write(_shown(_parse(text, source), timestamps))
    sink.flush()


def _shown(line: Line, timestamps: bool) -> str:
    when = f"{line.raw_time} " if timestamps and line.raw_time else ""
    return f"{when}[{line.source}] {line.text}\n"


__all__ = ["LineLog", "check_deployment", "child_log", "log_files", "parse_since", "show", "stamp", "start_fresh"]
