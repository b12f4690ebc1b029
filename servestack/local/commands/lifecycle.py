"""`local up --detach`, `local status` and `local down`: local mode's lifecycle, as `docker compose` has it.

- Children start together; each one that fails to start (exits, or does not answer in time) is reported on
  its own line with the last lines of its log file, is left to the supervisor's restarts, and the rest run.
- `local up --detach` starts `local up` itself in a new session (so the terminal's Ctrl-C and hangup do not
  reach it), its output in `.servestack/local-up.log`, and returns once the state file that process writes
  says everything is ready; if it exits first, the log's last lines say why and its exit code is ours.
- `local status` reads the state file and asks each child whether it answers, each endpoint's router which
  version it serves, and the emulator's CloudWatch the state of each alarm local mode evaluates (a batch
  deployment's failure alarm), evaluating it first as CloudWatch does every period
  (servestack/local/cloudwatch/alarms.py).
- `local down` sends SIGTERM to local up, which stops its children, saves the emulator's state and removes its
  state file; what `local deploy` left live and the emulator's data stay for the next start.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from servestack.failures import CommandError, ExitCode, NotRunning
from servestack.local.emulator import state
from servestack.local.hosting import http_status
from servestack.progress import Progress

UP_LOG = "local-up.log"
TAIL_LINES = 12
READY_TIMEOUT_SEC = 300
OUTPUT_DRAIN_SEC = 5.0


def tail(path: Path | None, lines: int = TAIL_LINES) -> list[str]:
    if path is None:
        return []
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    return text.splitlines()[-lines:]


# ------------------------------------------------------------------------------------------ children starting


def start_children(children: Sequence[Any], progress: Progress, notices: list[str], timeout_sec: float = 180) -> None:
    """Start every child, then wait until each answers. A child that exits or does not answer in time is
    reported (a notice with its log's last lines) and left to the supervisor; the others keep running."""
    with progress.step("children starting", f"0/{len(children)} ready") as step:
        for child in children:
            child.start()
        waiting = list(children)
        failed: list[str] = []
        deadline = time.monotonic() + timeout_sec
        while waiting:
            for child in list(waiting):
                if child.process.poll() is not None:
                    why = f"exited with code {child.process.returncode} while starting"
                    # Its last lines say why, and its output pump may not have written them to the log yet
                    # when the exit is seen here: they are waited for (the pump ends at the end of its output).
                    drain_output(child)
                elif time.monotonic() > deadline:
                    why = f"not ready after {timeout_sec:.0f}s ({child.ready_url})"
                elif child.ready():
                    waiting.remove(child)
                    continue
                else:
                    continue
                waiting.remove(child)
                failed.append(child.name)
                log = getattr(child, "log_path", None)
                lines = "".join(f"\n    {line}" for line in tail(log))
                notice = f"{child.name}: failed to start: {why}; the others keep running. The end of {log}:{lines}"
                notices.append(notice)
                step.note(notice)
            if waiting:
                ready = len(children) - len(waiting) - len(failed)
                names = ", ".join(child.name for child in waiting[:3]) + (" ..." if len(waiting) > 3 else "")
                step.update(f"{ready}/{len(children)} ready; waiting for {names}")
                time.sleep(0.1)
        failures = f", {len(failed)} failed" if failed else ""
        step.finish(f"{len(children) - len(failed)}/{len(children)} ready{failures}")


def drain_output(child: Any, timeout_sec: float = OUTPUT_DRAIN_SEC) -> None:
    """Wait until what an exited child wrote has reached its log: its output pumps end at the end of its
    output, at once for a child that is gone (unless something it started still holds its output open: then
    no longer than `timeout_sec`)."""
    deadline = time.monotonic() + timeout_sec
    for thread in getattr(child, "threads", ()):
        thread.join(timeout=max(0.0, deadline - time.monotonic()))


def child_processes(children: Sequence[Any], deployments: dict[str, dict[str, Any]]) -> None:
    """Each deployment's children in its state entry: name, ready URL, log file (for `local status`)."""
    for child in children:
        deployment = child.name.split("/", 1)[0]
        entry = deployments.get(deployment)
        if entry is None:
            continue
        log = getattr(child, "log_path", None)
        entry.setdefault("processes", {})[child.name] = {
            "ready_url": child.ready_url,
            "ready_status": child.ready_status,
            "log": str(log) if log is not None else None,
        }


# ------------------------------------------------------------------------------------------ detach


def running_pid(state_path: Path) -> int | None:
    """The pid of the local up behind `state_path`, when it is alive."""
    try:
        about = state.read(state_path)
    except NotRunning:
        return None
    pid = about.get("pid")
    return pid if isinstance(pid, int) else None


def detach(argv: list[str], state_path: Path, log_path: Path, timeout_sec: float = READY_TIMEOUT_SEC) -> int:
    """`local up` (`argv`, without --detach) in the background; returns once its state file says it is ready."""
    already = running_pid(state_path)
    if already is not None:
        raise CommandError(
            f"local up is already running (process {already}, {state_path}): `servestack local status` shows it, "
            "`servestack local down` stops it"
        )
    log_path.parent.mkdir(parents=True, exist_ok=True)
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=environment,
            start_new_session=True,
        )  # fmt: skip
    progress = Progress()
    relayed: int | None = 0
    with (
        progress.step("local up (detached)", f"log: {log_path}", heartbeat=False) as step,
        _stopped_if_interrupted(process),
    ):
        deadline = time.monotonic() + timeout_sec
        while True:
            code = process.poll()
            relayed = _relay(log_path, relayed, step)
            if code is not None:
                for line in tail(log_path, 20):
                    print(f"  {line}", file=sys.stderr)
                known = {int(c) for c in ExitCode}
                raise CommandError(
                    f"local up exited with code {code} while starting; its log, ending above: {log_path}",
                    ExitCode(code) if code in known and code != 0 else ExitCode.FAILED,
                )
            about = _state_of(state_path)
            if about is not None and about.get("pid") == process.pid:
                break
            if time.monotonic() > deadline:
                process.send_signal(signal.SIGTERM)
                raise CommandError(f"local up not ready after {timeout_sec:.0f}s; its log: {log_path}", ExitCode.FAILED)
            time.sleep(0.2)
        step.finish(f"ready, process {process.pid}")
    for notice in about.get("notices") or []:
        print(notice, file=sys.stderr)
    print_status(about, sys.stdout)
    print(
        f"\nlocal up runs in the background (process {process.pid}); its output: {log_path}\n"
        "servestack local status | local logs [DEPLOYMENT] -f | local down",
        flush=True,
    )
    return 0


@contextmanager
def _stopped_if_interrupted(process: subprocess.Popen[bytes]) -> Iterator[None]:
    """Ctrl-C while waiting stops the half-started local up too, rather than leaving it behind."""
    try:
        yield
    except KeyboardInterrupt:
        process.send_signal(signal.SIGTERM)
        raise


def _state_of(path: Path) -> dict[str, Any] | None:
    try:
        loaded: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return loaded


def _relay(log_path: Path, offset: int | None, step: Any) -> int | None:
    """local up's own new lines of its log (its progress; not its children's `[name] ...` lines, nor the banner),
    shown by `step`; returns the offset read up to, None once the banner is reached (nothing more to relay)."""
    if offset is None:
        return None
    try:
        with log_path.open("rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except OSError:
        return offset
    complete = data[: data.rfind(b"\n") + 1]
    for raw in complete.decode(errors="replace").splitlines():
        line = raw.rstrip()
        if line.startswith("aws emulator: "):  # the banner: the status table stands for it
            return None
        if line and not line.startswith("["):
            step.relay(line)
    return offset + len(complete)


# ------------------------------------------------------------------------------------------ down


def down(state_path: Path, timeout_sec: float = 90) -> int:
    """SIGTERM to local up, then wait for it to stop (its children first, then its last save)."""
    try:
        about = state.read(state_path)
    except NotRunning:
        print(
            f"servestack local down: local up is not running (no live process behind {state_path}); nothing to stop",
            file=sys.stderr,
        )
        return 0
    pid = int(about["pid"])
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return 0
    progress = Progress()
    with progress.step("local down", f"stopping process {pid}") as step:
        deadline = time.monotonic() + timeout_sec
        while _alive(pid):
            if time.monotonic() > deadline:
                raise CommandError(
                    f"local up (process {pid}) still runs {timeout_sec:.0f}s after SIGTERM; `kill -9 {pid}` stops it",
                    ExitCode.FAILED,
                )
            time.sleep(0.2)
        step.finish("stopped; the emulator's data and local releases are kept (local up --fresh starts empty)")
    print("stopped", flush=True)
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # an exited process its parent has not reaped yet (a zombie) is gone for our purpose
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # no /proc (macOS): signal 0 is the answer
        return True
    return stat.rpartition(")")[2].split()[0] != "Z"


# ------------------------------------------------------------------------------------------ status


def deployment_rows(about: dict[str, Any], spec_versions: dict[str, str]) -> list[dict[str, Any]]:
    """One row per deployment: mode, state (from its processes' answers), URL, version served, restarts, and the
    alarms local mode evaluates with their states."""
    rows = []
    alarms = _alarms(about)
    for name, entry in about.get("deployments", {}).items():
        processes: dict[str, Any] = entry.get("processes") or {}
        down_ones = [child for child, p in processes.items() if not _answers(p.get("ready_url"), p.get("ready_status"))]
        state_text = "running" if not down_ones else ("down" if len(down_ones) == len(processes) else "degraded")
        if not processes:
            state_text = "idle" if entry.get("mode") == "batch" else "running"
        metrics = _router_metrics(about, entry)
        version = _served_version(metrics) or spec_versions.get(name, "?")
        rows.append(
            {
                "deployment": name,
                "mode": entry.get("mode", "?"),
                "state": state_text,
                "url": entry.get("url") or _batch_where(entry),
                "version": version,
                "restarts": _restarts(about, name, metrics),
                "not_answering": down_ones,
                "alarms": [alarms.get(a["name"], {"name": a["name"], "state": "?"}) for a in entry.get("alarms") or []],
            }
        )
    return rows


def _alarms(about: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each evaluated alarm's state on the emulator, by name, after its evaluation; none when the emulator does not
    answer (the rows then say `?`)."""
    from servestack.local.cloudwatch import AlarmDef, alarm_states, evaluate_alarms
    from servestack.local.emulator import client_as, developer

    entries = about.get("deployments", {}).values()
    defined = [AlarmDef.from_dict(alarm) for entry in entries for alarm in entry.get("alarms") or []]
    if not defined:
        return {}
    region = str(about.get("region") or "us-east-1")
    cloudwatch = client_as("cloudwatch", str(about.get("endpoint_url")), developer(about), region)
    sqs = client_as("sqs", str(about.get("endpoint_url")), developer(about), region)  # dead-letter queues' depth
    try:
        evaluate_alarms(cloudwatch, defined, sqs=sqs)
        return {state["name"]: state for state in alarm_states(cloudwatch, [a.name for a in defined])}
    except Exception:  # the emulator is down or busy: its alarms are unknown, which the row says
        return {}


def _alarm_cell(alarms: list[dict[str, Any]]) -> str:
    """The worst state of a deployment's alarms (ALARM over INSUFFICIENT_DATA over OK), `-` without any."""
    states = [str(a.get("state")) for a in alarms]
    return next((s for s in ("ALARM", "?", "INSUFFICIENT_DATA", "OK") if s in states), "-")


def _answers(url: str | None, wanted: int | None) -> bool:
    if not url:
        return True
    status = http_status(url, timeout_sec=1.0)
    return status is not None and (wanted is None or status == wanted)


def _router_metrics(about: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any] | None:
    """A realtime endpoint's router metrics, from its control port (the admin routes answer only there, and only
    to the developer's signature)."""
    control_url = entry.get("control_url")
    if entry.get("mode") != "realtime" or not control_url:
        return None
    from servestack.local.emulator import control, developer

    region = str(about.get("region") or "us-east-1")
    try:
        status, metrics = control("GET", f"{control_url}/_servestack/metrics", developer(about), region, timeout_sec=2)
    except OSError:
        return None
    return metrics if status == 200 and isinstance(metrics, dict) else None


def _served_version(metrics: dict[str, Any] | None) -> str | None:
    """A realtime endpoint's live version, from its router (`model@version` of the variants taking traffic)."""
    if metrics is None:
        return None
    served = sorted({str(v["model"]).rpartition("@")[2] for v in metrics.get("variants", {}).values() if "model" in v})
    return ",".join(served) or None


def _restarts(about: dict[str, Any], name: str, metrics: dict[str, Any] | None) -> int:
    """Restarts of a deployment's children: local up's supervisor counts its own children (the state file's
    `restarts`, by child `<deployment>/<child>`), an endpoint's router its variants' containers (its metrics)."""
    counted = about.get("restarts") or {}
    total = sum(n for child, n in counted.items() if str(child).split("/", 1)[0] == name and isinstance(n, int))
    if metrics is not None:
        variants = metrics.get("variants") or {}
        total += sum(v.get("restarts", 0) for v in variants.values() if isinstance(v.get("restarts", 0), int))
    return total


def _batch_where(entry: dict[str, Any]) -> str:
    bucket = entry.get("input", {}).get("bucket") or entry.get("bucket")
    prefix = entry.get("input_prefix") or entry.get("input", {}).get("input_prefix") or ""
    return f"s3://{bucket}/{prefix}" if bucket else ""


def spec_versions(about: dict[str, Any]) -> dict[str, str]:
    """serving.yaml's pinned version of each deployment (what its Lambda functions serve)."""
    try:
        from servestack.spec import load_spec

        spec = load_spec(Path(about["spec"]), check_artifacts=False)
    except Exception:  # serving.yaml changed under a running local up: its versions are unknown, not an error
        return {}
    return {name: str(spec.model(d.model, d.version).version) for name, d in spec.deployments.items()}


def status(state_path: Path, out: TextIO, as_json: bool = False) -> int:
    about = state.read(state_path)
    if as_json:
        rows = deployment_rows(about, spec_versions(about))
        out.write(json.dumps({"pid": about.get("pid"), "deployments": rows}, indent=2) + "\n")
        return 0
    print_status(about, out)
    return 0


def print_status(about: dict[str, Any], out: TextIO) -> None:
    rows = deployment_rows(about, spec_versions(about))
    headers = ("DEPLOYMENT", "MODE", "STATE", "URL", "VERSION", "RESTARTS", "ALARM")
    cells = [
        (r["deployment"], r["mode"], r["state"], r["url"], r["version"], str(r["restarts"]), _alarm_cell(r["alarms"]))
        for r in rows
    ]
    if out.isatty():
        from rich.console import Console
        from rich.table import Table

        table = Table(*headers, box=None, header_style="bold")
        for row in cells:
            table.add_row(*row)
        Console(file=out, highlight=False).print(table)
    else:
        widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
        for row in (headers, *cells):
            out.write("  ".join(value.ljust(widths[i]) for i, value in enumerate(row)).rstrip() + "\n")
    for r in rows:
        for child in r["not_answering"]:
            out.write(f"{child}: not answering; `servestack local logs {r['deployment']}` shows why\n")
        for alarm in r["alarms"]:
            if alarm.get("state") == "ALARM":
                out.write(f"{alarm['name']}: ALARM since {alarm.get('since')}: {alarm.get('reason')}\n")
    out.write(f"aws apis: {about.get('aws_api_url')}  emulator: {about.get('endpoint_url')}  pid: {about.get('pid')}\n")
    out.flush()


__all__ = ["UP_LOG", "detach", "down", "print_status", "running_pid", "start_children", "status", "tail"]
