"""`servestack`: the command users run. Imports stay lazy so that `--help` answers at once."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="servestack", description="Serve ONNX models on AWS, and locally.")
    commands = parser.add_subparsers(dest="command", required=True)

    local = commands.add_parser("local", help="run the serving topology on this machine")
    local_commands = local.add_subparsers(dest="local_command", required=True)
    up = local_commands.add_parser("up", help="start every deployment locally and print how to call it")
    up.add_argument("--port", type=int, default=None, help="realtime port (default 8080, or a free one if taken)")
    up.add_argument("--model-dir", type=Path, default=None, help="model packages (default: the bundled ones)")
    up.add_argument("--model", default="digits", help="model that /invocations serves (default: digits)")
    up.add_argument("--workers", type=int, default=1, help="server worker processes (default: 1)")

    serve = commands.add_parser("serve", help="run the realtime container entry in the foreground (as `serve`)")
    serve.set_defaults(command="serve")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "local" and args.local_command == "up":
        from servestack.local.up import run

        return run(args.port, args.model_dir, args.model, args.workers)
    if args.command == "serve":
        from handlers.realtime import main as serve_main

        serve_main(["serve"])
        return 0
    raise AssertionError(f"unhandled command {args.command}")  # argparse rejects unknown commands first


if __name__ == "__main__":
    sys.exit(main())
