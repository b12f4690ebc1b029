"""Property tests of the HTTP app (servestack/adapters/app.py) with hostile headers and bodies.

Driven through httpx's ASGI transport rather than a server process: hundreds of requests run in seconds;
an exception the app lets out reaches this test (the transport re-raises it) instead of hiding behind a 500
in a server log; and the memory measured is the app's own, around each request. What only a socket shows
(stalled uploads, 413 to urllib, limits of the local fronts) is tested on real servers in
tests/functional/test_hostile_clients.py and test_local_fronts.py.

Each run proves: no 5xx; every 4xx is the JSON error shape; nothing escapes the app; and one request raises
the process's peak resident memory by a bounded amount.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib

import httpx
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from servestack.adapters.app import ServingApp
from servestack.inference.service import ModelRepository
from servestack.inference.settings import ServingSettings
from tests.conftest import ARTIFACTS
from tests.memory import peak_rss_growth
from tests.unit.test_codec_properties import csv_bodies, json_bodies, npy_bodies

SAMPLE = (ARTIFACTS / "digits" / "1" / "sample-request.json").read_bytes()
MEMORY_BOUND_BYTES = 32 * 1024 * 1024


@pytest.fixture(scope="module")
def app() -> ServingApp:
    repository = ModelRepository(ServingSettings(warmup=False, reject_pause_ms=0))
    repository.load_all()
    return ServingApp(repository)


# Header values as a hostile client can send them: any printable latin-1, or one of the values that matter.
def header_values(*meaningful: str) -> st.SearchStrategy[bytes]:
    printable = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"))
    return st.one_of(st.sampled_from(meaningful), printable.filter(lambda text: len(text) < 300)).map(
        lambda text: text.encode("latin-1")
    )


content_types = header_values(
    "application/json", "text/csv", "application/x-npy", "application/json; charset=utf-16", "", "*/*", "x/y"
)
accepts = header_values(
    "application/json;q=0", "*/*;q=0", "text/csv;q=0.5, application/x-npy", "application/*", "x;q=2", "*/*", ""
)
encodings = header_values("gzip", "deflate", "x-gzip", "identity", "br", "gzip, gzip", "compress", "")
targets = header_values("digits", "digits@1", "digits/1.tar.gz", "../elsewhere/foo@1", "@", "x" * 5000, "")


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, dict[str, bytes], bytes]:
    body = draw(st.one_of(json_bodies(), csv_bodies(), npy_bodies(), st.just(SAMPLE)))
    headers: dict[str, bytes] = {}
    for name, values in (
        ("content-type", content_types),
        ("accept", accepts),
        ("x-amzn-sagemaker-target-model", targets),
        ("x-amzn-sagemaker-custom-attributes", header_values("trace=1")),
    ):
        if draw(st.booleans()):
            headers[name] = draw(values)
    if draw(st.integers(0, 3)) == 0:
        encoding = draw(encodings)
        headers["content-encoding"] = encoding
        if encoding in (b"gzip", b"x-gzip"):
            body = gzip.compress(body)
        elif encoding == b"deflate":
            body = zlib.compress(body)
    path = draw(st.sampled_from(["/invocations", "/v1/models/digits/predict", "/v1/models/nope/predict"]))
    return path, headers, body


async def send(app: ServingApp, path: str, headers: dict[str, bytes], body: bytes) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)  # raise_app_exceptions: an escaped exception fails the test
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        return await client.post(path, content=body, headers=headers)


@given(request=requests())
def test_no_request_gets_a_5xx_or_escapes_the_app(
    app: ServingApp, request: tuple[str, dict[str, bytes], bytes]
) -> None:
    path, headers, body = request
    with peak_rss_growth() as growth:
        response = asyncio.run(send(app, path, headers, body))
    assert response.status_code < 500, response.text
    assert growth.bytes < MEMORY_BOUND_BYTES
    if response.status_code >= 400:
        assert response.headers["content-type"] == "application/json"
        error = orjson.loads(response.content)["error"]
        assert error["type"]
        assert error["message"]
        assert len(response.content) < 4096
    else:
        assert response.headers["content-type"] in ("application/json", "text/csv", "application/x-npy")


def test_the_sample_is_served_through_the_same_transport(app: ServingApp) -> None:
    # The property above can only be trusted if good requests do get through this way.
    response = asyncio.run(send(app, "/invocations", {"content-type": b"application/json"}, SAMPLE))
    assert response.status_code == 200
    assert json.loads(response.content)["predictions"] == [0, 1, 2, 3]
