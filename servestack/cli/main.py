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
from servestack.cli.local import (
    batch_arguments,
    deploy_arguments,
    run_batch,
    run_deploy,
    run_up,
    up_arguments,
)
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
