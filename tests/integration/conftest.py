"""Integration fixtures: a real AWS endpoint over HTTP.

`AWS_ENDPOINT_URL` set: the tests use it as is (LocalStack, a moto server, AWS itself). Unset: an embedded
moto server (`ThreadedMotoServer`) starts for the session. Every test creates its own uniquely named
resources, so runs never collide.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from servestack.local.emulator.moto_server import EmbeddedEmulator, aws_environment, clients


@dataclass
class Aws:
    url: str
    clients: dict[str, Any]

    def __getattr__(self, name: str) -> Any:
        return self.clients[name]


@pytest.fixture(scope="session")
def aws() -> Iterator[Aws]:
    external = os.environ.get("AWS_ENDPOINT_URL")
    emulator = None if external else EmbeddedEmulator()
    url = external or emulator.url  # type: ignore[union-attr]
    saved = {
        k: os.environ.get(k)
        for k in ("AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    }
    os.environ.update(aws_environment(url))
    yield Aws(url, clients(url))
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    if emulator is not None:
        emulator.stop()


@pytest.fixture
def unique() -> str:
    """A short unique deployment name (DNS style) for this test's resources."""
    return f"t{uuid.uuid4().hex[:10]}"
