"""What an endpoint router routes to: each variant's backend (its container process, counts and latencies), the
plan it is spawned from, the shadow comparison report, and the faults a rehearsal injects."""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from servestack.alarms import Observation
from servestack.latency import percentiles_ms
from servestack.local.hosting import Backoff, RealtimeProcess
from servestack.local.sagemaker.upstream import Upstream
from servestack.local.sagemaker.variant_start import ContainerSource

# A variant's container restarts after 0.25, 0.5, 1 ... 10 s while it keeps dying within 2 s of serving (a
# container that cannot start at all costs little), and after 0.25 s again once it served 2 s or longer.
# SERVESTACK_VARIANT_STABLE_SEC sets those 2 s: the chaos tests, which kill a variant as soon as its successor
# serves, set it shorter so that each kill meets the first delay without waiting out the default.
STABLE_SEC_VARIABLE = "SERVESTACK_VARIANT_STABLE_SEC"


def variant_backoff() -> Backoff:
    return Backoff(first_sec=0.25, most_sec=10.0, stable_sec=stable_sec(os.environ.get(STABLE_SEC_VARIABLE)))


def stable_sec(text: str | None, default: float = 2.0) -> float:
    """The variable's seconds (a number in 0..3600), else `default`: a router must start whatever it holds."""
    try:
        value = float(text) if text else default
    except ValueError:
        return default
    return value if 0 <= value <= 3600 else default


@dataclass(frozen=True)
class Faults:
    """What a rehearsal's green side does wrong on purpose: fail `error_rate` of requests, add `latency_ms`."""

    error_rate: float = 0.0
    latency_ms: float = 0.0

    @classmethod
    def parse(cls, text: str | None) -> Faults:
        """`error_rate=0.2,latency_ms=50`; each error names the key, the value and what is allowed."""
        values: dict[str, float] = {}
        for part in (text or "").split(","):
            if not part.strip():
                continue
            key, _, raw = part.partition("=")
            key = key.strip()
            if key not in ("error_rate", "latency_ms"):
                raise ValueError(f"--inject-faults: {key!r} is not one of error_rate, latency_ms")
            try:
                values[key] = float(raw)
            except ValueError:
                raise ValueError(f"--inject-faults: {key}={raw!r} is not a number") from None
        faults = cls(**values)
        if not 0 <= faults.error_rate <= 1:
            raise ValueError(f"--inject-faults: error_rate={faults.error_rate} is not in 0..1")
        if not 0 <= faults.latency_ms <= 60_000:
            raise ValueError(f"--inject-faults: latency_ms={faults.latency_ms} is not in 0..60000")
        return faults

    def __bool__(self) -> bool:
        return bool(self.error_rate or self.latency_ms)


@dataclass
class Backend:
    """One production variant (or the shadow): a realtime child and what the router saw of it."""

    name: str
    model: str
    process: RealtimeProcess
    weight: float = 1.0
    faults: Faults = field(default_factory=Faults)
    observations: deque[Observation] = field(default_factory=lambda: deque(maxlen=200_000))
    component: str | None = None  # the inference component it serves, on an endpoint hosting components
    plan: VariantPlan | None = None  # what to start again when its container dies (None: not restarted)
    restarts: int = 0
    restarting: bool = False  # its container died; a new one is on its way
    retired: bool = False  # stopped on purpose: never restarted
    started_at: float = field(default_factory=time.monotonic)
    backoff: Backoff = field(default_factory=variant_backoff)

    def __post_init__(self) -> None:
        self.upstream = Upstream(self.process.host, self.process.port)

    def is_retired(self) -> bool:
        """Read anew after each await: the router may retire it meanwhile."""
        return self.retired

    def replace_process(self, process: RealtimeProcess) -> None:
        """Serve from a new container (a restart): connections pooled to the old one are dropped."""
        self.upstream.close()
        self.process, self.upstream, self.started_at = process, Upstream(process.host, process.port), time.monotonic()

    @property
    def url(self) -> str:
        return self.process.url

    def record(self, status: int, latency_us: float) -> None:
        self.observations.append(Observation(time.monotonic(), status, latency_us))

    def summary(self) -> dict[str, Any]:
        latencies = np.array([o.latency_us for o in self.observations], dtype=np.float64) / 1000
        statuses = [o.status for o in self.observations]
        return {
            "model": self.model,
            "url": self.url,
            "weight": self.weight,
            "faults": {"error_rate": self.faults.error_rate, "latency_ms": self.faults.latency_ms},
            "pid": self.process.process.pid,
            "restarts": self.restarts,
            "restarting": self.restarting,
            "requests": len(statuses),
            "errors_4xx": sum(1 for s in statuses if 400 <= s < 500),
            "errors_5xx": sum(1 for s in statuses if s >= 500),
            "latency_ms": percentiles_ms(latencies),
        }


@dataclass
class ShadowReport:
    """Primary vs shadow on the copied requests."""

    copied: int = 0
    dropped: int = 0  # copies skipped because too many were in flight (never delays the primary)
    shadow_errors: int = 0
    compared_rows: int = 0
    agreeing_rows: int = 0
    probability_diffs: list[float] = field(default_factory=list)
    incomparable: int = 0
    primary_ms: list[float] = field(default_factory=list)
    shadow_ms: list[float] = field(default_factory=list)

    def compare(self, primary: bytes, shadow: bytes) -> None:
        try:
            a, b = orjson.loads(primary), orjson.loads(shadow)
            labels_a, labels_b = a["predictions"], b["predictions"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            self.incomparable += 1
            return
        if len(labels_a) != len(labels_b):
            self.incomparable += 1
            return
        self.compared_rows += len(labels_a)
        self.agreeing_rows += sum(1 for x, y in zip(labels_a, labels_b, strict=True) if x == y)
        if "probabilities" in a and "probabilities" in b:
            pa, pb = np.asarray(a["probabilities"], dtype=np.float64), np.asarray(b["probabilities"], dtype=np.float64)
            if pa.shape == pb.shape:
                self.probability_diffs.append(float(np.abs(pa - pb).mean()))

    def to_dict(self) -> dict[str, Any]:
        return {
            "copied": self.copied,
            "dropped": self.dropped,
            "shadow_errors": self.shadow_errors,
            "compared_rows": self.compared_rows,
            "label_agreement": self.agreeing_rows / self.compared_rows if self.compared_rows else None,
            "mean_abs_probability_diff": float(np.mean(self.probability_diffs)) if self.probability_diffs else None,
            "incomparable": self.incomparable,
            "latency_ms": {
                "primary": percentiles_ms(np.array(self.primary_ms)),
                "shadow": percentiles_ms(np.array(self.shadow_ms)),
            },
        }


@dataclass(frozen=True)
class VariantPlan:
    """A variant to start: its name, model, weight and the package (or registry) it serves from."""

    name: str
    model: str
    version: str
    weight: float
    package_dir: Path | None  # None: multi-model, served from the registry
    environment: dict[str, str] = field(default_factory=dict)  # the container's, from the SageMaker model
    component: str | None = None  # the inference component this plan is (its name is the plan's name then)
    argv: tuple[str, ...] | None = None  # the image's command, from its staged context (None: the working tree's)
    cwd: Path | None = None  # the image's WORKDIR, staged
    # its image and model data, fetched with the execution role before a green fleet of it starts (None: not
    # a template's container)
    source: ContainerSource | None = None
