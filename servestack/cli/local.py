"""The `servestack local` commands that run the topology: `local up` (the whole of serving.yaml on this machine),
`local deploy` (a release rehearsed under its alarms) and `local run-batch` (a batch job now). Their rows are in
servestack/cli/main.py's `COMMANDS`; imports stay lazy, as there, so that `--help` answers at once with the
standard library only."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from servestack.cli import lifecycle
from servestack.failures import CommandError


def up_arguments(up: argparse.ArgumentParser) -> None:
    up.add_argument(
        "--spec", type=Path, default=None, help="serving.yaml (default: the project's, found from this folder up)"
    )
    up.add_argument(
        "--port",
        type=int,
        default=None,
        help="the first realtime endpoint's container port (default 8080, or a free one)",
    )
    up.add_argument(
        "--aws-port",
        type=int,
        default=None,
        help="boto3 endpoint_url port for sagemaker-runtime and lambda (default 8090, or a free one if taken)",
    )
    up.add_argument("--workers", type=int, default=1, help="worker processes of each realtime container")
    up.add_argument(
        "--endpoint-url",
        default=None,
        help="an external AWS emulator such as LocalStack, which does not enforce IAM "
        "(default: AWS_ENDPOINT_URL, else an embedded moto server)",
    )
    up.add_argument("--emulator-port", type=int, default=0, help="embedded emulator port (0: a free one)")
    up.add_argument(
        "--allow-reset",
        action="store_true",
        help="answer moto's admin API on the emulator port (POST /moto-api/reset wipes every resource) "
        "(default: refused with 403)",
    )
    up.add_argument(
        "--state", type=Path, default=None, help="state file (default: .servestack/local.json in the project)"
    )
    up.add_argument(
        "--fresh", action="store_true", help="start the emulator empty (default: keep jobs, results and models)"
    )
    up.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where the emulator's data is kept between runs (default: .servestack/emulator in the project)",
    )
    up.add_argument(
        "--no-iam",
        dest="iam",
        action="store_false",
        help="debugging only: do not enforce the templates' IAM policies (local mode then allows what AWS refuses) "
        "(default: enforced)",
    )
    up.add_argument(
        "--explain",
        action="store_true",
        help="list every resource of the templates, its local name, and whether it is emulated or only reported",
    )
    up.add_argument("--resynth", action="store_true", help="synthesize even when the inputs are unchanged")
    up.add_argument(
        "--detach",
        "-d",
        action="store_true",
        help="run in the background and return once everything is ready; its output goes to "
        ".servestack/local-up.log (`local status`, `local logs`, `local down`)",
    )
    up.add_argument(
        "--visibility-timeout-sec",
        type=int,
        default=None,
        help="override the job queues' visibility timeout (default: the template's, 6x the worker timeout + "
        "the batching window); a deviation from the deploy, printed at start",
    )


def run_up(args: argparse.Namespace) -> int:
    from servestack import artifacts, project
    from servestack.local.emulator import state
    from servestack.local.up import UpOptions, run
    from servestack.spec import load_spec

    spec_file = args.spec or project.spec_path()
    if spec_file is None:
        raise CommandError(project.not_found_hint())
    root = spec_file.resolve().parent
    spec = load_spec(spec_file)  # a missing package is reported here, naming the command that creates it
    for d in spec.deployments.values():  # its printed commands and the batch input use the sample request
        try:
            artifacts.sample_file(spec.model(d.model, d.version), root, "request")
        except FileNotFoundError as missing:
            raise CommandError(str(missing)) from None
    state_file = args.state or Path(os.environ.get(state.STATE_ENV) or root / project.STATE_DIR / state.STATE_FILE)
    if args.detach:
        return lifecycle.detach_up(args, spec_file, state_file, root / project.STATE_DIR)
    return run(
        UpOptions(
            spec_path=spec_file,
            port=args.port,
            aws_port=args.aws_port,
            emulator_port=args.emulator_port,
            endpoint_url=args.endpoint_url,
            state_path=state_file,
            workers=args.workers,
            fresh=args.fresh,
            data_dir=args.data_dir,
            iam=args.iam,
            explain=args.explain,
            resynth=args.resynth,
            visibility_timeout_sec=args.visibility_timeout_sec,
            allow_reset=args.allow_reset,
        )
    )


# ------------------------------------------------------------------------------------------ local deploy


def deploy_arguments(rehearse: argparse.ArgumentParser) -> None:
    rehearse.add_argument("name", help="the realtime deployment in serving.yaml")
    rehearse.add_argument(
        "--version", required=True, help="the registry version (or alias) to release: push it first (models push)"
    )
    rehearse.add_argument(
        "--component",
        default=None,
        help="on an endpoint hosting inference components: the component to update (its name in serving.yaml)",
    )
    rehearse.add_argument(
        "--inject-faults", default=None, help="make green misbehave, e.g. error_rate=0.2,latency_ms=50 (default: none)"
    )
    rehearse.add_argument(
        "--strategy",
        choices=["canary", "linear", "all_at_once"],
        default=None,
        help="how traffic shifts to green (default: the deployment's strategy.type)",
    )
    rehearse.add_argument("--canary-percent", type=int, default=None, help="default: strategy canary_percent")
    rehearse.add_argument("--linear-step-percent", type=int, default=None, help="default: strategy linear_step_percent")
    rehearse.add_argument(
        "--interval-sec",
        type=float,
        default=None,
        help="wait between shifts (default: strategy interval_minutes; pass a few seconds to rehearse quickly)",
    )
    rehearse.add_argument(
        "--bake-sec", type=float, default=None, help="watch after the last shift (default: strategy bake_minutes)"
    )
    rehearse.add_argument("--period-sec", type=int, default=None, help="alarm period (default: alarms.period_sec)")
    rehearse.add_argument("--evaluation-periods", type=int, default=None, help="default: alarms.evaluation_periods")
    rehearse.add_argument("--traffic-rps", type=float, default=20.0, help="sample requests per second meanwhile")
    rehearse.add_argument(
        "--output", type=Path, default=None, help="outcome JSON (default: the project's .servestack/deploy-NAME.json)"
    )
    rehearse.add_argument("--state", type=Path, default=None, help="state file of local up (default: the project's)")


def run_deploy(args: argparse.Namespace) -> int:
    from servestack.local.commands.deploy import deploy

    options = {
        "strategy": args.strategy,
        "canary_percent": args.canary_percent,
        "linear_step_percent": args.linear_step_percent,
        "interval_sec": args.interval_sec,
        "bake_sec": args.bake_sec,
        "period_sec": args.period_sec,
        "evaluation_periods": args.evaluation_periods,
    }
    return deploy(
        args.name,
        args.version,
        state_path=args.state,
        faults=args.inject_faults,
        options=options,
        traffic_rps=args.traffic_rps,
        output=args.output,
        component=args.component,
    )


# ------------------------------------------------------------------------------------------ run-batch, invoke


def batch_arguments(batch: argparse.ArgumentParser) -> None:
    batch.add_argument("name", help="the batch deployment in serving.yaml")
    batch.add_argument("--state", type=Path, default=None, help="state file of local up (default: the project's)")
    batch.add_argument("--strict", action="store_true", help="stop at the first bad row")
    batch.add_argument(
        "--chunk-rows", type=int, default=None, help="rows per chunk and per output part (default: the handler's)"
    )
    batch.add_argument(
        "--output-prefix", default=None, help="write here instead of the deployment's output prefix (default: that)"
    )
    batch.add_argument(
        "--download",
        type=Path,
        default=None,
        metavar="OUT",
        help="merge the run's output into OUT (.jsonl, .csv or .parquet by its suffix), one row per input row in "
        "input order, with the input's id where it has one",
    )


def run_batch(args: argparse.Namespace) -> int:
    from servestack.local.commands.invoke import run_batch as run_job

    return run_job(
        args.name,
        state_path=args.state,
        strict=args.strict,
        chunk_rows=args.chunk_rows,
        output_prefix=args.output_prefix,
        download=args.download,
    )
