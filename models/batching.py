"""Adaptive micro-batching: requests queue per model and run together, without a fixed wait.

When nothing is queued a request runs at once. While a batch runs, arrivals gather; the next batch takes
up to `max_batch_size` rows of them (optionally waiting up to `max_delay_ms` for more when the queue is
short). Results route back to each caller by row offset. Work is bounded: past `max_queue_rows` queued
rows a submit fails fast with `Overloaded` (HTTP 429), and an item whose deadline has passed before its
batch starts is dropped with `DeadlineExceeded` (HTTP 504).

On CPU, inference runs on the event loop's thread: with one core per worker a thread hop buys no overlap,
only latency. With CUDA it runs in one worker thread, so the loop decodes the next requests while the GPU
computes (onnxruntime releases the GIL inside `run`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from models.errors import DeadlineExceeded, Overloaded

Arrays = dict[str, np.ndarray]
Predict = Callable[[Mapping[str, np.ndarray]], Arrays]


@dataclass(frozen=True, slots=True)
class BatchingConfig:
    max_batch_size: int = 64
    max_delay_ms: float = 0.0
    max_queue_rows: int = 1024
    use_thread: bool = False

    def __post_init__(self) -> None:
        for name, low in (("max_batch_size", 1), ("max_queue_rows", 1)):
            if getattr(self, name) < low:
                raise ValueError(f"{name}: {getattr(self, name)} is not >= {low}")
        if not 0 <= self.max_delay_ms <= 1000:
            raise ValueError(f"max_delay_ms: {self.max_delay_ms} is not in 0..1000")


@dataclass(slots=True)
class _Pending:
    arrays: Mapping[str, np.ndarray]
    rows: int
    future: asyncio.Future[Arrays]
    deadline: float
    enqueued: float = field(default_factory=time.monotonic)
    signature: tuple[tuple[str, tuple[int, ...], str], ...] = ()

    def __post_init__(self) -> None:
        # Only requests whose rows have the same shape and dtype can share one concatenated batch.
        self.signature = tuple((name, value.shape[1:], value.dtype.str) for name, value in self.arrays.items())


@dataclass
class BatchStats:
    batches: int = 0
    rows: int = 0
    rejected: int = 0
    expired: int = 0

    @property
    def mean_batch_rows(self) -> float:
        return self.rows / self.batches if self.batches else 0.0


class MicroBatcher:
    """One per model per process; call `submit` from the event loop that owns it."""

    def __init__(self, predict: Predict, config: BatchingConfig | None = None) -> None:
        self.predict = predict
        self.config = config or BatchingConfig()
        self.stats = BatchStats()
        self._queue: deque[_Pending] = deque()
        self._queued_rows = 0
        self._draining = False
        self._drain_task: asyncio.Task[None] | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="inference") if self.config.use_thread else None
        self._service_time_sec = 0.001  # running estimate of one batch's time, for Retry-After

    @property
    def queued_rows(self) -> int:
        return self._queued_rows

    def retry_after_sec(self) -> int:
        """How long until the queue has likely drained: whole seconds, at least 1 (HTTP's unit)."""
        batches_ahead = self._queued_rows / self.config.max_batch_size + 1
        return max(1, int(batches_ahead * self._service_time_sec + 0.999))

    async def submit(self, arrays: Mapping[str, np.ndarray], rows: int, timeout_sec: float) -> Arrays:
        """Queue one request's rows and wait for its slice of the batch outputs."""
        if self._queued_rows + rows > self.config.max_queue_rows and self._queued_rows > 0:
            self.stats.rejected += 1
            raise Overloaded(
                f"queue is full ({self._queued_rows} rows waiting); retry after {self.retry_after_sec()}s",
                field="queue",
                value=self._queued_rows,
                allowed=f"<= {self.config.max_queue_rows} queued rows per worker",
                retry_after_sec=self.retry_after_sec(),
            )
        loop = asyncio.get_running_loop()
        pending = _Pending(arrays, rows, loop.create_future(), time.monotonic() + timeout_sec)
        self._queue.append(pending)
        self._queued_rows += rows
        if not self._draining:
            self._draining = True
            self._drain_task = loop.create_task(self._drain())
        try:
            return await asyncio.wait_for(asyncio.shield(pending.future), timeout_sec)
        except TimeoutError:
            raise DeadlineExceeded(
                f"no answer within {timeout_sec:g}s", field="deadline", value=timeout_sec, allowed="a longer deadline"
            ) from None

    def _take_batch(self) -> list[_Pending]:
        batch: list[_Pending] = []
        rows = 0
        now = time.monotonic()
        while self._queue:
            head = self._queue[0]
            if batch and (rows + head.rows > self.config.max_batch_size or head.signature != batch[0].signature):
                break
            self._queue.popleft()
            self._queued_rows -= head.rows
            if head.future.done():
                continue
            if head.deadline <= now:  # expired before it started: drop the work, answer 504
                self.stats.expired += 1
                head.future.set_exception(DeadlineExceeded("deadline passed while queued", field="deadline"))
                continue
            batch.append(head)
            rows += head.rows
        return batch

    async def _gather_more(self) -> None:
        """With `max_delay_ms`, let a short queue fill a little, bounded by the oldest item's age."""
        if not self._queue or self.config.max_delay_ms <= 0:
            return
        limit = self._queue[0].enqueued + self.config.max_delay_ms / 1000
        while self._queued_rows < self.config.max_batch_size and (wait := limit - time.monotonic()) > 0:
            await asyncio.sleep(min(wait, 0.0005))

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._queue:
                await self._gather_more()
                batch = self._take_batch()
                if not batch:
                    continue
                started = time.perf_counter()
                if self._executor is not None:
                    outcome = await loop.run_in_executor(self._executor, _run_batch, self.predict, batch)
                else:
                    outcome = _run_batch(self.predict, batch)
                self._service_time_sec = 0.8 * self._service_time_sec + 0.2 * (time.perf_counter() - started)
                self.stats.batches += 1
                self.stats.rows += sum(item.rows for item in batch)
                _deliver(batch, outcome)
                # Yield so the loop can read and decode the requests that arrived meanwhile.
                await asyncio.sleep(0)
        finally:
            self._draining = False

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)


def _run_batch(predict: Predict, batch: list[_Pending]) -> list[Arrays] | BaseException:
    """Concatenate, predict once, split by row offsets. Returns the failure instead of raising it."""
    try:
        if len(batch) == 1:
            return [predict(batch[0].arrays)]
        names = batch[0].arrays.keys()
        joined = {name: np.concatenate([item.arrays[name] for item in batch]) for name in names}
        outputs = predict(joined)
        offsets = np.cumsum([item.rows for item in batch])[:-1]
        pieces = {name: np.split(value, offsets) for name, value in outputs.items()}
        return [{name: pieces[name][index] for name in outputs} for index in range(len(batch))]
    except BaseException as exc:  # delivered to every caller of the batch, never lost in a task
        return exc


def _deliver(batch: list[_Pending], outcome: list[Arrays] | BaseException) -> None:
    for index, item in enumerate(batch):
        if item.future.done():
            continue
        if isinstance(outcome, BaseException):
            item.future.set_exception(outcome)
        else:
            item.future.set_result(outcome[index])
