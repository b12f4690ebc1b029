"""The AWS endpoint `local up` talks to: an embedded moto server over real HTTP, or an external one.

`--endpoint-url URL` (or `AWS_ENDPOINT_URL`) selects an external emulator such as LocalStack; otherwise
moto's server starts in this process on the requested or a free port, served by werkzeug exactly as moto's
`ThreadedMotoServer` serves it, with one difference: its WSGI app can be wrapped (local up wraps it in the
IAM engine, so every call is checked against the caller's policies before moto sees it).

moto's own admin API (`/moto-api/`: `POST /moto-api/reset` wipes every resource, others read or seed any
backend) has no counterpart in AWS and no IAM check: the emulator refuses all of it with 403 unless
`local up --allow-reset` (`allow_admin=True`). The refusal is made on the request as moto will route it, right
in front of moto's dispatcher, after the IAM enforcer's rewrites (issue 37: `POST /reset` with `Host:
moto-api.localhost:PORT`, a virtual-hosted bucket, became `/moto-api/reset` there), and again on the request as
sent (so that a path moto would not route there but a reader might, `//moto-api/reset`, gets the same answer).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

from servestack.local.hosting import listening_port
from servestack.local.iam import DEVELOPER, Credentials

SERVICES = ("s3", "sqs", "dynamodb", "sns", "events", "iam", "sts", "logs")
DEFAULT_REGION = "us-east-1"
ADMIN_PREFIX = "moto-api"


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
    from botocore.config import Config

    return session_client(
        service, endpoint_url=endpoint_url, region_name=region,
        config=Config(s3={"addressing_style": "path"}, retries={"mode": "standard"}),
        aws_access_key_id=credentials.access_key_id, aws_secret_access_key=credentials.secret_access_key,
        aws_session_token=credentials.session_token,
    )  # fmt: skip


def session_client(service: str, **options: Any) -> Any:
    """A boto3 client made on this process's one shared session, with `options` as `Session.client` takes them
    (keys, region, endpoint, config). A session of its own per client would load the service's model and the
    endpoint rules from disk again: profiling `local up`, which makes a client per service per role, found that
    to be over half of its own start-up time."""
    with _SESSION_LOCK:  # a boto3 session is not thread-safe; the clients it makes are
        return _shared_session().client(service, **options)


_SESSION_LOCK = threading.Lock()


@functools.cache
def _shared_session() -> Any:
    import boto3

    return boto3.session.Session()


def clients_for(endpoint_url: str, credentials: Credentials, region: str) -> dict[str, Any]:
    return {service: client_as(service, endpoint_url, credentials, region) for service in SERVICES}


class EmbeddedEmulator:
    """moto's server in a thread of this process, speaking the AWS wire protocols over HTTP."""

    def __init__(
        self,
        port: int = 0,
        host: str = "127.0.0.1",
        *,
        middleware: Callable[[Any], Any] | None = None,
        allow_admin: bool = False,
    ) -> None:
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
        app: Any = AtomicWrites(DomainDispatcherApplication(create_backend_app))
        if not allow_admin:
            app = AdminRefused(app)  # the request as moto routes it: after every rewrite of the middleware
        if middleware is not None:
            app = middleware(app)
        if not allow_admin:
            app = AdminRefused(app)  # and as it was sent
        self._server = make_server(
            host, listening_port(port, host), app, threaded=True, request_handler=MotoRequestHandler
        )
        self._thread = threading.Thread(target=self._server.serve_forever, name="moto", daemon=True)
        self._thread.start()
        bound_port = int(self._server.server_address[1])
        self.url = f"http://{host}:{bound_port}"

    def stop(self) -> None:
        self._server.shutdown()
        self._thread.join(timeout=10)


class AtomicWrites:
    """WSGI: the requests whose outcome AWS documents as atomic run one at a time in moto, the rest as they come.

    moto checks a write's condition, then writes, in Python, and the server answers each request on a thread of
    its own: two writers racing for one key could both see it free (an async job enqueued twice under load). AWS
    makes them atomic, and local mode must be no more lenient:
    - every DynamoDB call: a `ConditionExpression` holds at the moment of the write, and a transaction is seen
      whole (https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/WorkingWithItems.html,
      https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/transaction-apis.html);
    - an S3 write with `If-None-Match` or `If-Match`: of concurrent ones, one wins
      (https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-writes.html).
    The lock is held until the answer is whole: moto's answer is a list, so nothing is streamed under it."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if not _atomic(environ):
            result: Iterable[bytes] = self.app(environ, start_response)
            return result
        with self._lock:
            return list(self.app(environ, start_response))


def _atomic(environ: dict[str, Any]) -> bool:
    if str(environ.get("HTTP_X_AMZ_TARGET", "")).startswith("DynamoDB_"):
        return True
    return environ.get("REQUEST_METHOD") in ("PUT", "POST") and (
        "HTTP_IF_NONE_MATCH" in environ or "HTTP_IF_MATCH" in environ
    )


class AdminRefused:
    """WSGI: moto's `/moto-api/...` routes answer 403 (with a JSON body saying how to allow them); the rest
    passes. The path is the decoded one moto routes on (`DomainDispatcherApplication.get_application`: any
    `PATH_INFO` starting `/moto-api` is its admin API), and, wider, any with repeated leading slashes or
    another case."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        raw = environ.get("PATH_INFO", "")
        path = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        if path.startswith("/" + ADMIN_PREFIX) or path.lstrip("/").lower().split("/", 1)[0] == ADMIN_PREFIX:
            body = json.dumps({"error": {
                "type": "AccessDenied",
                "message": "moto's admin API is refused: it has no counterpart in AWS and would let any caller wipe "
                           "or seed every resource; start `servestack local up --allow-reset` to use it",
                "field": "path", "value": path[:200], "allowed": "AWS API calls",
            }}).encode()  # fmt: skip
            start_response("403 Forbidden", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        result: Iterable[bytes] = self.app(environ, start_response)
        return result
