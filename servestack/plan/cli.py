"""`servestack plan` on the command line: its arguments, the profile from flags or a YAML file, and the
rendered plan."""

from __future__ import annotations

import argparse
import json
from fractions import Fraction
from pathlib import Path
from typing import Any

from servestack.plan.modes import plan
from servestack.plan.profile import PRICES_FILE, Prices, bounded_number, invalid_input, measurement_from, traffic_from
from servestack.plan.results import Plan
from servestack.sizing import decimal_text

# ------------------------------------------------------------------------------------------------ CLI


def render(result: Plan) -> str:
    import yaml

    lines = [
        f"servestack plan ({result.prices.provenance()})",
        f"traffic: {result.traffic.describe()}",
        *(
            f"measured: {m.label()}" + ("  [per local core: estimates]" if m.estimate else "")
            for m in result.measurements
        ),
        "",
    ]
    for option in result.options:
        if option.feasible:
            assert option.monthly_usd is not None
            marker = " (estimate)" if option.estimate else ""
            lines.append(
                f"{option.mode:<10} ${decimal_text(option.monthly_usd, 2)}/month{marker}: {option.configuration}"
            )
            lines.extend(f"{'':<12}{line.what}: ${decimal_text(line.usd, 2)}" for line in option.lines)
            lines.extend(f"{'':<12}beside: {line}" for line in option.beside)
            lines.extend(f"{'':<12}note: {note}" for note in option.notes)
        else:
            lines.append(f"{option.mode:<10} ruled out: {option.reason}")
    chosen = result.recommended
    lines.append("")
    if chosen is None:
        lines.append("no mode meets this profile")
        return "\n".join(lines)
    assert chosen.monthly_usd is not None
    lines.append(
        f"recommended: {chosen.mode}, ${decimal_text(chosen.monthly_usd, 2)}/month (the cheapest mode that meets the "
        f"SLO and payload limits)"
    )
    fragment = result.fragment()
    if fragment is not None:
        lines.append("serving.yaml fragment:")
        lines.append(yaml.safe_dump(fragment, sort_keys=False).rstrip())
    return "\n".join(lines)


def arguments(parser: argparse.ArgumentParser) -> None:
    """`servestack plan`'s arguments."""
    parser.add_argument(
        "--profile", type=Path, default=None, help="YAML: traffic:, measured:, model:, batch_rows_per_sec:"
    )
    parser.add_argument("--peak-qps", default=None, help="peak requests per second")
    parser.add_argument("--average-qps", default=None, help="average requests per second while traffic runs")
    parser.add_argument("--burstiness", default=None, help="peak / average (instead of --peak-qps)")
    parser.add_argument("--hours-per-day", default=None, help="hours of traffic a day (default 24)")
    parser.add_argument("--payload", default=None, help="request size, e.g. 1.4KB or 200MB")
    parser.add_argument("--p99-ms", default=None, help="p99 latency SLO in milliseconds")
    parser.add_argument("--rows-per-day", default=None, help="offline rows a day (batch)")
    parser.add_argument("--batch-window-hours", default=None, help="hours a batch run may take (default 6)")
    parser.add_argument("--headroom", default=None, help="capacity over the load (default 1.5)")
    parser.add_argument(
        "--measured",
        action="append",
        default=[],
        metavar="[TYPE=]FILE",
        help="a `servestack loadtest` report; TYPE is the SageMaker instance type it ran on (default: local)",
    )
    parser.add_argument("--local-cores", type=int, default=None, help="cores the local server used (default 1)")
    parser.add_argument("--batch-rows-per-sec", default=None, help="measured batch rows/s per core")
    parser.add_argument("--model", default=None, help="NAME[@VERSION] for the fragment (default my-model)")
    parser.add_argument("--prices", type=Path, default=PRICES_FILE, help="price file (default: the bundled one)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")


FLAG_FIELDS = {
    "peak_qps": "peak_qps", "average_qps": "average_qps", "burstiness": "burstiness", "hours_per_day": "hours_per_day",
    "payload": "payload", "p99_ms": "p99_ms", "rows_per_day": "rows_per_day",
    "batch_window_hours": "batch_window_hours", "headroom": "headroom",
}  # fmt: skip


def from_args(args: argparse.Namespace) -> Plan:
    """The profile file, then the flags over it."""
    import yaml

    document: dict[str, Any] = {}
    base: Path | None = None
    if args.profile is not None:
        try:
            loaded = yaml.safe_load(args.profile.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise invalid_input(f"{args.profile}: {exc}", field="--profile", value=str(args.profile)) from None
        if not isinstance(loaded, dict):
            raise invalid_input(f"{args.profile}: not a mapping", field="--profile", allowed="traffic:, measured:, ...")
        unknown = sorted(set(loaded) - {"traffic", "measured", "local_cores", "model", "batch_rows_per_sec"})
        if unknown:
            raise invalid_input(
                f"{args.profile}: unknown keys {unknown}",
                field="--profile",
                value=unknown,
                allowed="traffic, measured, local_cores, model, batch_rows_per_sec",
            )
        document, base = loaded, args.profile.parent
    values = dict(document.get("traffic") or {})
    values.update({key: getattr(args, flag) for flag, key in FLAG_FIELDS.items() if getattr(args, flag) is not None})
    if args.burstiness is not None:
        values.pop("peak_qps", None)
    if args.peak_qps is not None:
        values.pop("burstiness", None)
    traffic = traffic_from(values)
    prices = Prices.load(args.prices)
    local_cores = args.local_cores or int(document.get("local_cores") or 1)
    specs = [(str(s), base) for s in document.get("measured") or []] + [(s, None) for s in args.measured]
    measurements = [measurement_from(spec, prices, local_cores, where) for spec, where in specs]
    rows_per_sec = args.batch_rows_per_sec or document.get("batch_rows_per_sec")
    model = str(args.model or document.get("model") or "my-model")
    name, _, version = model.partition("@")
    return plan(
        traffic,
        measurements,
        prices,
        model=name,
        version=version or None,
        package_bytes=package_size(name, version or None),
        batch_rows_per_sec=bounded_number("batch_rows_per_sec", rows_per_sec, low=Fraction(0), low_open=True)
        if rows_per_sec is not None
        else None,
    )


def package_size(name: str, version: str | None) -> int | None:
    """The bytes of the model's package in this project (`version`, else its newest), None when it has none."""
    from servestack import project
    from servestack.inference.service import version_order

    root = project.find_project()
    folder = project.artifacts_root(root) / name if root is not None else None
    if folder is None or not folder.is_dir():
        return None
    versions = [v for v in folder.iterdir() if (v / "manifest.json").is_file()]
    chosen = folder / version if version else max(versions, key=lambda v: version_order(v.name), default=None)
    if chosen is None or not chosen.is_dir():
        return None
    return sum(p.stat().st_size for p in chosen.rglob("*") if p.is_file())


def run(args: argparse.Namespace) -> int:
    """0: a mode is recommended; 1: none meets the profile. A bad profile raises a ServingError, which the
    CLI prints in one line (exit 2)."""
    result = from_args(args)
    print(json.dumps(result.to_dict(), indent=2) if args.json else render(result))
    return 0 if result.recommended is not None else 1
