"""The AWS endpoint `local up` talks to: an embedded moto server over real HTTP, or an external one.

`--endpoint-url URL` (or `AWS_ENDPOINT_URL`) selects an external emulator such as LocalStack; otherwise
moto's `ThreadedMotoServer` starts in this process on the requested or a free port. Every child process
gets `aws_environment(url)` so that boto3 (which honours `AWS_ENDPOINT_URL`) talks to the same place.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from servestack.local.lambda_runtime import REGION

FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


def aws_environment(endpoint_url: str) -> dict[str, str]:
    """What a process needs to use the emulator: endpoint, region, and credentials unless real ones are set."""
    env = {"AWS_ENDPOINT_URL": endpoint_url, "AWS_DEFAULT_REGION": os.environ.get("AWS_DEFAULT_REGION", REGION)}
    if "AWS_ACCESS_KEY_ID" not in os.environ:
        env |= FAKE_CREDENTIALS
    return env


def clients(endpoint_url: str) -> dict[str, Any]:
    import boto3
    from botocore.config import Config

    env = aws_environment(endpoint_url)
    session = boto3.session.Session(
        aws_access_key_id=os.environ.get("AWS_ACCESS_KEY_ID", env.get("AWS_ACCESS_KEY_ID")),
        aws_secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY", env.get("AWS_SECRET_ACCESS_KEY")),
        region_name=env["AWS_DEFAULT_REGION"],
    )
    config = Config(s3={"addressing_style": "path"})
    return {
        name: session.client(name, endpoint_url=endpoint_url, config=config)
        for name in ("s3", "sqs", "dynamodb", "sns", "events")
    }


class EmbeddedEmulator:
    """moto's server in a thread of this process, speaking the AWS wire protocols over HTTP."""

    def __init__(self, port: int = 0, host: str = "127.0.0.1") -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
        self._server = ThreadedMotoServer(ip_address=host, port=port, verbose=False)
        self._server.start()
        bound_host, bound_port = self._server.get_host_and_port()
        self.url = f"http://{bound_host}:{bound_port}"

    def stop(self) -> None:
        self._server.stop()
