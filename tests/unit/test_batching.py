"""The micro-batcher: no wait when idle, coalescing under load, bounded queue, deadlines, failures routed."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping

import numpy as np
import pytest

from servestack.inference.batching import BatchingConfig, MicroBatcher
from servestack.inference.errors import DeadlineExceeded, InferenceError, Overloaded
from tests.waiting import DEADLINE_SEC


class RecordingModel:
    """A real function standing in for onnxruntime: doubles its input, records every batch it ran."""

    def __init__(self, delay_sec: float = 0.0) -> None:
        self.batches: list[int] = []
        self.seen: list[float] = []
        self.delay_sec = delay_sec
        self.called_at: list[float] = []

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.called_at.append(time.perf_counter())
        x = inputs["x"]
        self.batches.append(x.shape[0])
        self.seen.extend(x[:, 0].tolist())
        if self.delay_sec:
            time.sleep(self.delay_sec)
        return {"y": x * 2}


def rows(value: float, count: int = 1, width: int = 3) -> dict[str, np.ndarray]:
    return {"x": np.full((count, width), value, dtype=np.float32)}


def test_an_idle_request_runs_at_once_whatever_the_delay_setting() -> None:
    model = RecordingModel()
    batcher = MicroBatcher(model, BatchingConfig(max_delay_ms=50))

    async def main() -> float:
        submitted = time.perf_counter()
        result = await batcher.submit(rows(1.0), 1, 5.0)
        assert result["y"].tolist() == [[2.0, 2.0, 2.0]]
        return model.called_at[0] - submitted

    waited = asyncio.run(main())
    assert model.batches == [1]
    assert waited < 0.005  # no fixed batching window


def test_concurrent_requests_coalesce_and_results_route_back() -> None:
    model = RecordingModel()
    batcher = MicroBatcher(model, BatchingConfig(max_batch_size=64))

    async def main() -> list[dict[str, np.ndarray]]:
        return await asyncio.gather(*(batcher.submit(rows(float(i), count=i % 3 + 1), i % 3 + 1, 5) for i in range(30)))

    results = asyncio.run(main())
    assert sum(model.batches) == sum(i % 3 + 1 for i in range(30))
    assert len(model.batches) < 30
    for i, result in enumerate(results):
        np.testing.assert_array_equal(result["y"], np.full((i % 3 + 1, 3), 2.0 * i))


def test_batches_never_exceed_max_batch_size() -> None:
    model = RecordingModel()
    batcher = MicroBatcher(model, BatchingConfig(max_batch_size=4))

    async def main() -> None:
        await asyncio.gather(*(batcher.submit(rows(1.0), 1, 5) for _ in range(10)))

    asyncio.run(main())
    assert max(model.batches) <= 4
    assert sum(model.batches) == 10


def test_rows_of_different_shapes_are_not_concatenated() -> None:
    model = RecordingModel()
    batcher = MicroBatcher(model, BatchingConfig())

    async def main() -> list[dict[str, np.ndarray]]:
        return await asyncio.gather(batcher.submit(rows(1.0, width=3), 1, 5), batcher.submit(rows(2.0, width=5), 1, 5))

    narrow, wide = asyncio.run(main())
    assert narrow["y"].shape == (1, 3)
    assert wide["y"].shape == (1, 5)


class GatedModel(RecordingModel):
    """Its first batch waits for `release`; `first_done` is set when that batch has returned. Ordering by
    events, not sleeps: the test must not depend on how fast a loaded machine schedules threads."""

    def __init__(self) -> None:
        super().__init__()
        self.started, self.release, self.first_done = threading.Event(), threading.Event(), threading.Event()

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        first = not self.started.is_set()
        if first:
            self.started.set()
            assert self.release.wait(30)
        answer = super().__call__(inputs)
        if first:
            self.first_done.set()
        return answer


def test_max_delay_lets_a_short_queue_fill_after_a_batch() -> None:
    # GIVEN a model run in a thread (arrivals are seen while it computes) and a delay far longer than the test's
    # own steps, so that it holds on a loaded machine
    model = GatedModel()
    batcher = MicroBatcher(model, BatchingConfig(max_batch_size=8, max_delay_ms=1000, use_thread=True))

    async def main() -> None:
        # WHEN one request finds the worker idle, two more arrive during its batch and one after it
        first = asyncio.ensure_future(batcher.submit(rows(1.0), 1, 5))
        await asyncio.to_thread(model.started.wait, 30)
        during = [asyncio.ensure_future(batcher.submit(rows(1.0), 1, 5)) for _ in range(2)]
        async with asyncio.timeout(DEADLINE_SEC):  # both are queued behind the running batch
            while batcher.queued_requests < 2:
                await asyncio.sleep(0.001)
        model.release.set()
        await asyncio.to_thread(model.first_done.wait, 30)
        after = asyncio.ensure_future(batcher.submit(rows(1.0), 1, 5))
        await asyncio.gather(first, *during, after)

    try:
        asyncio.run(main())
    finally:
        batcher.close()
    # THEN the first ran alone at once, and the late ones waited for each other within max_delay_ms
    # (without the delay the two queued during the first batch would have run without the last one)
    assert model.batches == [1, 3]


def test_a_full_worker_refuses_with_retry_after() -> None:
    model = RecordingModel()
    batcher = MicroBatcher(model, BatchingConfig(max_queue_requests=2))

    async def main() -> list[object]:
        return await asyncio.gather(*(admitted_submit(batcher) for _ in range(5)), return_exceptions=True)

    outcomes = asyncio.run(main())
    refused = [o for o in outcomes if isinstance(o, Overloaded)]
    assert len(refused) == 3
    assert all(o.status_code == 429 and o.retry_after_sec >= 1 for o in refused)
    assert batcher.stats.rejected == 3
    assert sum(model.batches) == 2


async def admitted_submit(batcher: MicroBatcher) -> dict[str, np.ndarray]:
    batcher.acquire()
    try:
        await asyncio.sleep(0)  # as reading a body would: the slot must already be held across this await
        return await batcher.submit(rows(1.0), 1, 5)
    finally:
        batcher.release()


def test_work_whose_deadline_passed_in_the_queue_is_dropped() -> None:
    model = RecordingModel(delay_sec=0.05)
    batcher = MicroBatcher(model, BatchingConfig(max_batch_size=1))

    async def main() -> list[object]:
        first = asyncio.ensure_future(batcher.submit(rows(1.0), 1, 5))
        late = asyncio.ensure_future(batcher.submit(rows(99.0), 1, 0.01))
        return await asyncio.gather(first, late, return_exceptions=True)

    first, late = asyncio.run(main())
    assert isinstance(first, dict)
    assert isinstance(late, DeadlineExceeded)
    assert late.status_code == 504
    assert 99.0 not in model.seen  # never started
    assert batcher.stats.expired == 1


def test_thread_mode_answers_504_on_time_while_a_batch_runs() -> None:
    release = threading.Event()

    def stuck(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        release.wait(2)
        return {"y": inputs["x"]}

    batcher = MicroBatcher(stuck, BatchingConfig(use_thread=True))

    async def main() -> float:
        started = time.perf_counter()
        with pytest.raises(DeadlineExceeded):
            await batcher.submit(rows(1.0), 1, 0.05)
        elapsed = time.perf_counter() - started
        release.set()
        return elapsed

    try:
        assert asyncio.run(main()) < 1.0
    finally:
        release.set()
        batcher.close()


def test_a_failing_batch_fails_each_of_its_callers() -> None:
    def broken(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise InferenceError("model exploded")

    batcher = MicroBatcher(broken, BatchingConfig())

    async def main() -> list[object]:
        return await asyncio.gather(*(batcher.submit(rows(1.0), 1, 5) for _ in range(3)), return_exceptions=True)

    assert all(isinstance(outcome, InferenceError) for outcome in asyncio.run(main()))


def test_invalid_config_names_the_setting() -> None:
    with pytest.raises(ValueError, match="max_delay_ms"):
        BatchingConfig(max_delay_ms=5000)
