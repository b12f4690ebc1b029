"""How fast `servestack models optimize`'s optimized model is against the float one: the figures it reports, and
the speed gate that refuses a new version slower than the model it replaces.

- **Reported figures** (`measure_speed`): batch 1 and 32, float and optimized interleaved in short rounds, the
  fastest round of each: calls per second and ms per call, as the manifest records them.
- **The speed gate** (`measure_speed_gate`): on one batch of the eval rows, both models are timed in pairs, each
  pair one sample of each model back to back (which goes first alternates), and the gate reads the median over
  the pairs of optimized time / float time. The median of ratios, not a ratio of best or mean times: a pair's
  two samples run back to back, under the same load, so their ratio cancels what the machine does meanwhile,
  and the median drops the pairs that a burst of other work hit on one side only. Each sample is the
  calling thread's CPU time (one intra-op thread, as the serving runtime and this command run onnxruntime, does
  every operator on the calling thread), so the time other processes hold the core is not counted. A
  dynamic-int8 model that runs its convolutions as `ConvInteger` is several times slower than the float
  model on CPUs without int8 dot-product instructions (a resnet18 measured 3.4x); the gate keeps it out
  of the registry unless `--allow-slower` says to push it anyway.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from servestack.inference.manifest import SpeedFigures
    from servestack.inference.service import ServedModel
    from servestack.optimize.rows import Rows

SPEED_BATCHES = (1, 32)
SPEED_ROUNDS = 7

# The gate: a new version whose median time ratio (optimized / float) is above this is refused. 1.0 is "no
# slower", and 0.10 is the noise margin: two copies of the same model, measured as the gate measures them on
# this project's 2-core machine with two busy loops beside them (load ~5), gave medians of 0.90..1.08 over 60
# runs of 51 pairs (digits and breast-cancer at 32 rows), 0.89..1.13 over 60 runs of 11 pairs, and the wine
# pipeline of docs/python-push.md 0.94..1.04 over 80 runs at --speed-sec 0.2 (about 45 pairs) beside three. The
# margin lets an as-fast model through and still refuses any slowdown worth a version (the resnet18 of issue
# 36: 3.4x).
MAX_SPEED_RATIO = 1.10
# Rows per timed call: the eval rows' first 32 (the larger of the reported batch sizes, what the micro-batcher
# groups under realtime load), fewer when there are fewer. A whole eval file of thousands of rows would make
# each call long and the pairs few.
GATE_BATCH_ROWS = 32
# A sample is as many calls as take about 2 ms of CPU: a single call of a small model lasts tens of
# microseconds, and a run of them evens out its call-to-call jitter.
SAMPLE_SEC = 0.002
# Pairs: as many as --speed-sec allows, at least 11 (a call of a large model can take a second; its samples are
# long and steady: 0.97..1.02 over 20 runs of 11 pairs of a conv net) and at most 401, which bounds the
# bookkeeping of a long --speed-sec on a tiny model.
MIN_PAIRS = 11
MAX_PAIRS = 401


# ------------------------------------------------------------------------------------------ reported figures


def _calls_per_sec(predict: Callable[[], Any], seconds: float) -> float:
    """Calls per second over `seconds` (at least one call)."""
    calls = 0
    started = time.perf_counter()
    deadline = started + seconds
    while True:
        predict()
        calls += 1
        now = time.perf_counter()
        if now >= deadline:
            return calls / (now - started)


def measure_speed(float_model: ServedModel, optimized: ServedModel, rows: Rows, seconds: float) -> list[SpeedFigures]:
    """Batch 1 and 32, float and optimized interleaved in short rounds, the fastest round of each reported: load
    from elsewhere on the machine only ever slows a round down, so the fastest is the least disturbed (timeit's
    rule), and interleaving exposes both models to the same conditions."""
    from servestack.inference.manifest import SpeedFigures

    figures: list[SpeedFigures] = []
    for batch_rows in SPEED_BATCHES:
        batch = rows.first(batch_rows)
        rates: dict[str, list[float]] = {"float": [], "optimized": []}
        for _ in range(SPEED_ROUNDS):
            for label, model in (("float", float_model), ("optimized", optimized)):
                rates[label].append(
                    _calls_per_sec(functools.partial(model.runtime.predict, batch), seconds / SPEED_ROUNDS)
                )
        float_rate, optimized_rate = max(rates["float"]), max(rates["optimized"])
        figures.append(
            SpeedFigures(
                batch_rows=batch_rows,
                float_ms_per_call=round(1000 / float_rate, 4),
                optimized_ms_per_call=round(1000 / optimized_rate, 4),
                float_rows_per_sec=round(float_rate * batch_rows, 1),
                optimized_rows_per_sec=round(optimized_rate * batch_rows, 1),
            )
        )
    return figures


# ------------------------------------------------------------------------------------------ the gate


@dataclass(frozen=True)
class SpeedGate:
    """What the speed gate measured and decided. `ratio`: the median over `pairs` of optimized time / float
    time for one call of `batch_rows` rows, so 2.0 is twice as slow and 0.5 twice as fast."""

    ratio: float
    max_ratio: float
    allow_slower: bool
    pairs: int
    calls_per_sample: int
    batch_rows: int
    source: str
    clock: str
    float_ms_per_call: float
    optimized_ms_per_call: float

    @property
    def within(self) -> bool:
        return self.ratio <= self.max_ratio

    @property
    def holds(self) -> bool:
        return self.within or self.allow_slower

    def describe(self, method: str) -> str:
        """The gate's line in the command's output, whatever it decided: `speed gate refuses: dynamic-int8 is
        3.40x slower than the float model (time ratio 3.40 > 1.10; median of 51 interleaved pairs ...)`."""
        if round(self.ratio, 2) > 1:
            pace = f"{self.ratio:.2f}x slower than"
        elif round(1 / self.ratio, 2) > 1:
            pace = f"{1 / self.ratio:.2f}x faster than"
        else:
            pace = "as fast as"
        measured = (
            f"{method} is {pace} the float model (time ratio {self.ratio:.2f} {'<=' if self.within else '>'} "
            f"{self.max_ratio:.2f}; median of {self.pairs} interleaved pairs of {self.calls_per_sample} call(s) of "
            f"{self.batch_rows} row(s) of {self.source}, {self.clock}: float {self.float_ms_per_call:.4g} ms/call, "
            f"{method} {self.optimized_ms_per_call:.4g} ms/call)"
        )
        if self.within:
            return f"speed gate holds: {measured}"
        if self.allow_slower:
            return f"speed gate: {measured}; pushed anyway: --allow-slower"
        return f"speed gate refuses: {measured}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "ratio": self.ratio,
            "max_ratio": self.max_ratio,
            "within": self.within,
            "allow_slower": self.allow_slower,
            "holds": self.holds,
            "pairs": self.pairs,
            "calls_per_sample": self.calls_per_sample,
            "batch_rows": self.batch_rows,
            "source": self.source,
            "clock": self.clock,
            "float_ms_per_call": self.float_ms_per_call,
            "optimized_ms_per_call": self.optimized_ms_per_call,
        }


def _gate_clock() -> tuple[Callable[[], float], str]:
    """The calling thread's CPU time where the platform measures it finely (Linux, macOS: nanoseconds), else
    the wall clock (Windows counts thread time in 15.6 ms ticks, longer than a sample)."""
    if time.get_clock_info("thread_time").resolution <= 1e-6:
        return time.thread_time, "CPU time of the calling thread"
    return time.perf_counter, "wall time"


def _sample(predict: Callable[[], Any], calls: int, clock: Callable[[], float]) -> float:
    started = clock()
    for _ in range(calls):
        predict()
    return clock() - started


def measure_speed_gate(
    float_model: ServedModel,
    optimized: ServedModel,
    rows: Rows,
    seconds: float,
    *,
    max_ratio: float = MAX_SPEED_RATIO,
    allow_slower: bool = False,
) -> SpeedGate:
    """Time both models in interleaved pairs on the first `GATE_BATCH_ROWS` eval rows for about `seconds` (see
    the module's docstring) and hold the median ratio to `max_ratio`."""
    batch_rows = min(rows.count, GATE_BATCH_ROWS)
    batch = rows.first(batch_rows)
    run_float = functools.partial(float_model.runtime.predict, batch)
    run_optimized = functools.partial(optimized.runtime.predict, batch)
    clock, clock_name = _gate_clock()
    run_float()  # onnxruntime allocates a session's buffers on its first run: not part of any sample
    run_optimized()
    one_call = [_sample(run, 1, clock) for run in (run_float, run_optimized)]
    calls = max(1, math.ceil(SAMPLE_SEC / max(min(one_call), 1e-7)))
    pair_sec = calls * sum(one_call)
    pairs = max(MIN_PAIRS, min(MAX_PAIRS, int(seconds / max(pair_sec, 1e-9))))
    float_times: list[float] = []
    optimized_times: list[float] = []
    for pair in range(pairs):
        # Which model goes first alternates, so that neither always runs in the cache state the other leaves.
        if pair % 2 == 0:
            float_times.append(_sample(run_float, calls, clock))
            optimized_times.append(_sample(run_optimized, calls, clock))
        else:
            optimized_times.append(_sample(run_optimized, calls, clock))
            float_times.append(_sample(run_float, calls, clock))
    smallest = 1e-9  # a clock that did not move in a sample (it cannot, with 2 ms samples) divides by nothing
    ratio = statistics.median(o / max(f, smallest) for o, f in zip(optimized_times, float_times, strict=True))
    return SpeedGate(
        ratio=round(ratio, 4),
        max_ratio=max_ratio,
        allow_slower=allow_slower,
        pairs=pairs,
        calls_per_sample=calls,
        batch_rows=batch_rows,
        source=rows.source,
        clock=clock_name,
        float_ms_per_call=round(1000 * statistics.median(float_times) / calls, 4),
        optimized_ms_per_call=round(1000 * statistics.median(optimized_times) / calls, 4),
    )
