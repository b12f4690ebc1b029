"""SageMaker's multi-model contract, the container's side: the models SageMaker told this container to load.

With `Mode: MultiModel`, SageMaker downloads `<ModelDataUrl prefix><TargetModel>` (a `.tar.gz`), extracts it into
`/opt/ml/models/<model_name>/model` and calls `POST /models {"model_name", "url"}`; then
`POST /models/<model_name>/invoke` for each request and `DELETE /models/<model_name>` to reclaim memory
(servestack/adapters/multi_model.py holds the routes). `model_name` is an opaque name SageMaker chooses.

- Paths stay confined: `url`, and every file its manifest names, must resolve (symlinks followed) inside
  `multi_model_root`. Checksums are verified before a model loads (`ServedModel.load`).
- Memory: before a load, a model is estimated at its file size (with its external data) plus
  `cache_session_overhead_bytes`, as in servestack/inference/cache.py; after it, it costs what it measurably took:
  the growth of the loading worker's resident set (RSS, from /proc/self/statm) across the load, when that is more
  than the estimate. RSS, not onnxruntime's own allocation figure: onnxruntime reports no per-session total, and
  RSS also counts what a package's hooks allocate (a 300 KB model whose load peaked at 861 MB was counted 259 KB
  by its file size). Loads within one worker take turns, so that one load's growth is not counted as another's. A
  load that takes the loaded set past `cache_budget_bytes` or `cache_max_models`, by estimate before it or by
  measure after it, is refused with 507 (a measured one is unloaded first): SageMaker then unloads the models it
  used least recently and loads again. The container never evicts by itself, or SageMaker's idea of what is loaded
  would be wrong.
- Workers: uvicorn runs several worker processes on one port and SageMaker's `POST /models` reaches one of
  them. So the loaded set lives on disk, one record per model in `multi_model_state_dir`, written under an
  exclusive lock; every worker loads a recorded model into its own memory the first time it serves it, and
  notices an unload by the directory's modification time (one `stat` per request).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servestack.inference.errors import (
    InsufficientMemory,
    InvalidInput,
    ModelAlreadyLoaded,
    ModelLoadError,
    ModelNotFound,
)
from servestack.inference.manifest import MANIFEST_FILE, model_bytes, package_files, read_manifest
from servestack.inference.service import ServedModel
from servestack.inference.settings import ServingSettings

logger = logging.getLogger("servestack.multi_model")

# A model_name becomes a file name here: letters, digits and . _ - only, no leading dot, and at most 250
# characters, so that its record file `<name>.json` and the temporary `.<name>.tmp` fit the 255 bytes a file
# name may hold (a longer name made every route that touched it an OSError).
MODEL_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,249}$")


@dataclass(frozen=True)
class LoadedRecord:
    """What every worker knows about a loaded model (its record file's content)."""

    model_name: str
    url: str
    cost_bytes: int

    def describe(self) -> dict[str, str]:
        """The contract's model object."""
        return {"modelName": self.model_name, "modelUrl": self.url}


def resident_bytes() -> int:
    """This process's resident set size now (Linux: /proc/self/statm); 0 where it cannot be read."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def check_model_name(name: object) -> str:
    if not isinstance(name, str) or not MODEL_NAME.fullmatch(name):
        raise InvalidInput(
            "model_name is not a usable model name",
            field="model_name",
            value=name if not isinstance(name, str) or len(name) <= 80 else name[:77] + "...",
            allowed="1-250 of A-Z a-z 0-9 . _ - (not starting with '.')",
        )
    return name


def confined_package(url: object, root: Path) -> Path:
    """The package directory `url` names, refused unless it (with symlinks resolved) lies inside `root`."""
    if not isinstance(url, str) or not url.startswith("/"):
        raise InvalidInput("url must be an absolute path", field="url", value=url, allowed=f"a directory in {root}")
    resolved_root = root.resolve()
    package = Path(url).resolve()
    if package != resolved_root and resolved_root not in package.parents:
        raise InvalidInput(
            "url is outside the multi-model directory", field="url", value=url, allowed=f"a directory in {root}"
        )
    if not (package / MANIFEST_FILE).is_file():
        raise InvalidInput(
            "url holds no model package", field="url", value=url, allowed=f"a directory with {MANIFEST_FILE}"
        )
    return package


class MultiModelStore:
    """The loaded models of a SageMaker multi-model container; answers what `ModelRepository` answers."""

    def __init__(self, settings: ServingSettings, *, on_evict: Callable[[str], None] | None = None) -> None:
        self.settings = settings
        self.on_evict = on_evict
        self.state = "ready"  # nothing to load at start: SageMaker loads models on demand
        self.error: str | None = None
        self.load_seconds: float | None = 0.0
        self.root = settings.multi_model_root
        self.state_dir = Path(settings.multi_model_state_dir or tempfile.mkdtemp(prefix="servestack-mme-"))
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._local: dict[str, ServedModel] = {}
        self._seen_mtime_ns = -1
        self._lock = threading.Lock()
        self._measured_load = threading.Lock()  # one load at a time per worker: its RSS growth is its own
        self._loading: dict[str, Future[ServedModel]] = {}
        self._pool = ThreadPoolExecutor(settings.cache_load_threads, thread_name_prefix="mme-load")

    # ------------------------------------------------------------------------------------ repository API
    @property
    def ready(self) -> bool:
        return True

    def load_all(self) -> None:
        """Nothing to pre-load: SageMaker asks for each model."""

    def lookup(self, target: str | None) -> ServedModel | None:
        """The hot path: this worker's copy of a loaded model, None when another worker loaded it (call
        `load`), `ModelNotFound` (404) when it is not loaded at all."""
        self._forget_unloaded()
        if target is not None:
            found = self._local.get(target)
            if found is not None:
                return found
        name = target or ""
        if self._record(name) is None:
            raise ModelNotFound(
                f"model {name!r} is not loaded", field="model_name", value=name, allowed="a model POST /models loaded"
            )
        return None

    def load(self, target: str | None) -> Future[ServedModel]:
        """This worker's load of a recorded model (concurrent callers share one)."""
        name = target or ""
        with self._lock:
            future = self._loading.get(name)
            if future is None:
                future = self._loading[name] = self._pool.submit(self._load_recorded, name)
                future.add_done_callback(lambda _: self._loading.pop(name, None))
        return future

    def resolve(self, target: str | None) -> ServedModel:
        return self.lookup(target) or self.load(target).result()

    def models(self) -> list[ServedModel]:
        return list(self._local.values())

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------------------------ the contract
    def list_models(self) -> list[dict[str, str]]:
        return [record.describe() for record in self._records()]

    def describe(self, name: str) -> dict[str, str]:
        record = self._record(check_model_name(name))
        if record is None:
            raise ModelNotFound(f"model {name!r} is not loaded", field="model_name", value=name)
        return record.describe()

    def load_model(self, name: object, url: object) -> dict[str, str]:
        """`POST /models`: verify and load `url` as `name`; 409 if loaded, 507 past the memory budget."""
        model_name = check_model_name(name)
        package = confined_package(url, self.root)
        manifest = read_manifest(package)
        model_file = (package / manifest.file).resolve()
        if package not in model_file.parents:
            raise InvalidInput(
                "the manifest names a model file outside its package",
                field="file",
                value=manifest.file,
                allowed="a file inside the package directory",
            )
        if not model_file.is_file():
            raise ModelLoadError(f"{manifest.key}: {manifest.file} is missing from the package")
        package_files(package, manifest)  # every listed file there (each is confined and verified at the load)
        cost = model_bytes(package, manifest) + self.settings.cache_session_overhead_bytes
        record = LoadedRecord(model_name, str(url), cost)
        with self._exclusive():
            if self._record(model_name) is not None:
                raise ModelAlreadyLoaded(f"model {model_name!r} is already loaded", field="model_name", value=name)
            self._check_budget(cost)
            self._write_record(record)
        started = time.perf_counter()
        try:
            with self._measured_load:
                before = resident_bytes()
                model = ServedModel.load(package, self.settings)
                grown = resident_bytes() - before
        except BaseException:
            self._remove_record(model_name)
            raise
        if grown > cost:
            self._count_measured(LoadedRecord(model_name, str(url), grown))  # 507: the model is dropped here
        with self._lock:
            self._local[model_name] = model
        logger.info(
            "loaded %s as %s in %.1f ms (RSS +%d bytes, estimated %d)",
            model.manifest.key, model_name, (time.perf_counter() - started) * 1e3, grown, cost,
        )  # fmt: skip
        return record.describe()

    def _count_measured(self, measured: LoadedRecord) -> None:
        """The record now holds what the load measurably cost; past the budget, the model is unloaded and the
        load refused with 507 (nothing of it stays)."""
        with self._exclusive():
            try:
                self._check_budget(measured.cost_bytes, leaving_out=measured.model_name)
            except InsufficientMemory:
                self._remove_record(measured.model_name)
                raise
            self._write_record(measured)

    def unload(self, name: str) -> None:
        """`DELETE /models/{name}`: forget it in every worker (each drops its copy on its next request)."""
        model_name = check_model_name(name)
        with self._exclusive():
            if self._record(model_name) is None:
                raise ModelNotFound(f"model {model_name!r} is not loaded", field="model_name", value=name)
            self._remove_record(model_name)
        self._drop_local(model_name)

    # ------------------------------------------------------------------------------------ internals
    def _check_budget(self, cost: int, *, leaving_out: str | None = None) -> None:
        records = [record for record in self._records() if record.model_name != leaving_out]
        used = sum(record.cost_bytes for record in records)
        budget, most = self.settings.cache_budget_bytes, self.settings.cache_max_models
        if used + cost > budget or len(records) + 1 > most:
            raise InsufficientMemory(
                f"loading ~{cost} bytes next to {len(records)} loaded models ({used} bytes) would pass the budget",
                field="memory",
                value=used + cost,
                allowed=f"<= {budget} bytes and <= {most} models (SERVESTACK_CACHE_BUDGET_BYTES, _MAX_MODELS)",
            )

    def _load_recorded(self, name: str) -> ServedModel:  # another worker's load: counted there
        record = self._record(name)
        if record is None:
            raise ModelNotFound(f"model {name!r} is not loaded", field="model_name", value=name)
        model = ServedModel.load(confined_package(record.url, self.root), self.settings)
        with self._lock:
            self._local[name] = model
        return model

    def _forget_unloaded(self) -> None:
        """Drop this worker's copies of models unloaded through another worker (only when the set changed)."""
        try:
            mtime_ns = self.state_dir.stat().st_mtime_ns
        except FileNotFoundError:
            return
        if mtime_ns == self._seen_mtime_ns:
            return
        self._seen_mtime_ns = mtime_ns
        recorded = {record.model_name for record in self._records()}
        for name in [name for name in self._local if name not in recorded]:
            self._drop_local(name)

    def _drop_local(self, name: str) -> None:
        with self._lock:
            model = self._local.pop(name, None)
            still_used = model is not None and any(m.manifest.key == model.manifest.key for m in self._local.values())
        if model is not None and not still_used and self.on_evict is not None:
            self.on_evict(model.manifest.key)

    def _path(self, name: str) -> Path:
        return self.state_dir / f"{name}.json"

    def _record(self, name: str) -> LoadedRecord | None:
        if not MODEL_NAME.fullmatch(name):
            return None
        try:
            raw: dict[str, Any] = json.loads(self._path(name).read_bytes())
        except (FileNotFoundError, ValueError):
            return None
        return LoadedRecord(str(raw["model_name"]), str(raw["url"]), int(raw["cost_bytes"]))

    def _records(self) -> list[LoadedRecord]:
        found = [self._record(path.stem) for path in sorted(self.state_dir.glob("*.json"))]
        return [record for record in found if record is not None]

    def _write_record(self, record: LoadedRecord) -> None:
        data = json.dumps({"model_name": record.model_name, "url": record.url, "cost_bytes": record.cost_bytes})
        temporary = self.state_dir / f".{record.model_name}.tmp"
        temporary.write_text(data, encoding="utf-8")
        temporary.replace(self._path(record.model_name))

    def _remove_record(self, name: str) -> None:
        self._path(name).unlink(missing_ok=True)

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        """One load or unload at a time across the container's workers."""
        with (self.state_dir / ".lock").open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
