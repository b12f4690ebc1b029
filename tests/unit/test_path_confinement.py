"""Path confinement: registry fetches, directory-registry keys and target-model names never reach outside the
directory they belong to, and a hostile name is a 4xx, never a 500 (servestack/inference/paths.py,
servestack/inference/service.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from servestack.adapters.app import ServingApp
from servestack.inference.cache import ModelCache
from servestack.inference.errors import InvalidInput, ModelLoadError, RegistryError, ServingError, UnsafePath
from servestack.inference.paths import confined
from servestack.inference.registry import DirectoryStore, ModelRegistry
from servestack.inference.settings import ServingSettings
from tests.conftest import ARTIFACTS

DIGITS = ARTIFACTS / "digits" / "1"
SAMPLE = (DIGITS / "sample-request.json").read_bytes()


@pytest.mark.parametrize(
    "relative",
    ["/etc/passwd", "../outside", "a/../../outside", "a/b/../../../outside", "", "a\x00b", "a\\..\\b", "x" * 2000],
)
def test_confined_refuses_whatever_would_leave_the_root(tmp_path: Path, relative: str) -> None:
    with pytest.raises(UnsafePath) as caught:
        confined(tmp_path, relative)
    assert caught.value.status_code == 400
    assert str(tmp_path) not in json.dumps(caught.value.to_dict())


def test_confined_refuses_a_link_that_leads_out_and_keeps_what_stays_in(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "out").symlink_to(tmp_path)
    assert confined(root, "sub/file") == root / "sub" / "file"
    with pytest.raises(UnsafePath):
        confined(root, "out/secret")


@pytest.fixture
def registry(tmp_path: Path) -> ModelRegistry:
    registry = ModelRegistry(DirectoryStore(tmp_path / "registry"))
    registry.push(DIGITS / "model.onnx", name="digits", version="1")
    return registry


@pytest.mark.parametrize("file_name", ["/tmp/servestack-escape/model.onnx", "../../escape.onnx", "sub/model.onnx"])
def test_fetch_never_writes_outside_the_cache(registry: ModelRegistry, tmp_path: Path, file_name: str) -> None:
    # GIVEN a registry version whose manifest names its model file with a path (absolute or climbing out)
    manifest_key = "digits/1/manifest.json"
    manifest = json.loads(registry.store.read(manifest_key) or b"{}")
    manifest["file"] = file_name
    registry.store.write(manifest_key, json.dumps(manifest).encode())
    cache_dir = tmp_path / "cache"
    before = set(tmp_path.rglob("*"))
    # WHEN it is fetched THEN the fetch fails as a load error and no file appears anywhere new
    with pytest.raises(ModelLoadError) as caught:
        registry.fetch("digits", "1", cache_dir)
    assert "file" in caught.value.message
    created = set(tmp_path.rglob("*")) - before
    assert all(cache_dir in p.parents or p == cache_dir for p in created), created
    assert not Path("/tmp/servestack-escape").exists()


@pytest.mark.parametrize(("name", "version"), [("../elsewhere", "1"), ("digits", "../../x"), ("/abs", "1")])
def test_fetch_refuses_names_that_are_paths(registry: ModelRegistry, tmp_path: Path, name: str, version: str) -> None:
    with pytest.raises(RegistryError):
        registry.fetch(name, version, tmp_path / "cache")


def test_a_directory_store_refuses_keys_that_climb_out(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path / "registry")
    (tmp_path / "secret").write_text("not yours")
    with pytest.raises(UnsafePath):
        store.read("../secret")
    with pytest.raises(UnsafePath):
        store.write("../planted", b"x")
    with pytest.raises(UnsafePath):
        store.keys("../")
    assert not (tmp_path / "planted").exists()


HOSTILE_TARGETS = [
    "../elsewhere/foo@1",
    "../elsewhere/foo/1",
    "@",
    "@1",
    "/",
    "x" * 5000,
    "digits@" + "9" * 5000,
    "digits/../../elsewhere/foo",
    "digits@1/../../x",
    "/etc/passwd",
    "digits\x00",
    "DIGITS",
    "dígits",
]


@pytest.fixture
def mme(tmp_path: Path) -> ServingApp:
    """A multi-model app on a directory registry, with a valid package next to (outside) the registry."""
    inside = ModelRegistry(DirectoryStore(tmp_path / "registry"))
    inside.push(DIGITS / "model.onnx", name="digits", version="1")
    ModelRegistry(DirectoryStore(tmp_path / "elsewhere")).push(DIGITS / "model.onnx", name="foo", version="1")
    settings = ServingSettings(
        registry_uri=str(tmp_path / "registry"), cache_dir=tmp_path / "cache", default_model="digits", warmup=False
    )
    cache = ModelCache(settings, inside)
    cache.load_all()
    return ServingApp(cache)


def post(app: ServingApp, target: str) -> httpx.Response:
    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://mme") as client:
            return await client.post(
                "/invocations",
                content=SAMPLE,
                headers={"content-type": "application/json", "x-amzn-sagemaker-target-model": target.encode()},
            )

    return asyncio.run(call())


@pytest.mark.parametrize("target", HOSTILE_TARGETS, ids=range(len(HOSTILE_TARGETS)))
def test_hostile_target_models_are_a_4xx_and_load_nothing(mme: ServingApp, tmp_path: Path, target: str) -> None:
    # GIVEN a multi-model app WHEN a target-model header names a path, nothing, or 5,000 characters
    answer = post(mme, target)
    # THEN the answer is a JSON 4xx naming the header, and nothing from outside the registry was loaded
    assert 400 <= answer.status_code < 500, answer.text
    error = answer.json()["error"]
    assert error["type"] in ("InvalidInput", "ModelNotFound")
    assert len(answer.content) < 2000
    assert str(tmp_path) not in answer.text
    assert not (tmp_path / "cache" / "foo").exists()
    assert all(not key.startswith("foo") for key in mme.cache_metrics()["resident"])
    # AND the app keeps serving
    assert post(mme, "digits@1").status_code == 200


@pytest.mark.parametrize("target", HOSTILE_TARGETS, ids=range(len(HOSTILE_TARGETS)))
def test_hostile_targets_are_invalid_input_for_single_model_serving(target: str) -> None:
    from servestack.inference.service import ModelRepository

    repository = ModelRepository(ServingSettings(warmup=False))
    repository.load_all()
    with pytest.raises(ServingError) as caught:
        repository.resolve(target)
    assert isinstance(caught.value, InvalidInput) or caught.value.status_code == 404
    assert len(json.dumps(caught.value.to_dict())) < 2000
