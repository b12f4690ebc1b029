"""The multi-model cache: models load from the registry on first request and stay in an LRU bounded by bytes
and by count. It answers what `ModelRepository` answers (`lookup`, `resolve`, `state`, `models`), so the
adapters serve from either.

- `lookup(target)` is the hot path: a dict hit and a move to the LRU end under a lock; None on a miss.
- `load(target)` starts (or joins) the one load of that model: concurrent first requests load it once.
  Loads run in a small thread pool so the event loop keeps serving hits.
- A model's cost is its file size (with its external data) plus `cache_session_overhead_bytes` (an estimate of the
  onnxruntime session beyond its weights). Before a model is inserted, least recently used models are evicted
  until the total fits `cache_budget_bytes` and the count fits `cache_max_models`; `on_evict(key)` is called for
  each.
- Unversioned targets (`digits`) resolve through the registry (alias `live`, else the newest version) and
  keep that version for `alias_ttl_sec`.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servestack.inference.errors import ModelLoadError, ServingError
from servestack.inference.manifest import model_bytes
from servestack.inference.registry import ModelRegistry
from servestack.inference.service import ServedModel, parse_target
from servestack.inference.settings import ServingSettings

logger = logging.getLogger("servestack.cache")


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    loads: int = 0
    load_failures: int = 0
    evictions: int = 0
    peak_resident_bytes: int = 0
    load_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=1000))


@dataclass
class _Entry:
    model: ServedModel
    size_bytes: int


def process_rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as statm:  # noqa: PTH123 - a procfs read, Linux only
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


class ModelCache:
    """An LRU of served models in front of a `ModelRegistry`."""

    def __init__(
        self,
        settings: ServingSettings,
        registry: ModelRegistry,
        *,
        on_evict: Callable[[str], None] | None = None,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.on_evict = on_evict
        self.stats = CacheStats()
        self.state = "loading"
        self.error: str | None = None
        self.load_seconds: float | None = None
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._targets: dict[str | None, tuple[str, float]] = {}
        self._resident_bytes = 0
        self._lock = threading.Lock()
        self._loading_targets: dict[str | None, Future[ServedModel]] = {}
        self._loading_keys: dict[str, Future[ServedModel]] = {}
        self._pool = ThreadPoolExecutor(settings.cache_load_threads, thread_name_prefix="model-load")

    # ------------------------------------------------------------------------------------------ repository API
    @property
    def ready(self) -> bool:
        return self.state == "ready"

    def load_all(self) -> None:
        """Pre-warm: load the listed targets; readiness flips when they are resident."""
        started = time.perf_counter()
        try:
            for target in self.settings.prewarm_targets:
                self.resolve(target)
        except ServingError as exc:
            self.state, self.error = "failed", exc.message
            logger.error("pre-warm failed: %s", exc.message)
            raise
        self.load_seconds = time.perf_counter() - started
        self.state = "ready"

    def lookup(self, target: str | None) -> ServedModel | None:
        """The resident model for `target`, or None (a miss: call `load`)."""
        resolved = self._targets.get(target)
        if resolved is None or resolved[1] < time.monotonic():
            return None
        with self._lock:
            entry = self._entries.get(resolved[0])
            if entry is None:
                return None
            self._entries.move_to_end(resolved[0])
            self.stats.hits += 1
        return entry.model

    def load(self, target: str | None) -> Future[ServedModel]:
        """The load of `target` in flight, started if none is: every concurrent caller shares one."""
        with self._lock:
            self.stats.misses += 1
            future = self._loading_targets.get(target)
            started = future is None
            if future is None:
                future = self._loading_targets[target] = self._pool.submit(self._load_target, target)
        if started:  # outside the lock: the callback runs at once if the load has already finished
            future.add_done_callback(lambda _: self._forget_target(target))
        return future

    def resolve(self, target: str | None) -> ServedModel:
        """Blocking: the model for `target`, loading it on a miss (Lambda-style callers, pre-warm, docs)."""
        return self.lookup(target) or self.load(target).result()

    def models(self) -> list[ServedModel]:
        with self._lock:
            return [entry.model for entry in self._entries.values()]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------------------------------ metrics
    def metrics(self) -> dict[str, Any]:
        with self._lock:
            stats = self.stats
            loads = sorted(stats.load_seconds)
            requests = stats.hits + stats.misses
            return {
                "hits": stats.hits,
                "misses": stats.misses,
                "hit_rate": stats.hits / requests if requests else None,
                "loads": stats.loads,
                "load_failures": stats.load_failures,
                "evictions": stats.evictions,
                "resident_models": len(self._entries),
                "resident_bytes": self._resident_bytes,
                "peak_resident_bytes": stats.peak_resident_bytes,
                "budget_bytes": self.settings.cache_budget_bytes,
                "max_models": self.settings.cache_max_models,
                "load_ms": {
                    "p50": _percentile(loads, 50) * 1000 if loads else None,
                    "p99": _percentile(loads, 99) * 1000 if loads else None,
                    "max": loads[-1] * 1000 if loads else None,
                },
                "resident": list(self._entries),
                "process_rss_bytes": process_rss_bytes(),
            }

    # ------------------------------------------------------------------------------------------ loading
    def _forget_target(self, target: str | None) -> None:
        with self._lock:
            self._loading_targets.pop(target, None)

    def _load_target(self, target: str | None) -> ServedModel:
        name, ref = parse_target(target, self.settings.default_model)
        version = self.registry.resolve(name, ref)
        key = f"{name}@{version}"
        expires = math.inf if ref == version else time.monotonic() + self.settings.alias_ttl_sec
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:  # resident under another spelling, or loaded by a concurrent target
                self._entries.move_to_end(key)
                self._targets[target] = (key, expires)
                return entry.model
            future = self._loading_keys.get(key)
            owner = future is None
            if future is None:
                future = self._loading_keys[key] = Future()
        if not owner:
            model = future.result()
            with self._lock:
                self._targets[target] = (key, expires)
            return model
        try:
            model = self._load_key(name, version)
        except BaseException as exc:
            with self._lock:
                self.stats.load_failures += 1
                self._loading_keys.pop(key, None)
            future.set_exception(exc)
            raise
        with self._lock:
            self._targets[target] = (key, expires)
            self._loading_keys.pop(key, None)
        future.set_result(model)
        return model

    def _load_key(self, name: str, version: str) -> ServedModel:
        started = time.perf_counter()
        package_dir: Path = self.registry.fetch(name, version, self.settings.cache_dir)
        model = ServedModel.load(package_dir, self.settings)
        size = model_bytes(package_dir, model.manifest) + self.settings.cache_session_overhead_bytes
        if size > self.settings.cache_budget_bytes:
            raise ModelLoadError(
                f"model {model.manifest.key} needs ~{size} bytes, more than the whole cache budget",
                field="SERVESTACK_CACHE_BUDGET_BYTES",
                value=self.settings.cache_budget_bytes,
                allowed=f">= {size}",
            )
        evicted: list[str] = []
        with self._lock:
            while self._entries and (
                self._resident_bytes + size > self.settings.cache_budget_bytes
                or len(self._entries) + 1 > self.settings.cache_max_models
            ):
                old_key, old = self._entries.popitem(last=False)
                self._resident_bytes -= old.size_bytes
                self.stats.evictions += 1
                evicted.append(old_key)
            for stale in [t for t, (k, _) in self._targets.items() if k in evicted]:
                del self._targets[stale]
            self._entries[model.manifest.key] = _Entry(model, size)
            self._resident_bytes += size
            self.stats.peak_resident_bytes = max(self.stats.peak_resident_bytes, self._resident_bytes)
            self.stats.loads += 1
            self.stats.load_seconds.append(time.perf_counter() - started)
        for old_key in evicted:
            logger.info("evicted %s (least recently used)", old_key)
            if self.on_evict is not None:
                self.on_evict(old_key)
        logger.info("loaded %s in %.1f ms", model.manifest.key, (time.perf_counter() - started) * 1000)
        return model


def _percentile(ordered: list[float], percent: float) -> float:
    index = min(len(ordered) - 1, max(0, math.ceil(percent / 100 * len(ordered)) - 1))
    return ordered[index]
