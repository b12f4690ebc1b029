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
    up = local_commands.add_parser(
        "up",
        help="run the synthesized templates of serving.yaml on this machine, IAM enforced, and print how to call them",
    )
    up.add_argument(
        "--spec", type=Path, default=None, help="serving.yaml (default: the nearest one, this folder or above)"
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
    up.add_argument("--workers", type=int, default=1, help="worker processes of each realtime container (default: 1)")
    up.add_argument(
        "--endpoint-url",
        default=None,
        help="an external AWS emulator such as LocalStack, which does not enforce IAM "
        "(default: AWS_ENDPOINT_URL, else an embedded moto server)",
    )
    up.add_argument("--emulator-port", type=int, default=0, help="embedded emulator port (default: a free one)")
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
        help="debugging only: do not enforce the templates' IAM policies (local mode then allows what AWS refuses)",
    )
    up.add_argument(
        "--explain",
        action="store_true",
        help="list every resource of the templates, its local name, and whether it is emulated or only reported",
    )
    up.add_argument("--resynth", action="store_true", help="synthesize even when the inputs are unchanged")
    up.add_argument(
        "--visibility-timeout-sec",
        type=int,
        default=None,
        help="override the job queues' visibility timeout (default: the template's, 6x the worker timeout + "
        "the batching window); a deviation from the deploy, printed at start",
    )

    rehearse = local_commands.add_parser(
        "deploy", help="rehearse a blue/green release of a realtime deployment (canary/linear, alarms, rollback)"
    )
    rehearse.add_argument("name", help="the realtime deployment in serving.yaml")
    rehearse.add_argument("--version", required=True, help="the registry version (or alias) to release")
    rehearse.add_argument("--inject-faults", default=None, help="green misbehaves: error_rate=0.2,latency_ms=50")
    rehearse.add_argument("--strategy", choices=["canary", "linear", "all_at_once"], default=None)
    rehearse.add_argument("--canary-percent", type=int, default=None, help="default: the deployment's strategy")
    rehearse.add_argument("--linear-step-percent", type=int, default=None)
    rehearse.add_argument("--interval-sec", type=float, default=None, help="default: strategy interval_minutes")
    rehearse.add_argument("--bake-sec", type=float, default=None, help="default: strategy bake_minutes")
    rehearse.add_argument("--period-sec", type=int, default=None, help="alarm period (default: alarms.period_sec)")
    rehearse.add_argument("--evaluation-periods", type=int, default=None, help="default: alarms.evaluation_periods")
    rehearse.add_argument("--traffic-rps", type=float, default=20.0, help="sample requests per second meanwhile")
    rehearse.add_argument(
        "--output", type=Path, default=None, help="outcome JSON (default .servestack/deploy-NAME.json)"
    )
    rehearse.add_argument("--state", type=Path, default=None, help="state file of local up")

    batch = local_commands.add_parser(
        "run-batch", help="run a batch deployment now: invoke its function with its schedule's input"
    )
    batch.add_argument("name", help="the batch deployment in serving.yaml")
    batch.add_argument("--state", type=Path, default=None, help="state file of local up")
    batch.add_argument("--strict", action="store_true", help="stop at the first bad row")
    batch.add_argument("--chunk-rows", type=int, default=None, help="rows per chunk and per output part")
    batch.add_argument("--output-prefix", default=None, help="write here instead of the deployment's output prefix")

    invoke = commands.add_parser("invoke", help="call a deployment of the running local up (async: wait for it)")
    invoke.add_argument("name", help="the deployment in serving.yaml")
    invoke.add_argument("--data", type=Path, required=True, help="request body (.json, .csv or .npy)")
    invoke.add_argument("--state", type=Path, default=None, help="state file of local up")
    invoke.add_argument("--timeout-sec", type=float, default=120, help="how long to wait for an async job")

    from servestack.registry_commands import add_parser as add_models_parser

    add_models_parser(commands)
    from servestack.plan import add_parser as add_plan_parser

    add_plan_parser(commands)

    load = commands.add_parser("loadtest", help="drive an endpoint and report QPS, latency and what to provision")
    load.add_argument("target", help="an http:// URL (e.g. http://127.0.0.1:8080/invocations)")
    load.add_argument("--data", type=Path, default=None, help="request body (default: the digits sample request)")
    load.add_argument("--content-type", default=None, help="default: from the file extension (.json, .csv, .npy)")
    mode = load.add_mutually_exclusive_group()
    mode.add_argument("--concurrency", type=int, default=None, help="closed loop with this many connections")
    mode.add_argument("--rate", type=float, default=None, help="open loop at this many requests per second")
    load.add_argument("--duration", type=float, default=10.0, help="seconds (default 10)")
    load.add_argument("--timeout", type=float, default=10.0, help="per-request timeout in seconds (default 10)")
    load.add_argument(
        "--honour-retry-after", action="store_true", help="closed loop: wait as a 429/503 Retry-After says"
    )
    load.add_argument("--target-qps", type=float, default=None, help="QPS to provision for (default: measured)")
    load.add_argument("--report", type=Path, default=Path("loadtest.json"), help="JSON report (default loadtest.json)")
    load.add_argument("--plot", type=Path, default=Path("loadtest.png"), help="PNG plot (default loadtest.png)")

    serve = commands.add_parser("serve", help="run the realtime container entry in the foreground (as `serve`)")
    serve.set_defaults(command="serve")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "local" and args.local_command == "up":
        from servestack.local.up import UpOptions, run

        return run(
            UpOptions(
                spec_path=args.spec,
                port=args.port,
                aws_port=args.aws_port,
                emulator_port=args.emulator_port,
                endpoint_url=args.endpoint_url,
                state_path=args.state,
                workers=args.workers,
                fresh=args.fresh,
                data_dir=args.data_dir,
                iam=args.iam,
                explain=args.explain,
                resynth=args.resynth,
                visibility_timeout_sec=args.visibility_timeout_sec,
            )
        )
    if args.command == "local" and args.local_command == "deploy":
        from servestack.local.deploy import deploy

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
        )
    if args.command == "models":
        from servestack import registry_commands

        return registry_commands.run(args)
    if args.command == "local" and args.local_command == "run-batch":
        from servestack.local.commands import run_batch

        return run_batch(
            args.name,
            state_path=args.state,
            strict=args.strict,
            chunk_rows=args.chunk_rows,
            output_prefix=args.output_prefix,
        )
    if args.command == "invoke":
        from servestack.local.commands import invoke

        return invoke(args.name, args.data, state_path=args.state, timeout_sec=args.timeout_sec)
    if args.command == "loadtest":
        return loadtest(args)
    if args.command == "plan":
        from servestack import plan

        return plan.run(args)
    if args.command == "serve":
        from handlers.realtime import main as serve_main

        serve_main(["serve"])
        return 0
    raise AssertionError(f"unhandled command {args.command}")  # argparse rejects unknown commands first


CONTENT_TYPES = {".json": "application/json", ".csv": "text/csv", ".npy": "application/x-npy"}


def loadtest(args: argparse.Namespace) -> int:
    from servestack import loadtest as engine
    from servestack.local.processes import REPO_ROOT

    data: Path = args.data or REPO_ROOT / "models" / "artifacts" / "digits" / "1" / "sample-request.json"
    content_type = args.content_type or CONTENT_TYPES.get(data.suffix.lower())
    if content_type is None:
        print(
            f"--content-type: cannot tell from {data.name!r}; give one of {sorted(CONTENT_TYPES.values())}",
            file=sys.stderr,
        )
        return 2
    try:
        target = engine.Target.from_url(args.target, data.read_bytes(), content_type)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    concurrency = args.concurrency if args.concurrency or args.rate else 64
    report, samples = engine.run(
        target,
        duration_sec=args.duration,
        concurrency=concurrency,
        rate=args.rate,
        timeout_sec=args.timeout,
        target_qps=args.target_qps,
        honour_retry_after=args.honour_retry_after,
    )
    print(report.summary())
    args.report.write_text(report.to_json())
    if samples:
        engine.plot(samples, args.plot, f"{args.target} - {report.mode}")
    print(f"wrote {args.report} and {args.plot}")
    return 0 if report.statuses else 1


if __name__ == "__main__":
    sys.exit(main())
