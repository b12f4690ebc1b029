"""AWS clients as every handler builds them.

They are botocore clients, made on one botocore session per process: what `boto3.client` returns, without
boto3's session layer, whose import (it pulls in s3transfer for S3's `upload_file` family, which no handler
uses) was the largest single import of the batch job's start-up. Every method the handlers call (`get_object`,
`put_object`, paginators, `generate_presigned_url`, `send_message`, `invoke_endpoint_async`, ...) is
botocore's. Code that needs boto3 itself (`boto3.resource("dynamodb")` in handlers/aws/jobs.py) imports it.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import botocore.session
from botocore.config import Config

# A botocore session is not safe to create clients from on several threads at once (boto3's docs say the
# same of its sessions); clients themselves are.
_session_lock = threading.Lock()


@functools.cache
def _session() -> botocore.session.Session:
    """The process's session: credentials, region and AWS_ENDPOINT_URL from the environment, as boto3's
    default session reads them (boto3 builds that session the same way)."""
    return botocore.session.get_session()


def aws_client(service: str, *, endpoint_url: str | None = None) -> Any:
    """A client honouring AWS_ENDPOINT_URL (an emulator), with botocore's `standard` retry mode and
    path-style S3 addressing, so any endpoint host works."""
    config = Config(s3={"addressing_style": "path"}, retries={"mode": "standard"})
    with _session_lock:
        return _session().create_client(service, endpoint_url=endpoint_url, config=config)
