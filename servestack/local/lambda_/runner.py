"""One Lambda execution environment, as a child process of `local up`.

`python -m servestack.local.lambda_.runner --config FUNCTION.json --port N` imports the function's handler by the
dotted path its template gives (`servestack.adapters.asynchronous.worker_handler`), runs Lambda's init phase (the
import, which loads and warms the model), and answers the Lambda Invoke API on port N
(servestack/local/lambda_/invoke.py). Everything that invokes the function goes through that API, from the
`local up` process: the HTTP API front, the SQS event source mapping, the scheduler, and boto3's
`lambda.invoke`, as in the cloud, where they all are parts of the Lambda service and not of the function.

The environment is the function's own (the template's variables, resolved) plus what the Lambda runtime
sets (`AWS_LAMBDA_FUNCTION_NAME`, `AWS_REGION`, `LAMBDA_TASK_ROOT`...) and the credentials of the
function's execution role; `local up` builds it (servestack/local/up/world.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from servestack.local.lambda_.invoke import FunctionHost, capture_output
from servestack.local.lambda_.runtime import LocalFunction

logger = logging.getLogger("servestack.local")


def runner_command(config: Path, port: int) -> list[str]:
    """The command that starts one execution environment for the function `config` describes, on `port`. `-P`:
    its working directory is the function's code (Lambda's /var/task), whose `servestack/` (the runtime alone)
    must not hide the installed servestack this runner comes from."""
    argv = ["-m", "servestack.local.lambda_.runner", "--config", str(config), "--port", str(port)]
    return [sys.executable, "-P", *argv]


def add_task_root(environ: dict[str, str] | os._Environ[str] = os.environ) -> None:
    """Put the function's code (LAMBDA_TASK_ROOT) first on the path, as Lambda's runtime does, so its handler
    module (`handlers.serverless`) is the one its code asset ships. servestack itself is imported already, from
    the installation whose runtime files the asset carries a copy of."""
    task_root = environ.get("LAMBDA_TASK_ROOT")
    if task_root and task_root not in sys.path:
        sys.path.insert(0, task_root)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="servestack.local.lambda_.runner", description=__doc__)
    parser.add_argument("--config", type=Path, required=True, help="the function: name, handler, timeout, memory")
    parser.add_argument("--port", type=int, required=True, help="serve the Lambda Invoke API here")
    args = parser.parse_args(argv)
    capture_output()  # before logging and the handlers take their streams: invocation logs for LogType=Tail
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stdout, force=True)
    logging.getLogger("botocore").setLevel(logging.WARNING)
    config = json.loads(args.config.read_text(encoding="utf-8"))
    stop = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, request_stop)
    add_task_root()
    function = LocalFunction(
        config["name"], config["handler"], timeout_sec=config["timeout_sec"], memory_mib=config["memory_mib"]
    )
    host = FunctionHost({function.name: function}, args.port).serve_in_background()
    print(f"lambda {function.name} ready ({config['handler']}, invoke api {host.url})", flush=True)
    stop.wait()
    host.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
