"""The versioned model registry: `models/<name>/<version>/{model.onnx,manifest.json[,process.py],<files>...}`
plus `models/<name>/aliases.json` (`live` -> a version, with the history that `rollback` walks back). A
version holds every file of its package (servestack/inference/manifest.py `package_files`): the model, its
hooks, the files its manifest lists (external data, vocabularies...) at their paths, and the samples.

Next to each version's files sits its archive, `<name>/<version>.tar.gz` (the package's files at the archive's
root, byte-for-byte reproducible): that key is the `TargetModel` of a SageMaker multi-model endpoint whose
`ModelDataUrl` is the registry's prefix. SageMaker downloads `<prefix><TargetModel>`, extracts it and loads
it (servestack/inference/multi_model.py). Aliases have no archive: SageMaker caches a loaded model by its
TargetModel, so a key whose bytes change would go on serving the old ones; callers name a version.

The registry logic is transport-free: it reads and writes through an `ObjectStore` (a small protocol).
`DirectoryStore` keeps the layout in a local folder (tests, air-gapped use); the S3 store lives outside the
core, in `servestack/adapters/aws/registry.py`. Versions are immutable: pushing an existing version with other bytes is
refused. The manifest is written last, so a version exists only once all its files do.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import shutil
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import msgspec

from servestack.inference.errors import ModelLoadError, ModelNotFound, RegistryError, VersionConflict
from servestack.inference.manifest import (
    MANIFEST_FILE,
    NAME_PATTERN,
    VERSION_PATTERN,
    Manifest,
    listed_files,
    package_files,
    read_manifest,
    verify_checksums,
)
from servestack.inference.paths import confined
from servestack.inference.service import version_order

NAME = re.compile(NAME_PATTERN)
VERSION = re.compile(VERSION_PATTERN)
ALIAS = re.compile(r"^[a-z][a-z0-9-]{0,31}$")
ALIASES_FILE = "aliases.json"
DEFAULT_ALIAS = "live"


ARCHIVE_SUFFIX = ".tar.gz"


def archive_key(name: str, version: str) -> str:
    """A version's archive below the registry prefix: the TargetModel SageMaker multi-model endpoints take."""
    return f"{name}/{version}{ARCHIVE_SUFFIX}"


def package_archive(package_dir: Path, files: Sequence[str]) -> bytes:
    """`files` of the package as a gzipped tar, each at the archive's root; the same files give the same bytes
    (no timestamps, owners or modes of this machine)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for file_name in sorted(files):
            path = package_dir / file_name
            info = tarfile.TarInfo(file_name)
            info.size, info.mtime, info.mode = path.stat().st_size, 0, 0o644
            with path.open("rb") as stream:  # streamed into the archive: a 2 GB weights file is not read twice
                tar.addfile(info, stream)
    return gzip.compress(raw.getvalue(), compresslevel=6, mtime=0)


class ObjectStore(Protocol):
    """Where the registry's objects live. Keys are `/`-separated, relative to the store's root."""

    uri: str

    def read(self, key: str) -> bytes | None: ...

    def write(self, key: str, data: bytes) -> None: ...

    def keys(self, prefix: str) -> list[str]: ...


class DirectoryStore:
    """The registry layout in a local folder; every key is confined to it (servestack/inference/paths.py)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.uri = str(root)

    def read(self, key: str) -> bytes | None:
        try:
            return confined(self.root, key, field="key").read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def write(self, key: str, data: bytes) -> None:
        path = confined(self.root, key, field="key")
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.tmp")
        temporary.write_bytes(data)
        temporary.replace(path)

    def keys(self, prefix: str) -> list[str]:
        base = confined(self.root, prefix, field="key") if prefix else self.root
        if not base.is_dir():
            return []
        root = self.root.resolve()
        found = []
        for path in base.rglob("*"):
            # A link inside the registry that leads out of it is not one of its keys.
            if path.is_file() and root in path.resolve().parents:
                found.append(str(path.relative_to(self.root)))
        return sorted(found)


@dataclass(frozen=True)
class Pushed:
    manifest: Manifest
    created: bool  # False when the same bytes were already pushed as this version


@dataclass(frozen=True)
class AliasChange:
    name: str
    alias: str
    previous: str | None
    current: str


def check_name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise RegistryError(
            f"name: {name!r} is not a model name", field="name", value=name, allowed="a-z, 0-9, '-', <= 63 chars"
        )
    return name


def check_version(version: str) -> str:
    if not VERSION.fullmatch(version):
        raise RegistryError(
            f"version: {version!r} is not a version label",
            field="version",
            value=version,
            allowed="letters, digits, '.', '_', '-' (starting with a letter or digit), <= 63 chars",
        )
    return version


class ModelRegistry:
    """Push, list, promote, roll back and fetch model versions in an `ObjectStore`."""

    def __init__(self, store: ObjectStore, prefix: str = "") -> None:
        self.store = store
        self.prefix = prefix

    @property
    def uri(self) -> str:
        return self.store.uri

    # ------------------------------------------------------------------------------------------ reading
    def names(self) -> list[str]:
        found = {key[len(self.prefix) :].split("/")[0] for key in self.store.keys(self.prefix)}
        return sorted(name for name in found if self.versions(name))

    def versions(self, name: str) -> list[str]:
        """Every pushed version of `name`, oldest first ('10' after '9')."""
        base = f"{self.prefix}{check_name(name)}/"
        found = {key[len(base) :].split("/")[0] for key in self.store.keys(base) if key.endswith(f"/{MANIFEST_FILE}")}
        return sorted(found, key=version_order)

    def manifest(self, name: str, version: str) -> Manifest | None:
        raw = self.store.read(f"{self.prefix}{check_name(name)}/{check_version(version)}/{MANIFEST_FILE}")
        return None if raw is None else msgspec.json.decode(raw, type=Manifest)

    def _alias_state(self, name: str) -> dict[str, dict[str, list[str]]]:
        raw = self.store.read(f"{self.prefix}{check_name(name)}/{ALIASES_FILE}")
        return {} if raw is None else dict(json.loads(raw))

    def aliases(self, name: str) -> dict[str, str]:
        return {alias: entry["history"][-1] for alias, entry in self._alias_state(name).items() if entry["history"]}

    def resolve(self, name: str, ref: str | None = None) -> str:
        """A version of `name`: `ref` as a version or an alias; None: the `live` alias, else the newest version."""
        versions = self.versions(name)
        if ref is not None:
            check_version(ref)
        if not versions:
            known = self.names()
            raise ModelNotFound(
                f"model {name!r} is not in the registry",
                field="model",
                value=name,
                allowed=", ".join(known) or "(registry is empty: servestack models push)",
            )
        if ref is None:
            return self.aliases(name).get(DEFAULT_ALIAS) or versions[-1]
        if ref in versions:
            return ref
        aliases = self.aliases(name)
        if ref in aliases:
            return aliases[ref]
        raise ModelNotFound(
            f"model {name!r} has no version or alias {ref!r}",
            field="version",
            value=ref,
            allowed=", ".join([*versions, *aliases]),
        )

    # ------------------------------------------------------------------------------------------ writing
    def push_package(self, package_dir: Path) -> Pushed:
        """Upload a verified package directory; refuse to change an existing version's bytes."""
        manifest = read_manifest(package_dir)
        verify_checksums(package_dir, manifest)
        check_name(manifest.name)
        check_version(manifest.version)
        existing = self.manifest(manifest.name, manifest.version)
        files = package_files(package_dir, manifest)
        if existing is not None:
            if (existing.sha256, existing.process_sha256, existing.files) != (
                manifest.sha256,
                manifest.process_sha256,
                manifest.files,
            ):
                raise VersionConflict(
                    f"{manifest.key} already exists with other bytes (sha256 {existing.sha256[:12]}..., "
                    f"pushed {manifest.sha256[:12]}..., or other files); versions are immutable, push it as a "
                    "new version",
                    field="version",
                    value=manifest.version,
                    allowed=f"a version not in {', '.join(self.versions(manifest.name))}",
                )
            base = f"{self.prefix}{manifest.name}/{manifest.version}/"
            present = set(self.store.keys(base))
            for file_name in files:  # a store that lost a file (an emulator's partial restore): put it back
                if file_name != MANIFEST_FILE and base + file_name not in present:
                    self.store.write(base + file_name, (package_dir / file_name).read_bytes())
            archive = self.prefix + archive_key(manifest.name, manifest.version)
            if archive not in self.store.keys(archive):  # pushed before archives existed: add it now
                self.store.write(archive, package_archive(package_dir, files))
            return Pushed(existing, created=False)
        base = f"{self.prefix}{manifest.name}/{manifest.version}/"
        for file_name in files:
            if file_name != MANIFEST_FILE:
                self.store.write(base + file_name, (package_dir / file_name).read_bytes())
        archive = self.prefix + archive_key(manifest.name, manifest.version)
        self.store.write(archive, package_archive(package_dir, files))
        self.store.write(base + MANIFEST_FILE, (package_dir / MANIFEST_FILE).read_bytes())  # last: the commit
        return Pushed(manifest, created=True)

    def push(
        self,
        model_path: Path,
        *,
        name: str,
        version: str | None = None,
        labels: Sequence[str] | None = None,
        process_file: Path | None = None,
        sample: Path | None = None,
        description: str = "",
        files: Sequence[Path] = (),
    ) -> Pushed:
        """Any ONNX file: the manifest comes from its own signature (servestack/inference/packaging.py, which also
        writes the sample request and response); version default: the next integer. The external data beside
        the file travels with it; `files`: other files or folders the package carries (`--file`)."""
        from servestack.inference.package_files import gather_files
        from servestack.inference.packaging import build_package

        check_name(name)
        if not model_path.is_file():
            raise RegistryError(f"{model_path}: no such file", field="model_path", value=str(model_path))
        version = check_version(version or self.next_version(name))
        with tempfile.TemporaryDirectory(prefix="servestack-push-") as tmp:
            build_package(
                model_path,
                Path(tmp),
                name=name,
                version=version,
                labels=labels,
                process_file=process_file,
                sample=sample,
                description=description,
                files=gather_files(files),
            )
            return self.push_package(Path(tmp))

    def next_version(self, name: str) -> str:
        """One more than the highest integer version of `name` (1 for a new model)."""
        numbers = [int(v) for v in self.versions(name) if v.isdigit()]
        return str(max(numbers, default=0) + 1)

    def promote(self, name: str, version: str, alias: str = DEFAULT_ALIAS) -> AliasChange:
        if not ALIAS.fullmatch(alias):
            raise RegistryError(
                f"alias: {alias!r} is not an alias name",
                field="alias",
                value=alias,
                allowed="a-z, 0-9, '-', starting with a letter, <= 32 chars",
            )
        self.resolve(name, version)  # raises naming the known versions
        if version not in self.versions(name):
            raise RegistryError(
                f"{name}: {version!r} is an alias; promote a version",
                field="version",
                value=version,
                allowed=", ".join(self.versions(name)),
            )
        state = self._alias_state(name)
        history = state.setdefault(alias, {"history": []})["history"]
        previous = history[-1] if history else None
        if previous != version:
            history.append(version)
            self._write_aliases(name, state)
        return AliasChange(name, alias, previous, version)

    def rollback(self, name: str, alias: str = DEFAULT_ALIAS) -> AliasChange:
        """Point `alias` back at the version it named before the last promote."""
        state = self._alias_state(name)
        history = state.get(alias, {"history": []})["history"]
        if len(history) < 2:
            raise RegistryError(
                f"{name}: alias {alias!r} has no earlier version to go back to",
                field="alias",
                value=f"{alias} -> {history[-1] if history else 'nothing'}",
                allowed="an alias promoted at least twice",
            )
        previous = history.pop()
        self._write_aliases(name, state)
        return AliasChange(name, alias, previous, history[-1])

    def _write_aliases(self, name: str, state: dict[str, dict[str, list[str]]]) -> None:
        self.store.write(f"{self.prefix}{name}/{ALIASES_FILE}", json.dumps(state, indent=2).encode() + b"\n")

    # ------------------------------------------------------------------------------------------ fetching
    def fetch(self, name: str, version: str, cache_dir: Path) -> Path:
        """The package as a local directory `<cache_dir>/<name>/<version>/`, downloaded once, verified always.
        Nothing is written outside `cache_dir`: the name, the version and the manifest's file name are checked
        before they become paths, and every path is confined (servestack/inference/paths.py)."""
        destination = confined(cache_dir, f"{check_name(name)}/{check_version(version)}", field="model")
        manifest_bytes = self.store.read(f"{self.prefix}{name}/{version}/{MANIFEST_FILE}")
        if manifest_bytes is None:
            self.resolve(name, version)  # raises ModelNotFound listing what exists
            raise ModelNotFound(f"model {name}@{version} has no manifest in the registry")
        local = destination / MANIFEST_FILE
        if local.is_file():
            if local.read_bytes() == manifest_bytes:
                return destination  # `ServedModel.load` verifies the files against it at every load
            shutil.rmtree(destination)  # a copy from another registry (or an older one): fetch again
        try:
            manifest = msgspec.json.decode(manifest_bytes, type=Manifest)
        except msgspec.DecodeError as exc:  # the message names the field, e.g. `$.file`, never a local path
            raise ModelLoadError(f"model {name}@{version}: invalid manifest in the registry: {exc}") from None
        destination.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=destination.parent))
        try:
            for file_name in listed_files(manifest):
                data = self.store.read(f"{self.prefix}{name}/{version}/{file_name}")
                if data is None:
                    raise ModelNotFound(f"model {name}@{version}: {file_name} is missing from the registry")
                path = confined(staging, file_name, field="file")
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
            (staging / MANIFEST_FILE).write_bytes(manifest_bytes)
            verify_checksums(staging, manifest)
            try:
                staging.rename(destination)
            except OSError:  # another process fetched it first
                shutil.rmtree(staging, ignore_errors=True)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return destination
