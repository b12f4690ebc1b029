"""The container's HTTP server is a setting: granian unless SERVESTACK_HTTP_SERVER says uvicorn; anything else is
refused with the variable's name, before a server starts. A serving worker tunes its garbage collector."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from servestack.adapters.app import create_app
from servestack.adapters.realtime import ContainerSettings
from servestack.inference.errors import ConfigurationError
from servestack.inference.service import ModelRepository
from servestack.inference.settings import ServingSettings
from tests.conftest import ARTIFACTS


def test_granian_is_the_default_http_server() -> None:
    assert ContainerSettings.from_environment({}).http_server == "granian"


def test_uvicorn_can_be_chosen() -> None:
    assert ContainerSettings.from_environment({"SERVESTACK_HTTP_SERVER": "uvicorn"}).http_server == "uvicorn"


def test_an_unknown_http_server_names_the_variable() -> None:
    with pytest.raises(ConfigurationError) as caught:
        ContainerSettings.from_environment({"SERVESTACK_HTTP_SERVER": "hypercorn"})
    assert caught.value.field == "SERVESTACK_HTTP_SERVER"
    assert caught.value.value == "hypercorn"


def test_a_serving_worker_collects_young_objects_rarely_and_freezes_what_start_up_built() -> None:
    # GIVEN a fresh interpreter that builds the serving worker's app as the HTTP server's factory does
    code = (
        "import gc; from servestack.adapters.realtime import create_server_app, YOUNG_COLLECTION_THRESHOLD; "
        "app = create_server_app(); frozen_before = gc.get_freeze_count(); app._load_quietly(); "
        "print(app.repository.state, gc.get_threshold()[0] == YOUNG_COLLECTION_THRESHOLD, "
        "frozen_before == 0, gc.get_freeze_count() > 10_000)"
    )
    env = {**os.environ, "SERVESTACK_MODEL_DIR": str(ARTIFACTS / "digits" / "1")}
    # WHEN its models have loaded
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    # THEN the young generation's threshold is the worker's, and start-up's objects were frozen after the load
    assert done.stdout.split() == ["ready", "True", "True", "True"], done.stderr[-2000:]


def test_an_app_built_outside_the_server_leaves_the_collector_alone() -> None:
    # Tests and Lambda build apps in processes of their own; freezing their heaps is not the app's business.
    assert create_app(ModelRepository(ServingSettings())).freeze_after_load is False
