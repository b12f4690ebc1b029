"""The AWS endpoint `local up` talks to: an embedded moto server over real HTTP, or an external one.

`--endpoint-url URL` (or `AWS_ENDPOINT_URL`) selects an external emulator such as LocalStack; otherwise
moto's server starts in this process on the requested or a free port, served by werkzeug exactly as moto's
`ThreadedMotoServer` serves it, with one difference: its WSGI app can be wrapped (local up wraps it in the
IAM engine, so every call is checked against the caller's policies before moto sees it).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from servestack.local.iam.identities import DEVELOPER, Credentials

SERVICES = ("s3", "sqs", "dynamodb", "sns", "events", "iam", "sts", "logs")
DEFAULT_REGION = "us-east-1"


def region() -> str:
    return os.environ.get("AWS_DEFAULT_REGION") or DEFAULT_REGION


def aws_environment(endpoint_url: str, credentials: Credentials = DEVELOPER) -> dict[str, str]:
    """What a process needs to use the emulator as `credentials` (default: the developer identity)."""
    return {"AWS_ENDPOINT_URL": endpoint_url, "AWS_DEFAULT_REGION": region(), **credentials.environment()}


def clients(endpoint_url: str, credentials: Credentials = DEVELOPER) -> dict[str, Any]:
    """boto3 clients on the emulator, as `credentials` (default: the developer identity)."""
    return clients_for(endpoint_url, credentials, region())


def client_as(service: str, endpoint_url: str, credentials: Credentials, region: str) -> Any:
    """A boto3 client for `service` on the emulator, signing as `credentials`."""
    import boto3
    from botocore.config import Config

    session = boto3.session.Session(
        aws_access_key_id=credentials.access_key_id,
        aws_secret_access_key=credentials.secret_access_key,
        aws_session_token=credentials.session_token,
        region_name=region,
    )
    config = Config(s3={"addressing_style": "path"}, retries={"mode": "standard"})
    return session.client(service, endpoint_url=endpoint_url, config=config)


def clients_for(endpoint_url: str, credentials: Credentials, region: str) -> dict[str, Any]:
    return {service: client_as(service, endpoint_url, credentials, region) for service in SERVICES}


class EmbeddedEmulator:
    """moto's server in a thread of this process, speaking the AWS wire protocols over HTTP."""

    def __init__(
        self, port: int = 0, host: str = "127.0.0.1", *, middleware: Callable[[Any], Any] | None = None
    ) -> None:
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
        app: Any = DomainDispatcherApplication(create_backend_app)
        if middleware is not None:
            app = middleware(app)
        self._server = make_server(host, port, app, threaded=True, request_handler=MotoRequestHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="moto", daemon=True)
        self._thread.start()
        bound_port = int(self._server.server_address[1])
        self.url = f"http://{host}:{bound_port}"

    def stop(self) -> None:
        self._server.shutdown()
        self._thread.join(timeout=10)
