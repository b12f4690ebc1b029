"""`servestack local deploy NAME --version V [--component C]`: rehearse a blue/green release on the running
`local up`; on an endpoint hosting inference components, of one component (`C`: its name in serving.yaml or the
template's), the others untouched.

The deployment's router runs the rehearsal (servestack/local/sagemaker/rehearsal.py); this command starts it, sends
the deployment's sample request at `--traffic-rps` meanwhile (alarms only see traffic that exists), prints
the timeline as it happens, and writes the outcome as JSON: the router's view (strategy, alarms, the alarm
that fired, per-side metrics, timeline) plus the client's view (requests and failures per window).
Exit status: 0 when the new version went live, 1 when it was rolled back, 2 when it could not run.
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servestack.failures import CommandError, ExitCode
from servestack.local.emulator import state
from servestack.local.sagemaker import Faults
from servestack.project import STATE_DIR, project_or_cwd

# Requests in flight when a window opens or closes may land on either side of the boundary.
TOLERANCE_REQUESTS = 3


@dataclass
class Traffic:
    """Sample requests at a steady rate from a few threads, each on a keep-alive connection."""

    url: str
    body: bytes
    rate: float
    threads: int = 4
    headers: dict[str, str] = field(default_factory=dict)
    records: list[tuple[float, int, str]] = field(default_factory=list)  # (sent at, status, variant)
    _stop: threading.Event = field(default_factory=threading.Event)
    _workers: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        if self.rate <= 0:
            return
        for index in range(self.threads):
            worker = threading.Thread(target=self._run, args=(index,), name=f"traffic-{index}", daemon=True)
            worker.start()
            self._workers.append(worker)

    def stop(self) -> None:
        self._stop.set()
        for worker in self._workers:
            worker.join(timeout=10)

    def _run(self, index: int) -> None:
        parsed = urllib.parse.urlsplit(self.url)
        connection = http.client.HTTPConnection(parsed.hostname or "127.0.0.1", parsed.port or 80, timeout=30)
        interval = self.threads / self.rate
        next_at = time.monotonic() + index * interval / self.threads
        while not self._stop.is_set():
            if (delay := next_at - time.monotonic()) > 0 and self._stop.wait(delay):
                break
            next_at += interval
            sent = time.time()
            try:
                connection.request("POST", parsed.path, self.body, {"Content-Type": "application/json", **self.headers})
                response = connection.getresponse()
                response.read()
                status, variant = response.status, response.getheader("x-amzn-invoked-production-variant") or ""
            except (OSError, http.client.HTTPException):
                connection.close()
                status, variant = 0, ""
            self.records.append((sent, status, variant))
        connection.close()


def _request(about: dict[str, Any], url: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    """The router's control port, signed with the developer's keys (its admin routes answer no one else)."""
    from servestack.local.emulator import control, developer

    region = str(about.get("region") or "us-east-1")
    status, answer = control("GET" if body is None else "POST", url, developer(about), region, body)
    return status, answer if isinstance(answer, dict) else {"answer": answer}


def client_windows(timeline: list[dict[str, Any]], records: list[tuple[float, int, str]]) -> list[dict[str, Any]]:
    """Requests and client-visible failures (5xx or no answer) in each traffic window of the timeline."""
    marks = [e for e in timeline if e["event"] in ("traffic shifted", "rolled back", "live", "failed")]
    windows = []
    for opened, closed in zip(marks, [*marks[1:], None], strict=True):
        if opened["event"] != "traffic shifted":
            continue
        start, end = opened["wall"], closed["wall"] if closed else float("inf")
        inside = [r for r in records if start <= r[0] < end]
        failures = sum(1 for _, status, _ in inside if status == 0 or status >= 500)
        share = opened["green_percent"] / 100
        windows.append(
            {
                "step": opened["step"],
                "green_percent": opened["green_percent"],
                "seconds": round(end - start, 3) if closed else None,
                "requests": len(inside),
                "failures": failures,
                "served_by_green": sum(1 for _, _, variant in inside if variant == "green"),
                "failure_bound": share * len(inside) + TOLERANCE_REQUESTS,
                "within_bound": failures <= share * len(inside) + TOLERANCE_REQUESTS,
            }
        )
    return windows


def _component(name: str, entry: dict[str, Any], wanted: str | None) -> str:
    """The template's name of the component to update: `wanted` as serving.yaml or the template names it."""
    components: dict[str, Any] = entry.get("components") or {}
    if not components:
        raise CommandError(f"--component: {name} hosts no inference components; leave --component out")
    short = {full.removeprefix(f"{entry['endpoint_name']}-"): full for full in components}
    if wanted is None:
        raise CommandError(
            f"--component: missing is not allowed: {name} hosts inference components ({', '.join(short)}); "
            "name the one to update"
        )
    if wanted in components:
        return wanted
    if wanted in short:
        return short[wanted]
    raise CommandError(f"--component: {wanted!r} is not one of {name}'s components ({', '.join(short)})")


def _keep_release(about: dict[str, Any], name: str, answer: dict[str, Any]) -> None:
    """The new version stays live across restarts of local up (servestack/local/sagemaker/releases.py); say how to
    pin it."""
    from servestack.local.sagemaker import releases

    model, _, previous = str(answer.get("from") or "").partition("@")
    if previous == str(answer["version"]):
        return  # a redeploy of the version that was live: a new fleet, nothing new to keep
    work = Path(about.get("project") or project_or_cwd()) / STATE_DIR
    version = str(answer["version"])
    releases.record(work, name, answer.get("component"), model, version, previous)
    print(releases.pin_hint(name, model, version), file=sys.stderr, flush=True)


def deploy(
    name: str,
    version: str,
    *,
    state_path: Path | None = None,
    faults: str | None = None,
    options: dict[str, Any] | None = None,
    traffic_rps: float = 20.0,
    output: Path | None = None,
    timeout_sec: float = 3600,
    component: str | None = None,
) -> int:
    try:
        Faults.parse(faults)
    except ValueError as exc:
        raise CommandError(f"--inject-faults: {exc}") from None
    about = state.read(state_path)
    deployments: dict[str, Any] = about["deployments"]
    entry = deployments.get(name)
    if entry is not None and entry.get("mode") == "serverless":  # CodeDeploy's release of its alias
        from servestack.local.codedeploy import deploy_serverless

        interval = (options or {}).get("interval_sec")
        return deploy_serverless(about, name, entry, interval_sec=interval, output=output, timeout_sec=timeout_sec)
    if entry is None or entry.get("mode") != "realtime":
        realtime = [n for n, d in deployments.items() if d.get("mode") in ("realtime", "serverless")]
        raise CommandError(
            f"{name}: not a realtime or serverless deployment of the running local up ({', '.join(realtime)})",
            ExitCode.NOT_FOUND,
        )
    url = entry["url"]
    control = entry.get("control_url", url)  # the router's admin routes (rehearsals) answer on its control port
    sample, headers, component_name = Path(entry["sample"]), {}, None
    components: dict[str, Any] = entry.get("components") or {}
    if component is not None or components:
        component_name = _component(name, entry, component)
        headers = {"X-Amzn-SageMaker-Inference-Component": component_name}
        if components[component_name].get("sample"):
            sample = Path(components[component_name]["sample"])
    if not options or options.get("interval_sec") is None or options.get("bake_sec") is None:
        print(
            f"{name}: rehearsing at the deployment's own clocks (strategy interval_minutes and bake_minutes, alarm "
            "periods): minutes. --interval-sec 10 --bake-sec 4 --period-sec 2 --evaluation-periods 2 rehearse in "
            "seconds, with an interval longer than the alarm needs (two 2 s periods) so it stops a faulty green "
            "before the next shift",
            flush=True,
        )
    request = {"version": version, "faults": faults, **{k: v for k, v in (options or {}).items() if v is not None}}
    if component_name is not None:
        request["component"] = component_name
    status, answer = _request(about, f"{control}/_servestack/deploy", request)
    if status != 202:
        error = answer.get("error", {}) if isinstance(answer, dict) else {}
        message = str(error.get("message", answer)) + (
            f" (allowed: {error['allowed']})" if error.get("allowed") else ""
        )
        raise CommandError(f"{name}: {message}", ExitCode.NOT_FOUND if status == 404 else ExitCode.USAGE)
    traffic = Traffic(f"{url}/invocations", sample.read_bytes(), traffic_rps, headers=headers)
    traffic.start()
    printed = 0
    deadline = time.monotonic() + timeout_sec
    try:
        while time.monotonic() < deadline:
            _, answer = _request(about, f"{control}/_servestack/deploy")
            for event in answer["timeline"][printed:]:
                details = {k: v for k, v in event.items() if k not in ("at", "wall", "t_sec", "event")}
                shown = "  ".join(f"{k}={v}" for k, v in details.items())
                print(f"{event['at']}  +{event['t_sec']:7.2f}s  {event['event']:<16} {shown}", flush=True)
            printed = len(answer["timeline"])
            if answer["state"] in ("succeeded", "rolled_back", "failed"):
                break
            time.sleep(0.2)
    finally:
        traffic.stop()
    sent = traffic.records
    outcome = {
        **answer,
        "client": {
            "traffic_rps": traffic_rps,
            "requests": len(sent),
            "failures": sum(1 for _, s, _ in sent if s == 0 or s >= 500),
            "tolerance_requests": TOLERANCE_REQUESTS,
            "windows": client_windows(answer["timeline"], sent),
        },
    }
    target = output or project_or_cwd() / STATE_DIR / f"deploy-{name}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(outcome, indent=2) + "\n")
    print(f"{name}: {answer['state']} (outcome: {target})", flush=True)
    if answer["state"] == "succeeded":
        _keep_release(about, name, answer)
    return {"succeeded": 0, "rolled_back": 1}.get(answer["state"], 2)
