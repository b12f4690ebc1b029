"""`servestack`: the command users run. Imports stay lazy so that `--help` answers at once.

Every subcommand is one row of `COMMANDS`: its words, its help, a function adding its arguments, one running
it, and the extra it needs (pyproject.toml's optional dependencies; None: the base install runs it). `main` is
the one place where failures become a line and an exit code (servestack/failures.py): an expected failure
prints what to do and exits with its documented code; `--debug` shows the traceback. A command whose extra is
not installed says which one to install, in one line, before it runs (servestack/extras.py).

The base install (`pip install servestack`, no extra) has no third-party package: this module, what it imports
at the top, the `arguments` functions and `--help` and `--version` use the standard library only
(tests/e2e/test_base_install.py runs every command there).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from servestack.cli import init as init_command
from servestack.cli import lifecycle, models, monitor
from servestack.extras import missing_module
from servestack.failures import CommandError, ExitCode, MissingExtra, exit_codes_text, failure_of

EPILOG = (
    "Commands that work on a project (local ..., invoke, models ...) find it from any of its folders: the "
    "project is the nearest folder, at or above the current one, holding serving.yaml.\n\n"
    f"{exit_codes_text()}\n\n`servestack COMMAND --help` describes each command; --debug shows tracebacks."
)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every option's help ends with its default, unless the text already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        shown = action.default not in (None, False, argparse.SUPPRESS) and action.option_strings
        if shown and "default" not in text:
            text += " (default: %(default)s)"
        return text


@dataclass(frozen=True)
class Command:
    words: tuple[str, ...]
    help: str
    arguments: Callable[[argparse.ArgumentParser], None]  # standard library only: `--help` runs it
    run: Callable[[argparse.Namespace], int]
    extra: str | None  # what `run` imports: the extra of pyproject.toml it needs (servestack/extras.py)


GROUPS = {
    "local": "run the serving topology on this machine",
    "models": "model packages and the registry: push, list, promote, rollback, optimize",
}


# ------------------------------------------------------------------------------------------ local up


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


def invoke_arguments(invoke: argparse.ArgumentParser) -> None:
    invoke.add_argument("name", help="the deployment in serving.yaml")
    invoke.add_argument(
        "--data",
        type=Path,
        required=True,
        help="request body (.json, .csv, .npy, or any file a model's preprocess hook reads: an image, audio...); an "
        "async payload over the inline limit (256 KiB) goes through a presigned S3 upload, up to 1 GiB",
    )
    invoke.add_argument(
        "--content-type",
        default=None,
        help="the body's media type (default: from the file's extension: .json, .csv and .npy as the codecs read "
        "them, others as Python's mimetypes guesses, e.g. .jpg image/jpeg; unknown: application/octet-stream)",
    )
    invoke.add_argument(
        "--component", default=None, help="realtime endpoints hosting inference components: the component to call"
    )
    invoke.add_argument("--state", type=Path, default=None, help="state file of local up (default: the project's)")
    invoke.add_argument("--timeout-sec", type=float, default=120, help="how long to wait for an async job")


def run_invoke(args: argparse.Namespace) -> int:
    from servestack import project
    from servestack.local.commands.invoke import invoke
    from servestack.local.emulator import state

    if args.state is None and not os.environ.get(state.STATE_ENV) and project.find_project() is None:
        # Said before "local up is not running": outside a project, no local up could be found at all.
        raise CommandError(project.not_found_hint(instead="--state (the state file of a running local up)"))
    return invoke(
        args.name,
        args.data,
        state_path=args.state,
        timeout_sec=args.timeout_sec,
        component=args.component,
        content_type=args.content_type,
    )


# ------------------------------------------------------------------------------------------ loadtest, serve


def loadtest_arguments(load: argparse.ArgumentParser) -> None:
    load.add_argument(
        "target",
        help=(
            "http://host:port/path, https://... (signed with SigV4 from your AWS credentials), "
            "sagemaker://ENDPOINT or lambda://FUNCTION (called through boto3)"
        ),
    )
    load.add_argument(
        "--data",
        type=Path,
        default=None,
        help="request body (default: the sample request of the target's deployment, in this project's local up "
        "or named by --deployment)",
    )
    load.add_argument(
        "--deployment",
        default=None,
        help="the deployment in serving.yaml whose sample request to send when --data is not given (default: the "
        "one of the running local up that the target names)",
    )
    load.add_argument("--content-type", default=None, help="default: from the file extension (.json, .csv, .npy)")
    mode = load.add_mutually_exclusive_group()
    mode.add_argument(
        "--concurrency", type=int, default=None, help="closed loop with this many connections (default: 64)"
    )
    mode.add_argument("--rate", type=float, default=None, help="open loop at this many requests per second")
    load.add_argument("--duration", type=float, default=10.0, help="seconds")
    load.add_argument("--timeout", type=float, default=10.0, help="per-request timeout in seconds")
    load.add_argument(
        "--honour-retry-after", action="store_true", help="closed loop: wait as a 429/503 Retry-After says"
    )
    load.add_argument(
        "--target-qps",
        type=float,
        default=None,
        help="QPS to provision for; without it the report gives the measured capacity per instance, no count",
    )
    load.add_argument(
        "--instances",
        type=int,
        default=1,
        help="instances behind the target while measuring: capacity per instance = measured QPS / this",
    )
    load.add_argument(
        "--region",
        default=None,
        help="AWS region for https (SigV4), sagemaker:// and lambda:// (default: AWS_REGION, your profile's, or the "
        "one in an execute-api host name)",
    )
    load.add_argument(
        "--service",
        default="execute-api",
        help="SigV4 service name for https targets: execute-api (API Gateway) or lambda (function URLs)",
    )
    load.add_argument(
        "--sigv4", action="store_true", help="sign http:// requests too (https:// ones always are, unless --no-sign)"
    )
    load.add_argument("--no-sign", action="store_true", help="send https:// requests unsigned (a public endpoint)")
    load.add_argument(
        "--endpoint-url",
        default=None,
        help="boto3 endpoint for sagemaker:// and lambda:// (default: AWS's; e.g. local up's aws apis URL)",
    )
    load.add_argument("--report", type=Path, default=Path("loadtest.json"), help="JSON report")
    load.add_argument("--plot", type=Path, default=Path("loadtest.png"), help="PNG plot")


def run_loadtest(args: argparse.Namespace) -> int:
    from servestack.loadtest.command import main as loadtest_main

    return loadtest_main(args)


def plan_arguments(parser: argparse.ArgumentParser) -> None:
    from servestack.plan import arguments

    arguments(parser)


def run_plan(args: argparse.Namespace) -> int:
    from servestack import plan

    return plan.run(args)


def serve_arguments(_serve: argparse.ArgumentParser) -> None:
    """`serve` reads its settings from the environment, as SageMaker starts it."""


def run_serve(_args: argparse.Namespace) -> int:
    from servestack.adapters.realtime import main as serve_main

    serve_main(["serve"])
    return 0


def completion_arguments(parser: argparse.ArgumentParser) -> None:
    from servestack.cli.completion import SHELLS

    parser.add_argument("shell", choices=SHELLS, help="the shell to complete in")


def run_completion(args: argparse.Namespace) -> int:
    from servestack.cli.completion import script

    sys.stdout.write(script(args.shell, build_parser()))
    return 0


COMMANDS: tuple[Command, ...] = (
    Command(
        ("init",),
        "write a new project (the example project), or serving.yaml for a CDK app you have; never overwrites a file",
        init_command.arguments,
        init_command.run,
        extra=None,  # copies the packaged template: the standard library only
    ),
    Command(
        ("local", "up"),
        "run the synthesized templates of serving.yaml on this machine, IAM enforced, and print how to call them",
        up_arguments,
        run_up,
        extra="local",
    ),
    Command(
        ("local", "deploy"),
        "rehearse a blue/green release of a realtime deployment (canary/linear, alarms, rollback)",
        deploy_arguments,
        run_deploy,
        extra="local",
    ),
    Command(
        ("local", "status"),
        "the running local up's deployments: state, URL, version served, restarts",
        lifecycle.status_arguments,
        lifecycle.run_status,
        extra="local",
    ),
    Command(
        ("local", "logs"),
        "the output of local up's children, by deployment (files under .servestack/logs)",
        lifecycle.logs_arguments,
        lifecycle.run_logs,
        extra="local",
    ),
    Command(
        ("local", "down"),
        "stop a running local up (detached or not); its emulator data and local releases are kept",
        lifecycle.down_arguments,
        lifecycle.run_down,
        extra="local",
    ),
    Command(
        ("local", "put-input"),
        "upload input files to a batch deployment's input prefix, as the developer",
        lifecycle.put_input_arguments,
        lifecycle.run_put_input,
        extra="local",
    ),
    Command(
        ("local", "run-batch"),
        "run a batch deployment now: invoke its function with its schedule's input",
        batch_arguments,
        run_batch,
        extra="local",
    ),
    Command(
        ("invoke",),
        "call a deployment of the running local up (async: wait for it)",
        invoke_arguments,
        run_invoke,
        extra="local",
    ),
    Command(
        ("models", "push"),
        "package an ONNX file into the project and push it to the registry",
        models.push_arguments,
        models.run_push,
        extra="cli",
    ),
    Command(
        ("models", "list"),
        "models, versions and aliases in the registry",
        models.list_arguments,
        models.run_list,
        extra="cli",
    ),
    Command(
        ("models", "promote"),
        "point an alias (default `live`) at a version",
        models.promote_arguments,
        models.run_promote,
        extra="cli",
    ),
    Command(
        ("models", "rollback"),
        "point an alias back at the version it named before",
        models.rollback_arguments,
        models.run_rollback,
        extra="cli",
    ),
    Command(
        ("models", "optimize"),
        "quantize a registry model, measure it and its speed, push it if its gates hold (answers: accuracy for "
        "classifiers, tolerance for regressors; speed: at most 1.10x the source's time per call, unless "
        "--allow-slower)",
        models.optimize_arguments,
        models.run_optimize,
        extra="cli",
    ),
    Command(
        ("plan",),
        "which mode, configuration and monthly cost for a traffic profile, from measured capacity",
        plan_arguments,
        run_plan,
        extra="cli",
    ),
    Command(
        ("loadtest",),
        "drive an endpoint and report QPS, latency and what to provision",
        loadtest_arguments,
        run_loadtest,
        extra="cli",
    ),
    Command(
        ("monitor",),
        "compare captured traffic of a time window with a baseline: drift per column and in the predictions, an "
        "HTML report and a JSON summary; exit code 1 on drift past the thresholds",
        monitor.arguments,
        monitor.run,
        extra="cli",
    ),
    Command(
        ("serve",),
        "run the realtime container entry in the foreground (as `serve`)",
        serve_arguments,
        run_serve,
        extra="server",
    ),
    Command(
        ("completion",),
        'print a shell completion script: eval "$(servestack completion bash)" in ~/.bashrc; zsh and fish too',
        completion_arguments,
        run_completion,
        extra=None,  # walks the argument parser: the standard library only
    ),
)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("servestack")
    except PackageNotFoundError:  # running from a checkout that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="servestack",
        description="Serve ONNX models on AWS, and locally.",
        epilog=EPILOG,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"servestack {_version()}")
    parser.add_argument("--debug", action="store_true", help="show the traceback of a failure")
    top = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    groups: dict[str, argparse._SubParsersAction[argparse.ArgumentParser]] = {}
    for command in COMMANDS:
        where = top
        if len(command.words) == 2:
            group = command.words[0]
            if group not in groups:
                holder = top.add_parser(
                    group, help=GROUPS[group], description=GROUPS[group], formatter_class=HelpFormatter
                )
                groups[group] = holder.add_subparsers(dest=f"{group}_command", required=True, metavar="COMMAND")
            where = groups[group]
        leaf = where.add_parser(
            command.words[-1], help=command.help, description=command.help, formatter_class=HelpFormatter
        )
        leaf.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
        command.arguments(leaf)
        leaf.set_defaults(handler=command)
    return parser


def require(extra: str | None) -> None:
    """Raise `MissingExtra` when a module of `extra` cannot be imported; nothing to check for no extra."""
    if extra is None:
        return
    module = missing_module(extra)
    if module is not None:
        raise MissingExtra(extra, module)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command: Command = args.handler
    name = "servestack " + " ".join(command.words)
    debug = bool(args.debug) or os.environ.get("SERVESTACK_DEBUG") == "1"
    try:
        require(command.extra)
        return int(command.run(args))
    except SystemExit:
        raise
    except BrokenPipeError:  # the reader of our output went away (`| head`): stop quietly, as other CLIs do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return int(ExitCode.FAILED)
    except BaseException as error:
        failure = failure_of(error, command.extra)
        if debug:
            traceback.print_exc()
        if failure is None:
            print(
                f"{name}: unexpected {type(error).__name__}: {error}; this is a bug in servestack: "
                "run again with --debug and report the traceback",
                file=sys.stderr,
            )
            return int(ExitCode.BUG)
        code, line = failure
        print(f"{name}: {line}", file=sys.stderr)
        return int(code)


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["COMMANDS", "Command", "ExitCode", "build_parser", "main"]
