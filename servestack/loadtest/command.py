"""`servestack loadtest`, the command: which request to send, which target, and the report and the plot.

Without `--data` the request is the target deployment's own sample: the deployment is `--deployment NAME`, or
the one of the project's running `local up` (its state file) whose URL, endpoint name or function name the
target names, and its model package's `sample-request.json` is the body. A target that is no deployment of the
project is refused, asking for `--data`: a sample of another model would only measure how fast the target
refuses it.

The load generator itself is servestack/loadtest/driver.py.
"""

from __future__ import annotations

import argparse
import re
import sys
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from servestack.failures import CommandError, ExitCode
from servestack.loadtest.driver import Sample, SdkTarget, Target, run, sigv4_signer
from servestack.loadtest.sdk import is_local

if TYPE_CHECKING:
    from matplotlib.figure import Figure

CONTENT_TYPES = {".json": "application/json", ".csv": "text/csv", ".npy": "application/x-npy"}
_REGION_IN_HOST = re.compile(r"\.(?:execute-api|lambda-url)\.([a-z]{2}(?:-[a-z]+)+-\d)\.")


def region_of(explicit: str | None, url: str | None = None) -> str | None:
    """--region, else the region in an API Gateway / function URL host, else botocore's (AWS_REGION, profile)."""
    if explicit:
        return explicit
    found = _REGION_IN_HOST.search(urllib.parse.urlsplit(url).netloc) if url else None
    if found:
        return found.group(1)
    import botocore.session

    configured = botocore.session.get_session().get_config_variable("region")
    return str(configured) if configured else None


def target_of(args: argparse.Namespace, body: bytes, content_type: str) -> Target | SdkTarget:
    scheme = urllib.parse.urlsplit(args.target).scheme
    try:
        if scheme in ("sagemaker", "lambda"):
            region = region_of(args.region)
            if region is None:
                raise CommandError(f"{args.target}: no AWS region; pass --region (or set AWS_REGION)", ExitCode.AWS)
            return SdkTarget.from_url(args.target, body, content_type, region=region, endpoint_url=args.endpoint_url)
        signer = None
        if (scheme == "https" and not args.no_sign) or args.sigv4:
            region = region_of(args.region, args.target)
            if region is None:
                raise CommandError(
                    f"{args.target}: no AWS region to sign for; pass --region (or --no-sign)", ExitCode.AWS
                )
            signer = sigv4_signer(args.service, region, local=is_local(args.target))
        return Target.from_url(args.target, body, content_type, signer=signer)
    except ValueError as error:
        raise CommandError(str(error)) from None


def main(args: argparse.Namespace) -> int:
    """`servestack loadtest` (arguments: servestack/cli/main.py)."""
    given: Path | None = args.data
    if given is None:
        data, whose = deployment_sample(args.target, args.deployment)
        print(f"sending the sample request of {whose}: {data} (--data sends another)", file=sys.stderr)
    else:
        data = given
    content_type = args.content_type or CONTENT_TYPES.get(data.suffix.lower())
    if content_type is None:
        raise CommandError(
            f"--content-type: cannot tell from {data.name!r}; give one of {sorted(CONTENT_TYPES.values())}"
        )
    if not data.is_file():
        raise CommandError(f"--data {data}: no such file")
    target = target_of(args, data.read_bytes(), content_type)
    concurrency = args.concurrency if args.concurrency or args.rate else 64
    report, samples = run(
        target,
        duration_sec=args.duration,
        concurrency=concurrency,
        rate=args.rate,
        timeout_sec=args.timeout,
        target_qps=args.target_qps,
        honour_retry_after=args.honour_retry_after,
        instances_measured=args.instances,
    )
    print(report.summary())
    args.report.write_text(report.to_json())
    if samples:
        plot(samples, args.plot, f"{args.target} - {report.mode}")
    print(f"wrote {args.report}" + (f" and {args.plot}" if samples else ""))
    if not report.ok_qps:
        said = ", and what the server said" if report.error_bodies else ""
        print(f"no 2xx answers: see the statuses and errors above{said}", file=sys.stderr)
        return 1
    return 0


def plot(samples: list[Sample], path: Path, title: str) -> None:
    """Latency over time and a latency histogram, one PNG."""
    import matplotlib.pyplot as plt

    figure = draw(samples, title)
    figure.savefig(path, dpi=100)
    plt.close(figure)


def draw(samples: list[Sample], title: str) -> Figure:
    """The figure `plot` saves (the caller closes it)."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start = min(s.started for s in samples)
    figure, (over_time, histogram) = plt.subplots(1, 2, figsize=(12, 4.5))
    for label, keep, color in (
        ("2xx", lambda s: 200 <= s.status < 300, "tab:blue"),
        ("429", lambda s: s.status == 429, "tab:orange"),
        ("other", lambda s: not (200 <= s.status < 300 or s.status == 429), "tab:red"),
    ):
        chosen = [s for s in samples if keep(s)]
        if chosen:
            over_time.scatter(
                [s.started - start for s in chosen],
                [s.latency_sec * 1000 for s in chosen],
                s=2,
                alpha=0.4,
                label=f"{label} ({len(chosen)})",
                color=color,
            )
    over_time.set(xlabel="seconds", ylabel="latency ms", title="latency over time", yscale="log")
    # Plain numbers on the log axis (4, 5, 6 rather than 4x10^0), and legend dots large enough to see.
    plain = matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}")
    over_time.yaxis.set_major_formatter(plain)
    over_time.yaxis.set_minor_formatter(plain)
    over_time.legend(loc="upper right", markerscale=4)
    ok = [s.latency_sec * 1000 for s in samples if 200 <= s.status < 300]
    if ok:
        histogram.hist(ok, bins=80, color="tab:blue")
        # The percentiles are named in a legend, not beside their lines: p50 and p99 are often a few pixels apart,
        # and labels written at the lines overlapped.
        for name, value, style in zip(("p50", "p99"), np.percentile(ok, [50, 99]), ("--", ":"), strict=True):
            histogram.axvline(value, color="black", linestyle=style, linewidth=1.2, label=f"{name} {value:.2f} ms")
        histogram.legend(loc="upper right")
    histogram.set(xlabel="latency ms (2xx)", ylabel="requests", title="latency histogram")
    figure.suptitle(title)
    figure.tight_layout()
    return figure


# ------------------------------------------------------------------------------------------ the request


def deployment_sample(target: str, deployment: str | None) -> tuple[Path, str]:
    """The sample request of the deployment `target` is, and what to call it ("NAME (model M@V)")."""
    from servestack import artifacts, project
    from servestack.spec import load_spec

    spec_file = project.spec_path()
    if spec_file is None:
        raise CommandError(
            f"--data: no request body given, and {project.not_found_hint(instead='--data FILE')} (from a project, "
            "loadtest sends the target deployment's sample request)"
        )
    root = spec_file.resolve().parent
    spec = load_spec(spec_file)
    name = deployment or deployment_of(target, running_state(root))
    if name is None:
        raise CommandError(
            f"--data: no request body given, and {target} is no deployment of this project's running local up: "
            f"pass --data FILE, or --deployment NAME (one of {', '.join(spec.deployments)}) to send its sample "
            "request"
        )
    if name not in spec.deployments:
        raise CommandError(
            f"--deployment {name}: not a deployment in {spec_file} (one of {', '.join(spec.deployments)})",
            ExitCode.NOT_FOUND,
        )
    chosen = spec.deployments[name]
    model = spec.model(chosen.model, chosen.version)
    try:
        return artifacts.sample_file(model, root, "request"), f"{name} (model {model.key})"
    except FileNotFoundError as missing:
        raise CommandError(f"{missing}; or pass --data FILE") from None


def running_state(root: Path) -> dict[str, Any]:
    """The state of the project's running local up, or {} when none runs."""
    from servestack.local.emulator import state

    try:
        return state.read(state.default_path(root))
    except FileNotFoundError:  # state.NotRunning: no local up, or one that has exited
        return {}


def deployment_of(target: str, about: dict[str, Any]) -> str | None:
    """The deployment of a local up state that `target` names: an http URL on one of its ports (the container,
    the HTTP API front, or the SageMaker front's /endpoints/NAME/ path), `sagemaker://ENDPOINT` or
    `lambda://FUNCTION[:QUALIFIER]`."""
    parsed = urllib.parse.urlsplit(target)
    named = (parsed.netloc + parsed.path).strip("/").split(":")[0]
    front = urllib.parse.urlsplit(str(about.get("aws_api_url") or "")).netloc
    for name, entry in (about.get("deployments") or {}).items():
        if _names(parsed, named, front, str(name), entry):
            return str(name)
    return None


def _names(parsed: urllib.parse.SplitResult, named: str, front: str, name: str, entry: dict[str, Any]) -> bool:
    if parsed.scheme in ("http", "https"):
        ports = {urllib.parse.urlsplit(str(entry[key])).netloc for key in ("url", "container_url") if entry.get(key)}
        through_front = f"/endpoints/{entry.get('endpoint_name')}/" in parsed.path + "/"
        return parsed.netloc in ports or (parsed.netloc == front and through_front)
    if parsed.scheme == "sagemaker":
        return named in (entry.get("endpoint_name"), name)
    if parsed.scheme == "lambda":
        return named == name or named in (entry.get("lambda_functions") or {}).values()
    return False
