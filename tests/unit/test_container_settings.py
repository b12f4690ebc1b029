"""The container's HTTP server is a setting: granian unless SERVESTACK_HTTP_SERVER says uvicorn; anything else is
refused with the variable's name, before a server starts."""

from __future__ import annotations

import pytest

from handlers.realtime import ContainerSettings
from models.errors import ConfigurationError


def test_granian_is_the_default_http_server() -> None:
    assert ContainerSettings.from_environment({}).http_server == "granian"


def test_uvicorn_can_be_chosen() -> None:
    assert ContainerSettings.from_environment({"SERVESTACK_HTTP_SERVER": "uvicorn"}).http_server == "uvicorn"


def test_an_unknown_http_server_names_the_variable() -> None:
    with pytest.raises(ConfigurationError) as caught:
        ContainerSettings.from_environment({"SERVESTACK_HTTP_SERVER": "hypercorn"})
    assert caught.value.field == "SERVESTACK_HTTP_SERVER"
    assert caught.value.value == "hypercorn"
