"""`servestack monitor`: captured traffic of a time window against a baseline, as an HTML report and a JSON
summary; exit code 1 when a column or a prediction drifted past its threshold, so that CI or a schedule can act.

The statistics are servestack/monitor/'s; this module reads the arguments, finds the model package (a folder,
or NAME[@VERSION] in the registry the `models` commands use) and writes the outputs. docs/monitoring.md shows
a run and its report.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from servestack.cli.models import REGISTRY_HELP
from servestack.failures import CommandError, ExitCode

if TYPE_CHECKING:  # the CLI imports this module to build its parser: keep numpy and onnxruntime out of `--help`
    from servestack.monitor.drift import Comparison, Thresholds

DEFAULT_MIN_ROWS = 100


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--capture",
        required=True,
        metavar="LOCATION",
        help="the captured records: a folder of .jsonl files (searched recursively), one .jsonl file, or "
        "s3://bucket/prefix/; a batch deployment's output prefix, s3://bucket/<output prefix>, reads the rows its "
        "runs scored",
    )
    parser.add_argument(
        "--model",
        required=True,
        metavar="NAME[@VERSION]",
        help="the model the traffic went to: NAME[@VERSION or alias] in the registry (default version: the "
        "`live` alias, else the newest), or a package folder such as models/artifacts/NAME/VERSION",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        metavar="FILE",
        help="the rows to compare with, e.g. the training set: .csv with a header row, .parquet, .jsonl of row "
        "objects or .json (default: the package's sample, `models push --sample`, which holds 5 rows at most: "
        "too few for --min-rows unless you lower it)",
    )
    parser.add_argument(
        "--since",
        default=None,
        help="only records at or after this time: ISO 8601 (2026-12-03T00:00:00Z) or back from now (30m, 24h, 7d) "
        "(default: the first record)",
    )
    parser.add_argument(
        "--until", default=None, help="only records before this time, same forms as --since (default: the last record)"
    )
    parser.add_argument("--report", type=Path, default=Path("monitor.html"), help="the HTML report")
    parser.add_argument("--json", type=Path, default=Path("monitor.json"), help="the JSON summary")
    parser.add_argument("--max-psi", type=float, default=0.2, help="numeric columns: drift past this PSI")
    parser.add_argument(
        "--max-js", type=float, default=0.1, help="categorical columns: drift past this Jensen-Shannon distance"
    )
    parser.add_argument(
        "--max-unseen", type=float, default=0.01, help="categorical: drift past this share of unseen categories"
    )
    parser.add_argument(
        "--max-out-of-range",
        type=float,
        default=0.05,
        help="numeric: drift past this share of values outside the baseline's minimum and maximum",
    )
    parser.add_argument(
        "--max-missing-increase",
        type=float,
        default=0.05,
        help="drift past this rise of a column's missing rate over the baseline's (0.05: 5 points)",
    )
    parser.add_argument(
        "--min-rows",
        type=int,
        default=DEFAULT_MIN_ROWS,
        help="refuse (exit 2) a baseline or a window of fewer rows: their statistics would be noise",
    )
    parser.add_argument(
        "--endpoint-url", default=None, help="S3 endpoint for an s3:// capture (default: AWS's; e.g. an emulator's)"
    )
    parser.add_argument("--region", default=None, help="AWS region for an s3:// capture (default: your profile's)")
    parser.add_argument("--registry", default=None, help=REGISTRY_HELP)
    parser.add_argument(
        "--state", type=Path, default=None, help="state file of local up, to find its registry (default: the project's)"
    )


def run(args: argparse.Namespace) -> int:
    from servestack.monitor.baseline import BaselineError
    from servestack.monitor.compare import Inputs, NotEnoughRows, compare_traffic
    from servestack.monitor.records import CaptureError, Window, parse_time
    from servestack.monitor.report import render

    thresholds = _thresholds(args)
    if args.min_rows < 1:
        raise CommandError(f"--min-rows: {args.min_rows}; give at least 1")
    now = datetime.now(UTC)
    try:
        window = Window(
            parse_time(args.since, now) if args.since else None, parse_time(args.until, now) if args.until else None
        )
        with tempfile.TemporaryDirectory(prefix="servestack-monitor-") as cache:
            package = _package(args, Path(cache))
            comparison = compare_traffic(
                Inputs(
                    package_dir=package,
                    baseline=args.baseline,
                    capture=args.capture,
                    window=window,
                    thresholds=thresholds,
                    min_rows=args.min_rows,
                    endpoint_url=args.endpoint_url,
                    region=args.region,
                )
            )
    except (BaselineError, CaptureError, NotEnoughRows) as error:
        raise CommandError(str(error)) from None
    for path, text in ((args.report, render(comparison)), (args.json, _json(comparison))):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    _print(comparison, args.report, args.json)
    return int(ExitCode.FAILED if comparison.drifted else ExitCode.OK)


def _thresholds(args: argparse.Namespace) -> Thresholds:
    from servestack.monitor.drift import Thresholds

    given = {
        "--max-psi": args.max_psi,
        "--max-js": args.max_js,
        "--max-unseen": args.max_unseen,
        "--max-out-of-range": args.max_out_of_range,
        "--max-missing-increase": args.max_missing_increase,
    }
    for flag, value in given.items():
        if not value >= 0:  # NaN too: no comparison holds for it
            raise CommandError(f"{flag}: {value}; give a number of 0 or more")
    return Thresholds(
        psi=args.max_psi,
        js=args.max_js,
        unseen=args.max_unseen,
        out_of_range=args.max_out_of_range,
        missing=args.max_missing_increase,
    )


def _package(args: argparse.Namespace, cache: Path) -> Path:
    """The package folder: `--model` itself when it is one, else its version fetched from the registry, with the
    sample request beside it (a fetch brings the files the manifest lists, not the samples)."""
    from servestack.cli.models import registry_from
    from servestack.inference.manifest import MANIFEST_FILE, SAMPLE_REQUEST

    given = Path(args.model)
    if (given / MANIFEST_FILE).is_file():
        return given
    if "/" in args.model or given.exists():
        raise CommandError(f"--model {args.model}: no {MANIFEST_FILE} there; give a package folder or NAME[@VERSION]")
    name, _, version = args.model.partition("@")
    registry = registry_from(args.registry, args.state)
    resolved = registry.resolve(name, version or None)
    package = registry.fetch(name, resolved, cache)
    sample = registry.store.read(f"{registry.prefix}{name}/{resolved}/{SAMPLE_REQUEST}")
    if sample is not None:
        (package / SAMPLE_REQUEST).write_bytes(sample)
    return package


def _json(comparison: Comparison) -> str:
    return json.dumps(comparison.to_json(), indent=2) + "\n"


def _print(comparison: Comparison, report: Path, summary: Path) -> None:
    print(
        f"{comparison.model}: {comparison.records} records ({comparison.current_rows} rows) against "
        f"{comparison.baseline_rows} baseline rows"
    )
    for drift in [*comparison.columns, *comparison.predictions]:
        if drift.drifted:
            print(f"  drift  {drift.name}: {'; '.join(drift.flags)}")
    for note in comparison.notes:
        print(f"  note   {note}")
    verdict = "drift" if comparison.drifted else "no drift"
    print(f"{verdict}: {len(comparison.drifted_columns)} of {len(comparison.columns)} columns, "
          f"{len(comparison.drifted_predictions)} of {len(comparison.predictions)} prediction statistics")  # fmt: skip
    print(f"report: {report}\nsummary: {summary}")
