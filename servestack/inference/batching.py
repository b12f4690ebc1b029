"""Adaptive micro-batching: requests queue per model and run together, without a fixed wait.

When nothing is queued a request runs at once. While a batch runs, arrivals gather; the next batch takes
up to `max_batch_size` rows of them (optionally waiting up to `max_delay_ms` for more when the queue is
short). Results route back to each caller by row offset. Work is bounded: past `max_queue_rows` queued
rows a submit fails fast with `Overloaded` (HTTP 429), and an item whose deadline has passed before its
batch starts is dropped with `DeadlineExceeded` (HTTP 504). A batch the model refuses for bad input
(`InvalidInput`) is bisected down to the requests at fault (`_run_batch`), so only they get the 400.

On CPU, inference runs on the event loop's thread: with one core per worker a thread hop buys no overlap,
only latency. With CUDA it runs in one worker thread, so the loop decodes the next requests while the GPU
computes (onnxruntime releases the GIL inside `run`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from servestack.inference.errors import DeadlineExceeded, InvalidInput, Overloaded
from servestack.inference.grouping import signature, split, stack

Arrays = dict[str, np.ndarray]
Predict = Callable[[Mapping[str, np.ndarray]], Arrays]


@dataclass(frozen=True, slots=True)
class BatchingConfig:
    max_batch_size: int = 512
    max_delay_ms: float = 0.0
    max_queue_rows: int = 8192
    max_queue_requests: int = 64
    use_thread: bool = False

    def __post_init__(self) -> None:
        for name, low in (("max_batch_size", 1), ("max_queue_rows", 1), ("max_queue_requests", 1)):
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


@dataclass
class BatchStats:
    batches: int = 0
    rows: int = 0
    rejected: int = 0
    expired: int = 0


class MicroBatcher:
    """One per model per process; call `submit` from the event loop that owns it."""

    def __init__(self, predict: Predict, config: BatchingConfig | None = None) -> None:
        self.predict = predict
        self.config = config or BatchingConfig()
        self.stats = BatchStats()
        self._queue: deque[_Pending] = deque()
        self._queued_rows = 0
        self._draining = False
        self._in_flight = 0  # admitted requests not yet answered
        self._drain_task: asyncio.Task[None] | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="inference") if self.config.use_thread else None
        self._service_time_sec = 0.001  # running estimate of one batch's time, for Retry-After
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop `submit` runs on (`running_loop`)
        # The limits `full()` checks for every request, as attributes of their own: one lookup each, not two.
        self._max_requests = self.config.max_queue_requests
        self._max_rows = self.config.max_queue_rows

    @property
    def queued_requests(self) -> int:
        """Requests waiting for a batch (the queue depth the overload metrics report)."""
        return len(self._queue)

    @property
    def in_flight(self) -> int:
        """Admitted requests not yet answered."""
        return self._in_flight

    def retry_after_sec(self) -> int:
        """How long until the queue has likely drained: whole seconds, at least 1 (HTTP's unit)."""
        batches_ahead = self._queued_rows / self.config.max_batch_size + 1
        return max(1, int(batches_ahead * self._service_time_sec + 0.999))

    def full(self) -> bool:
        """Whether every request slot (or the queue's rows) is taken: a new request would be refused."""
        return self._in_flight >= self._max_requests or self._queued_rows >= self._max_rows

    def refuse(self) -> int:
        """Count a refusal the caller answers itself (a precomputed 429) and say when to retry, in seconds."""
        self.stats.rejected += 1
        return self.retry_after_sec()

    def check_admission(self) -> None:
        """Refuse at once with `Overloaded` when every slot is taken, taking nothing: a full worker answers
        429 before reading a body it could not serve."""
        if self.full():
            self.stats.rejected += 1
            raise self._overloaded()

    def acquire(self) -> None:
        """Take one of the worker's request slots once the body is read and decoded, or refuse with
        `Overloaded` when they are all taken. The slot is taken with no await between the check and the
        count, so requests that arrive together cannot all pass the check before any of them counts; and it
        is taken after the body has arrived, so a client stalling mid-body holds no slot. Pair with
        `release()` in a `finally`."""
        if self._in_flight >= self._max_requests or self._queued_rows >= self._max_rows:  # `full()`, inline
            self.stats.rejected += 1
            raise self._overloaded()
        self._in_flight += 1

    def release(self) -> None:
        self._in_flight -= 1

    def _overloaded(self) -> Overloaded:
        return Overloaded(
            f"worker is full ({self._in_flight} requests, {self._queued_rows} rows waiting); "
            f"retry after {self.retry_after_sec()}s",
            field="queue",
            value=self._in_flight,
            allowed=f"<= {self.config.max_queue_requests} requests and {self.config.max_queue_rows} rows per worker",
            retry_after_sec=self.retry_after_sec(),
        )

    def submit(self, arrays: Mapping[str, np.ndarray], rows: int, timeout_sec: float) -> Awaitable[Arrays]:
        """Queue one request's rows; awaiting the result gives its slice of the batch outputs. A plain function,
        not a coroutine: on CPU the awaitable is the request's future itself, one frame less per request."""
        if self._queued_rows + rows > self._max_rows and self._queued_rows > 0:
            self.stats.rejected += 1
            raise self._overloaded()
        loop = self._loop
        if loop is None or not loop.is_running():  # `running_loop`, inline: once per request
            loop = self._loop = asyncio.get_running_loop()
        now = time.monotonic()
        pending = _Pending(arrays, rows, loop.create_future(), now + timeout_sec, now)
        self._queue.append(pending)
        self._queued_rows += rows
        if not self._draining:
            self._draining = True
            if self._executor is None:
                loop.call_soon(self._drain_inline, loop, False)
            else:
                self._drain_task = loop.create_task(self._drain_in_thread())
        # CPU mode needs no timer: nothing runs while a batch holds the loop, so the deadline is checked when
        # the request's batch is formed. With a thread, a timer (not asyncio.wait_for, which wraps every
        # request in a task of its own) answers 504 on time even while a batch is still running.
        if self._executor is None:
            return pending.future
        return _with_timer(
            pending.future, loop.call_at(loop.time() + timeout_sec, _expire, pending.future, timeout_sec)
        )

    def _take_batch(self) -> tuple[list[_Pending], int]:
        """The next batch and its row count: queued requests in order while they fit and share a signature."""
        batch: list[_Pending] = []
        rows = 0
        now = time.monotonic()
        batch_signature = None
        queue, max_rows = self._queue, self.config.max_batch_size
        while queue:
            head = queue[0]
            if batch:
                if rows + head.rows > max_rows:
                    break
                if batch_signature is None:
                    batch_signature = signature(batch[0].arrays)
                if signature(head.arrays) != batch_signature:
                    break
            queue.popleft()
            self._queued_rows -= head.rows
            if head.future.done():  # its caller timed out or went away: drop the work
                continue
            if head.deadline <= now:
                self.stats.expired += 1
                _expire(head.future, 0.0)
                continue
            batch.append(head)
            rows += head.rows
        return batch, rows

    def _gather_delay_sec(self, after_batch: bool) -> float:
        """With `max_delay_ms`, how much longer a short queue may wait to fill (bounded by the oldest item).
        Only after a batch: work arriving at an idle worker runs at once."""
        if (
            not after_batch
            or not self._queue
            or self.config.max_delay_ms <= 0
            or self._queued_rows >= self.config.max_batch_size
        ):
            return 0.0
        return max(0.0, self._queue[0].enqueued + self.config.max_delay_ms / 1000 - time.monotonic())

    def _drain_inline(self, loop: asyncio.AbstractEventLoop, after_batch: bool) -> None:
        """CPU mode: run one batch in this loop callback, then yield to the loop before the next one, so the
        requests that arrived meanwhile are read and decoded and join the next batch."""
        delay = self._gather_delay_sec(after_batch)
        if delay > 0:
            loop.call_later(min(delay, 0.0005), self._drain_inline, loop, True)
            return
        batch, rows = self._take_batch()
        if batch:
            started = time.perf_counter()
            outcome = _run_batch(self.predict, batch)
            self._record(batch, rows, outcome, time.perf_counter() - started)
        if self._queue:
            loop.call_soon(self._drain_inline, loop, True)
        else:
            self._draining = False

    async def _drain_in_thread(self) -> None:
        """GPU mode: batches run in one worker thread while the loop keeps decoding requests."""
        loop = asyncio.get_running_loop()
        after_batch = False
        try:
            while self._queue:
                if (delay := self._gather_delay_sec(after_batch)) > 0:
                    await asyncio.sleep(min(delay, 0.0005))
                    continue
                batch, rows = self._take_batch()
                after_batch = True
                if batch:
                    started = time.perf_counter()
                    outcome = await loop.run_in_executor(self._executor, _run_batch, self.predict, batch)
                    self._record(batch, rows, outcome, time.perf_counter() - started)
        finally:
            self._draining = False

    def _record(
        self, batch: list[_Pending], rows: int, outcome: list[Arrays] | Isolated | BaseException, elapsed_sec: float
    ) -> None:
        self._service_time_sec = 0.8 * self._service_time_sec + 0.2 * elapsed_sec
        self.stats.batches += 1
        self.stats.rows += rows
        _deliver(batch, outcome)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)


def running_loop(remembered: asyncio.AbstractEventLoop | None) -> asyncio.AbstractEventLoop:
    """The running loop, from `remembered` while that one is still running: on Python 3.11 each
    `asyncio.get_running_loop()` makes a getpid system call, which profiling the server under load found to be
    a good part of a request's cost. A loop that no longer runs (Lambda's next invocation brings a fresh one)
    is replaced by asking again."""
    if remembered is not None and remembered.is_running():
        return remembered
    return asyncio.get_running_loop()


async def _with_timer(future: asyncio.Future[Arrays], timer: asyncio.TimerHandle) -> Arrays:
    try:
        return await future
    finally:
        timer.cancel()


def _expire(future: asyncio.Future[Arrays], timeout_sec: float) -> None:
    if not future.done():
        future.set_exception(
            DeadlineExceeded(
                f"no answer within {timeout_sec:g}s" if timeout_sec else "deadline passed while queued",
                field="deadline",
                value=timeout_sec,
                allowed="a longer deadline, or less load",
            )
        )


class Isolated:
    """The outcome of a batch onnxruntime refused as a whole for bad input and that was split until each request
    had its own: per request of the batch, in order, its outputs or its own error. A type of its own so that a
    successful batch's delivery checks nothing per request."""

    __slots__ = ("outcomes",)

    def __init__(self, outcomes: list[Arrays | BaseException]) -> None:
        self.outcomes = outcomes


def _run_batch(predict: Predict, batch: list[_Pending]) -> list[Arrays] | Isolated | BaseException:
    """Concatenate, predict once, split by row offsets. Returns the failure instead of raising it.

    onnxruntime fails the whole batch for one bad row (a category a one-hot encoder never saw, say), and the
    model reports that as `InvalidInput`: the fault of some request in it, not of all. Such a batch is bisected
    until every request has its own answer or its own error, so no caller is blamed for another's rows. Halves
    rather than each request alone: with one bad request among n it costs about 2*log2(n) runs, not n, and it
    still ends at single requests. Any other failure is the server's and goes to every caller as before."""
    try:
        if len(batch) == 1:
            return [predict(batch[0].arrays)]
        outputs = predict(stack([item.arrays for item in batch]))
        return split(outputs, [item.rows for item in batch])
    except InvalidInput as exc:
        return exc if len(batch) == 1 else Isolated(_bisect(predict, batch))
    except BaseException as exc:  # delivered to every caller of the batch, never lost in a task
        return exc


def _bisect(predict: Predict, batch: list[_Pending]) -> list[Arrays | BaseException]:
    outcomes: list[Arrays | BaseException] = []
    middle = len(batch) // 2
    for half in (batch[:middle], batch[middle:]):
        outcome = _run_batch(predict, half)
        if isinstance(outcome, BaseException):
            outcomes.extend([outcome] * len(half))
        elif isinstance(outcome, Isolated):
            outcomes.extend(outcome.outcomes)
        else:
            outcomes.extend(outcome)
    return outcomes


def _deliver(batch: list[_Pending], outcome: list[Arrays] | Isolated | BaseException) -> None:
    if isinstance(outcome, BaseException):
        for item in batch:
            if not item.future.done():
                item.future.set_exception(outcome)
        return
    if isinstance(outcome, Isolated):
        for item, own in zip(batch, outcome.outcomes, strict=True):
            if item.future.done():
                continue
            if isinstance(own, BaseException):
                item.future.set_exception(own)
            else:
                item.future.set_result(own)
        return
    for item, outputs in zip(batch, outcome, strict=True):
        if not item.future.done():
            item.future.set_result(outputs)
