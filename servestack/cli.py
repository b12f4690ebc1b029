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
    up.add_argument("--workers", type=int, default=1, help="realtime server worker processes (default: 1)")
    up.add_argument("--spec", type=Path, default=None, help="serving.yaml (default: ./serving.yaml)")
    up.add_argument(
        "--endpoint-url",
        default=None,
        help="an external AWS emulator such as LocalStack (default: AWS_ENDPOINT_URL, else an embedded moto server)",
    )
    up.add_argument("--emulator-port", type=int, default=0, help="embedded emulator port (default: a free one)")
    up.add_argument("--state", type=Path, default=None, help="state file (default: .servestack/local.json)")
    up.add_argument(
        "--visibility-timeout-sec",
        type=int,
        default=None,
        help="SQS visibility timeout (default: as the CDK stack, 6x the worker timeout + the batching window)",
    )

    batch = local_commands.add_parser("run-batch", help="run a batch deployment now against the running local up")
    batch.add_argument("name", help="the batch deployment in serving.yaml")
    batch.add_argument("--state", type=Path, default=None, help="state file of local up")
    batch.add_argument("--spec", type=Path, default=None, help="serving.yaml (default: the one local up runs)")
    batch.add_argument("--endpoint-url", default=None, help="AWS endpoint (default: the one local up runs)")
    batch.add_argument("--strict", action="store_true", help="stop at the first bad row")
    batch.add_argument("--chunk-rows", type=int, default=None, help="rows per chunk and per output part")
    batch.add_argument("--output-prefix", default=None, help="write here instead of the deployment's output prefix")

    invoke = commands.add_parser("invoke", help="call a deployment of the running local up (async: wait for it)")
    invoke.add_argument("name", help="the deployment in serving.yaml")
    invoke.add_argument("--data", type=Path, required=True, help="request body (.json, .csv or .npy)")
    invoke.add_argument("--state", type=Path, default=None, help="state file of local up")
    invoke.add_argument("--timeout-sec", type=float, default=120, help="how long to wait for an async job")

    serve = commands.add_parser("serve", help="run the realtime container entry in the foreground (as `serve`)")
    serve.set_defaults(command="serve")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "local" and args.local_command == "up":
        from servestack.local.up import run

        return run(
            args.port,
            args.model_dir,
            args.workers,
            spec_path=args.spec,
            endpoint_url=args.endpoint_url,
            emulator_port=args.emulator_port,
            state_path=args.state,
            visibility_timeout_sec=args.visibility_timeout_sec,
        )
    if args.command == "local" and args.local_command == "run-batch":
        from servestack.local.commands import run_batch

        return run_batch(
            args.name,
            state_path=args.state,
            spec_path=args.spec,
            endpoint_url=args.endpoint_url,
            strict=args.strict,
            chunk_rows=args.chunk_rows,
            output_prefix=args.output_prefix,
        )
    if args.command == "invoke":
        from servestack.local.commands import invoke

        return invoke(args.name, args.data, state_path=args.state, timeout_sec=args.timeout_sec)
    if args.command == "serve":
        from handlers.realtime import main as serve_main

        serve_main(["serve"])
        return 0
    raise AssertionError(f"unhandled command {args.command}")  # argparse rejects unknown commands first


if __name__ == "__main__":
    sys.exit(main())
