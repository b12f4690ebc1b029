"""AWS clients as every handler builds them.

They are botocore clients, made on one botocore session per process: what `boto3.client` returns, without
boto3's session layer, whose import (it pulls in s3transfer for S3's `upload_file` family, which no handler
uses) was the largest single import of the batch job's start-up. Every method the handlers call (`get_object`,
`put_object`, paginators, `generate_presigned_url`, `send_message`, `invoke_endpoint_async`, ...) is
botocore's. Code that needs boto3 itself (`boto3.resource("dynamodb")` in servestack/adapters/aws/job_records.py)
imports it.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import gzip
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, overload

import botocore.session
import orjson
from botocore.config import Config
from botocore.loaders import Loader

# A botocore session is not safe to create clients from on several threads at once (boto3's docs say the
# same of its sessions); clients themselves are.
_session_lock = threading.Lock()


@functools.cache
def _session() -> botocore.session.Session:
    """The process's session: credentials, region and AWS_ENDPOINT_URL from the environment, as boto3's
    default session reads them (boto3 builds that session the same way)."""
    session = botocore.session.get_session()
    # The session's own loader, as botocore.loaders.create_loader makes it (AWS_DATA_PATH first), with two
    # faster parts: together ~0.04 of the ~0.075 CPU s an S3 client and its paginator took on the batch job's core.
    data_path = session.get_config_variable("data_path")
    extra = (
        [str(Path(os.path.expandvars(path)).expanduser()) for path in data_path.split(os.pathsep)]
        if data_path
        else None
    )
    session.register_component("data_loader", _ModelLoader(extra_search_paths=extra, file_loader=_ModelFiles()))
    return session


def aws_client(service: str, *, endpoint_url: str | None = None) -> Any:
    """A client honouring AWS_ENDPOINT_URL (an emulator), with botocore's `standard` retry mode and
    path-style S3 addressing, so any endpoint host works. S3 clients take `put_object(IfNoneMatch="*")` whatever
    the botocore version (`conditional_writes`)."""
    config = Config(s3={"addressing_style": "path"}, retries={"mode": "standard"})
    with _session_lock, _collection_paused():
        client = _session().create_client(service, endpoint_url=endpoint_url, config=config)
    return conditional_writes(client) if service == "s3" else client


class _ModelFiles:
    """botocore's model files read with orjson: a `file_loader` as botocore.loaders defines one (`exists`,
    `load_file`, "so that other faster loading mechanism besides the default JSON loader can be used"). botocore's
    own parses them with the standard library into OrderedDicts: an S3 client's (S3's model and endpoint rules,
    the regions' endpoints.json: 3.5 MB of JSON) took ~43 ms of CPU, with orjson ~13. The values are the same
    (every file botocore 1.44 ships parses equal both ways); only the mappings are plain dicts, in the same order."""

    _OPENERS = ((".json", open), (".json.gz", gzip.open))

    def exists(self, file_path: str) -> bool:
        return any(Path(file_path + suffix).is_file() for suffix, _ in self._OPENERS)

    def load_file(self, file_path: str) -> Any:
        for suffix, opener in self._OPENERS:
            if Path(file_path + suffix).is_file():
                with opener(file_path + suffix, "rb") as data:
                    return orjson.loads(data.read())
        return None


class _ModelLoader(Loader):  # type: ignore[misc]  # botocore ships no type hints
    """botocore's Loader, whose `list_available_services` walks its data folders (~450 service folders, a directory
    listing and two stat calls each, ~8 ms of CPU) for every kind of model a client loads (a service's model, its
    endpoint rules, its paginators), where `load_service_model` asks it only whether the one service it loads is
    there, and names the others only when it is not. Here the answer is `ServicesWith`: that question looks in the
    service's own folder; the full list (the same, sorted) is walked once, when something reads it whole."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._services_by_kind: dict[str, set[str]] | None = None

    def list_available_services(self, type_name: str) -> ServicesWith:
        return ServicesWith(self, type_name)

    def has_model(self, service_name: str, type_name: str) -> bool:
        """Whether some version folder of `service_name` holds a `type_name` file (what the walk would find)."""
        for root in self.search_paths:
            folder = Path(root) / service_name
            if not folder.is_dir():
                continue
            with os.scandir(folder) as versions:
                for version in versions:
                    if version.is_dir() and self.file_loader.exists(str(Path(version.path) / type_name)):
                        return True
        return False

    def services_with(self, type_name: str) -> list[str]:
        if self._services_by_kind is None:
            self._services_by_kind = self._walk()
        return sorted(self._services_by_kind.get(type_name, ()))

    def _walk(self) -> dict[str, set[str]]:
        found: dict[str, set[str]] = {}
        suffixes = [suffix for suffix, _ in _ModelFiles._OPENERS]
        for root in self.search_paths:
            if not Path(root).is_dir():
                continue
            with os.scandir(root) as services:
                for service in services:
                    if not service.is_dir():
                        continue
                    with os.scandir(service.path) as versions:
                        for version in versions:
                            if not version.is_dir():
                                continue
                            with os.scandir(version.path) as files:
                                for file in files:
                                    for suffix in suffixes:
                                        if file.name.endswith(suffix) and file.is_file():
                                            found.setdefault(file.name.removesuffix(suffix), set()).add(service.name)
        return found


class ServicesWith(Sequence[str]):
    """The services with a `type_name` model, as `list_available_services` answers: `in` looks in the one service's
    folder; reading it whole (iterating, indexing, `len`, botocore's `", ".join` of the names when a service is
    unknown) walks every folder once."""

    def __init__(self, loader: _ModelLoader, type_name: str) -> None:
        self._loader, self._type_name = loader, type_name

    def __contains__(self, name: object) -> bool:
        # a service's name is a folder's name: never a path, nor `.` or `..`
        plain = isinstance(name, str) and bool(name) and "/" not in name and not name.startswith(".")
        return plain and self._loader.has_model(str(name), self._type_name)

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> list[str]: ...
    def __getitem__(self, index: int | slice) -> str | list[str]:
        return self._loader.services_with(self._type_name)[index]

    def __len__(self) -> int:
        return len(self._loader.services_with(self._type_name))

    def __iter__(self) -> Iterator[str]:
        return iter(self._loader.services_with(self._type_name))

    def __eq__(self, other: object) -> bool:
        return list(self) == other if isinstance(other, list) else NotImplemented

    __hash__ = None  # type: ignore[assignment]  # a sequence that compares by its items, as a list


@contextlib.contextmanager
def _collection_paused() -> Iterator[None]:
    """No garbage collection inside: creating a client loads its service model and endpoint rules, tens of
    thousands of dicts that all live on: collecting while they are allocated finds no garbage, and cost 0.04 of
    the ~0.1 CPU s an S3 client took to create on the batch job's one core."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


# S3 conditional writes (`If-None-Match: *` on PutObject: write only if the key holds no object, else 412
# PreconditionFailed) date from August 2024; botocore's model has the `IfNoneMatch` parameter since 1.35.
# Lambda functions run the python3.12 runtime's boto3/botocore (the bundle carries no SDK: servestack/cdk/bundling.py),
# and AWS fixes no version for it: "The version of the AWS SDK included in the Python runtime depends on the
# runtime version and your AWS Region" (Lambda Developer Guide, "Building Lambda functions with Python",
# Runtime-included SDK versions; the last published table, for python3.9, listed botocore 1.21.55), and it
# changes without notice. S3 honours the header whatever the SDK, so with a model that lacks the parameter
# the client sends the header itself: the worker's write-once holds on any runtime SDK, without bundling
# botocore (~25 MB) next to a ~140 MB bundle.
_IF_NONE_MATCH = "servestack_if_none_match"


def conditional_writes(s3: Any) -> Any:
    """`s3`, taking `IfNoneMatch` on `put_object` even where its botocore model predates the parameter."""
    members = s3.meta.service_model.operation_model("PutObject").input_shape.members
    if "IfNoneMatch" in members:
        return s3
    events = s3.meta.events
    events.register("before-parameter-build.s3.PutObject", _take_if_none_match)
    events.register("before-call.s3.PutObject", _send_if_none_match)
    return s3


def _take_if_none_match(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
    # Before validation, which would refuse a parameter the model does not have.
    if "IfNoneMatch" in params:
        context[_IF_NONE_MATCH] = params.pop("IfNoneMatch")


def _send_if_none_match(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
    if _IF_NONE_MATCH in context:
        params["headers"]["If-None-Match"] = context[_IF_NONE_MATCH]
