"""The async worker as a process the chaos test can SIGKILL: the local SQS event source mapping
(`servestack.local.lambda_.poller.SqsPoller`) feeding `servestack.adapters.asynchronous.worker_handler` through a
`LocalFunction`, as `local up`'s poller runs it.

Started from a multiprocessing fork server that has imported this module (and so onnxruntime, numpy, boto3
and the handlers) once: a new worker is a fork that only loads the model, so 20 restarts cost seconds, not
the minute 20 fresh interpreters would.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import servestack.adapters.asynchronous
from servestack.local.emulator.moto_server import clients
from servestack.local.lambda_.poller import SqsPoller
from servestack.local.lambda_.runtime import LocalFunction


def run(environment: dict[str, str], queue_url: str, batch_size: int, handled: Any) -> None:
    """Poll `queue_url` forever, counting the messages of finished invocations in the shared `handled`."""
    os.environ.clear()
    os.environ.update(environment)
    servestack.adapters.asynchronous.service.cache_clear()
    servestack.adapters.asynchronous.service()  # Lambda's init: settings, model loaded and warmed
    sqs = clients(environment.get("AWS_ENDPOINT_URL_SQS") or environment["AWS_ENDPOINT_URL"])["sqs"]
    function = LocalFunction("worker", servestack.adapters.asynchronous.worker_handler, timeout_sec=60)
    poller = SqsPoller(sqs, queue_url, function, batch_size=batch_size, batch_window_sec=0, wait_sec=1)
    stop = threading.Event()
    while True:
        handled.value += poller.run_once(stop)  # this process is its only writer
