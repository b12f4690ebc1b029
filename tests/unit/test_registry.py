"""The model registry: any ONNX file in one push, immutable versions, aliases with rollback, verified fetches;
on a directory and on S3 (moto's server over HTTP)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from servestack.adapters.aws.registry import open_registry
from servestack.inference.errors import ChecksumMismatch, ModelNotFound, RegistryError, VersionConflict
from servestack.inference.registry import DirectoryStore, ModelRegistry
from tests.conftest import ARTIFACTS

DIGITS = ARTIFACTS / "digits" / "1" / "model.onnx"
CANCER = ARTIFACTS / "breast-cancer" / "1" / "model.onnx"


@pytest.fixture(params=["directory", "s3"])
def registry(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ModelRegistry]:
    if request.param == "directory":
        yield open_registry(str(tmp_path / "registry"))
        return
    from moto.server import ThreadedMotoServer

    from servestack.local.emulator.moto_server import clients

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    s3 = clients(f"http://{host}:{port}")["s3"]
    s3.create_bucket(Bucket="models")
    yield open_registry("s3://models/registry/", client=s3)
    server.stop()


def test_push_writes_a_manifest_from_the_files_own_signature(registry: ModelRegistry) -> None:
    pushed = registry.push(DIGITS, name="digits", labels=[str(i) for i in range(10)])
    assert pushed.created
    assert pushed.manifest.version == "1"  # the first integer version
    assert [spec.name for spec in pushed.manifest.inputs] == ["input"]
    assert pushed.manifest.labels == tuple(str(i) for i in range(10))
    assert registry.push(DIGITS, name="digits").manifest.version == "2"  # next integer
    assert registry.names() == ["digits"]
    assert registry.versions("digits") == ["1", "2"]


def test_a_version_is_immutable(registry: ModelRegistry) -> None:
    registry.push(DIGITS, name="m", version="1")
    assert not registry.push(DIGITS, name="m", version="1").created  # same bytes: a no-op
    with pytest.raises(VersionConflict) as caught:
        registry.push(CANCER, name="m", version="1")
    assert caught.value.status_code == 409
    assert caught.value.field == "version"


def test_aliases_promote_resolve_and_roll_back(registry: ModelRegistry) -> None:
    for version in ("1", "2", "10"):
        registry.push(DIGITS, name="m", version=version)
    assert registry.resolve("m") == "10"  # no alias: the newest ('10' after '2')
    registry.promote("m", "1")
    registry.promote("m", "2")
    assert registry.resolve("m") == "2"
    assert registry.resolve("m", "live") == "2"
    change = registry.rollback("m")
    assert (change.previous, change.current) == ("2", "1")
    with pytest.raises(RegistryError) as caught:
        registry.rollback("m")
    assert caught.value.field == "alias"
    with pytest.raises(ModelNotFound) as missing:
        registry.resolve("m", "7")
    assert missing.value.allowed == "1, 2, 10, live"


def test_bad_names_and_versions_say_what_is_allowed(registry: ModelRegistry) -> None:
    with pytest.raises(RegistryError) as caught:
        registry.push(DIGITS, name="Bad_Name")
    assert (caught.value.field, caught.value.value) == ("name", "Bad_Name")
    with pytest.raises(RegistryError) as caught:
        registry.push(DIGITS, name="ok", version="/1")
    assert caught.value.field == "version"
    with pytest.raises(RegistryError, match="not a registry URI"):
        open_registry("ftp://x/y")


def test_fetch_verifies_the_bytes(registry: ModelRegistry, tmp_path: Path) -> None:
    registry.push(DIGITS, name="m", version="1")
    package = registry.fetch("m", "1", tmp_path / "cache")
    assert (package / "model.onnx").read_bytes() == DIGITS.read_bytes()
    registry.store.write("m/1/model.onnx", CANCER.read_bytes())  # altered after the push
    with pytest.raises(ChecksumMismatch):
        registry.fetch("m", "1", tmp_path / "other-cache")


def test_directory_store_lists_only_committed_versions(tmp_path: Path) -> None:
    registry = ModelRegistry(DirectoryStore(tmp_path))
    (tmp_path / "m" / "3").mkdir(parents=True)
    (tmp_path / "m" / "3" / "model.onnx").write_bytes(b"half a push")  # no manifest yet
    assert registry.versions("m") == []


def test_push_writes_the_versions_multi_model_archive_and_it_is_reproducible(
    registry: ModelRegistry, tmp_path: Path
) -> None:
    import io
    import tarfile

    from servestack.inference.registry import archive_key, package_archive

    # GIVEN a pushed version
    pushed = registry.push(DIGITS, name="archived", version="3")
    key = archive_key("archived", "3")
    # THEN its archive is the TargetModel key `<name>/<version>.tar.gz`, holding the package at its root
    assert key == "archived/3.tar.gz"
    data = registry.store.read(key)
    assert data is not None
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        # the package as pushed: its manifest, model and (servestack models push writes them) samples
        files = sorted(k.rsplit("/", 1)[-1] for k in registry.store.keys("archived/3/"))
        assert {"manifest.json", "model.onnx"} <= set(files)
        assert sorted(tar.getnames()) == files
        manifest = tar.extractfile("manifest.json")
        assert manifest is not None
        assert b'"sha256": "' + pushed.manifest.sha256.encode() in manifest.read()
    # AND the archive does not count as a version or a model
    assert registry.versions("archived") == ["3"]
    assert "archived" in registry.names()
    assert not [name for name in registry.names() if name.endswith(".tar.gz")]
    # AND the same package always makes the same archive bytes, and pushing it again changes nothing
    copied = tmp_path / "copied"
    copied.mkdir()
    for name in files:
        content = registry.store.read(f"archived/3/{name}")
        assert content is not None
        (copied / name).write_bytes(content)
    assert package_archive(copied, files) == data
    assert registry.push_package(copied).created is False
    assert registry.store.read(key) == data
