"""One local stand-in for an AWS service, as a child process of `local up`.

`python -m servestack.local.runner ROLE DEPLOYMENT --spec serving.yaml [--port N] [--invoke-port N]`, with the
deployment's `SERVESTACK_*` variables and `AWS_ENDPOINT_URL` in the environment (local up sets them):
- `http`: API Gateway HTTP API in front of the serverless handler, or of the async submit handler;
- `poller`: the SQS event source mapping feeding the async worker handler;
- `scheduler`: EventBridge Scheduler invoking the batch handler on the deployment's schedule.
Each handler is imported by the dotted path the CDK stacks use, and invoked with a Lambda context and the
function's timeout. With `--invoke-port`, the same functions also answer the Lambda Invoke API there
(servestack/local/lambda_invoke.py), so `lambda.invoke` runs them in this process.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

from servestack.local.lambda_invoke import FunctionHost, capture_output
from servestack.local.lambda_runtime import HttpFront, LocalFunction
from servestack.local.resources import HANDLERS, scheduler_payload
from servestack.spec import AsyncDeployment, BatchDeployment, ServerlessDeployment, load_spec

logger = logging.getLogger("servestack.local")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="servestack.local.runner", description=__doc__)
    parser.add_argument("role", choices=["http", "poller", "scheduler"])
    parser.add_argument("deployment")
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--invoke-port", type=int, default=None, help="serve the Lambda Invoke API here too")
    args = parser.parse_args(argv)
    capture_output()  # before logging and the handlers take their streams: invocation logs for LogType=Tail
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stdout, force=True)
    logging.getLogger("botocore").setLevel(logging.WARNING)
    spec = load_spec(args.spec, check_artifacts=False)  # local up checked the packages before starting us
    d = spec.deployments[args.deployment]
    stop = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, request_stop)

    def host(function: LocalFunction) -> FunctionHost | None:
        if args.invoke_port is None:
            return None
        invoke = FunctionHost({function.name: function}, args.invoke_port).serve_in_background()
        print(f"lambda invoke api for {function.name} on {invoke.url}", flush=True)
        return invoke

    if args.role == "http":
        if isinstance(d, ServerlessDeployment):
            function = LocalFunction(args.deployment, HANDLERS["serverless"], timeout_sec=d.timeout_sec)
        elif isinstance(d, AsyncDeployment):
            function = LocalFunction(f"{args.deployment}-submit", HANDLERS["async-submit"], timeout_sec=15)
        else:
            parser.error(f"http: {args.deployment} is {d.mode}, not serverless or async")
        front = HttpFront(function, args.port)
        front.serve_in_background()
        invoke = host(function)
        print(f"listening on {front.url}", flush=True)
        stop.wait()
        front.close()
        if invoke is not None:
            invoke.close()
        return 0
    if args.role == "poller":
        if not isinstance(d, AsyncDeployment):
            parser.error(f"poller: {args.deployment} is {d.mode}, not async")
        import handlers.asynchronous
        from servestack.local.emulator import clients
        from servestack.local.poller import SqsPoller

        handlers.asynchronous.service()  # what Lambda's init phase does: load and warm the model first
        sqs = clients(os.environ["AWS_ENDPOINT_URL"])["sqs"]
        worker = LocalFunction(f"{args.deployment}-worker", HANDLERS["async-worker"], timeout_sec=d.timeout_sec)
        poller = SqsPoller(
            sqs,
            os.environ["SERVESTACK_QUEUE_URL"],
            worker,
            batch_size=d.batch_size,
            batch_window_sec=d.batch_window_sec,
        )
        invoke = host(worker)
        print(f"polling {os.environ['SERVESTACK_QUEUE_URL']} (batch {d.batch_size}, window {d.batch_window_sec}s)")
        sys.stdout.flush()
        poller.run(stop)
        if invoke is not None:
            invoke.close()
        return 0
    if not isinstance(d, BatchDeployment):
        parser.error(f"scheduler: {args.deployment} is {d.mode}, not batch")
    from servestack.local.schedule import parse_schedule

    schedule = parse_schedule(d.schedule, d.timezone)
    function = LocalFunction(args.deployment, HANDLERS["batch"], timeout_sec=d.timeout_sec)
    payload = scheduler_payload(spec, args.deployment)
    invoke = host(function)
    while not stop.is_set():
        fire = schedule.next_after(datetime.now(UTC))
        print(f"next run {fire.isoformat()} ({d.schedule} {d.timezone})", flush=True)
        if stop.wait(max(0.0, (fire - datetime.now(UTC)).total_seconds())):
            break
        try:
            print(f"run finished: {function.invoke(payload)}", flush=True)
        except Exception:
            logger.exception("%s: scheduled run failed", args.deployment)
    if invoke is not None:
        invoke.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
