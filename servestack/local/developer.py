"""The developer's identity in a running local up: the keys its state file records, and a boto3 session with
them, for the CLI commands that act as the developer (invoke, run-batch, put-input)."""

from __future__ import annotations

from typing import Any


def developer(about: dict[str, Any]) -> Any:
    from servestack.local.iam.identities import DEVELOPER, Credentials

    keys = about.get("developer")
    if not isinstance(keys, dict):  # a state file that records none: the documented default keys
        return DEVELOPER
    return Credentials.from_dict(keys)


def sagemaker_runtime(about: dict[str, Any]) -> Any:
    import boto3
    from botocore.config import Config

    keys = developer(about)
    session = boto3.session.Session(
        aws_access_key_id=keys.access_key_id,
        aws_secret_access_key=keys.secret_access_key,
        region_name=about.get("region", "us-east-1"),
    )
    config = Config(retries={"mode": "standard", "max_attempts": 1}, read_timeout=960)
    return session, config
