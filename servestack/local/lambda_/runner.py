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
from servestack.local.lambda_.shipped import isolate

logger = logging.getLogger("servestack.local")


def runner_command(config: Path, port: int) -> list[str]:
    """The command that starts one execution environment for the function `config` describes, on `port`. `-P`:
    its working directory is the function's code (Lambda's /var/task), whose `servestack/` (the runtime alone)
    must not hide the installed servestack this runner comes from."""
    argv = ["-m", "servestack.local.lambda_.runner", "--config", str(config), "--port", str(port)]
    return [sys.executable, "-P", *argv]


# The folder of the packages the function's bundle ships, installed for this machine (set by the Lambda planner).
PACKAGES_ENV = "SERVESTACK_LOCAL_PACKAGES"


def add_task_root(environ: dict[str, str] | os._Environ[str] = os.environ) -> None:
    """Put the function's code (LAMBDA_TASK_ROOT) and its bundle's packages first on the path, as Lambda's
    runtime does, so its handler module (`handlers.serverless`) and its imports are what its code asset ships;
    with the packages known, nothing else is importable but the runtime's own (servestack/local/lambda_/shipped.py).
    """
    task_root = environ.get("LAMBDA_TASK_ROOT")
    if not task_root:
        return
    packages = environ.get(PACKAGES_ENV)
    if packages:
        isolate(task_root, packages)
    elif task_root not in sys.path:  # inline code (CodeDeploy's hook): the runtime's standard library and SDK
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
