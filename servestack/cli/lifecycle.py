"""`servestack local up --detach|status|logs|down|put-input`: local mode's lifecycle from the command line.

Each subcommand is a pair, its arguments and its run, which `servestack/cli/main.py` lists in its `COMMANDS`; the
work is done in `servestack/local/commands/lifecycle.py` (detach, status, down), `servestack/local/logs/log_files.py`
and
`servestack/local/batch/data.py`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from servestack.failures import CommandError


def detach_up(args: argparse.Namespace, spec_file: Path, state_file: Path, work: Path) -> int:
    """`local up` again, without --detach, in the background (servestack/local/commands/lifecycle.py)."""
    from servestack.local.commands import lifecycle

    if args.explain:
        raise CommandError("--detach: --explain prints and exits; run it without --detach")
    argv = [*_self_argv(), "local", "up", "--spec", str(spec_file.resolve()), "--state", str(state_file.resolve())]
    given: dict[str, object] = {
        "--port": args.port, "--aws-port": args.aws_port, "--workers": args.workers,
        "--endpoint-url": args.endpoint_url, "--emulator-port": args.emulator_port or None, "--data-dir": args.data_dir,
        "--visibility-timeout-sec": args.visibility_timeout_sec,
    }  # fmt: skip
    for flag, value in given.items():
        if value is not None:
            argv += [flag, str(value.resolve() if isinstance(value, Path) else value)]
    argv += [
        flag for flag, on in (("--fresh", args.fresh), ("--no-iam", not args.iam), ("--resynth", args.resynth)) if on
    ]
    return lifecycle.detach(argv, state_file, work / lifecycle.UP_LOG)


def _self_argv() -> list[str]:
    """How to start this CLI again: its console script when that is how it was started."""
    script = Path(sys.argv[0])
    if script.name == "servestack" and script.is_file():
        return [str(script.resolve())]
    return [sys.executable, "-m", "servestack.cli.main"]


def state_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state", type=Path, default=None, help="state file of local up (default: the project's)")


def _state_path(args: argparse.Namespace) -> Path:
    from servestack.local.emulator import state

    return Path(args.state) if args.state else state.default_path()


def status_arguments(parser: argparse.ArgumentParser) -> None:
    state_argument(parser)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON, for scripts")


def run_status(args: argparse.Namespace) -> int:
    from servestack.local.commands import lifecycle

    return lifecycle.status(_state_path(args), sys.stdout, as_json=args.json)


def down_arguments(parser: argparse.ArgumentParser) -> None:
    state_argument(parser)
    parser.add_argument(
        "--timeout-sec", type=float, default=90, help="how long to wait for local up to stop before giving up"
    )


def run_down(args: argparse.Namespace) -> int:
    from servestack.local.commands import lifecycle

    return lifecycle.down(_state_path(args), timeout_sec=args.timeout_sec)


def logs_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "deployment", nargs="?", default=None, help="the deployment whose children's logs to show (default: all)"
    )
    parser.add_argument("-f", "--follow", action="store_true", help="keep printing new lines until Ctrl-C")
    parser.add_argument(
        "--since", default=None, help="only lines from this long ago (30s, 10m, 2h, 1d) or since a time (UTC ISO 8601)"
    )
    parser.add_argument("--tail", type=int, default=None, help="only the last N lines (default: all)")
    parser.add_argument("-t", "--timestamps", action="store_true", help="show each line's time (UTC)")


def run_logs(args: argparse.Namespace) -> int:
    from servestack import project
    from servestack.local import logs

    root = project.find_project()
    if root is None:
        raise CommandError(project.not_found_hint())
    since = logs.parse_since(args.since) if args.since else None
    if args.tail is not None and args.tail < 0:
        raise CommandError(f"--tail: {args.tail} is negative; give a number of lines, 0 or more")
    work = root / project.STATE_DIR
    logs.check_deployment(work, args.deployment, _deployment_names(root / project.SPEC_FILE))
    return logs.show(work, args.deployment, follow=args.follow, since=since, tail=args.tail, timestamps=args.timestamps)


def _deployment_names(spec_file: Path) -> list[str]:
    from servestack.spec import SpecError, load_spec

    try:
        return list(load_spec(spec_file, check_artifacts=False).deployments)
    except (SpecError, OSError):
        return []


def put_input_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="the batch deployment in serving.yaml")
    parser.add_argument(
        "files",
        nargs="+",
        type=Path,
        help="input files, each keyed by its name: rows (.jsonl, .ndjson, .json, .csv, .parquet), or any other file "
        "(an image, audio...) as one record for a model whose preprocess hook reads it",
    )
    state_argument(parser)


def run_put_input(args: argparse.Namespace) -> int:
    from servestack.local.batch.data import put_input

    return put_input(args.name, args.files, state_path=args.state)
