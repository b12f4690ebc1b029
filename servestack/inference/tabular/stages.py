"""The stages of a batch run, each on its own thread: `prefetched` reads ahead of the caller, `Writer` stores
behind it. At most `DEPTH` items wait between two stages, so memory stays a few chunks whatever the input's size;
a stage's failure is raised in the caller's thread."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Generator, Iterator
from typing import Any, Generic, TypeVar

from servestack.inference.errors import InternalError

DEPTH = 2
T = TypeVar("T")


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


_END = object()


def prefetched(source: Iterator[T], depth: int = DEPTH) -> Generator[T, None, None]:
    """`source` consumed by a background thread, at most `depth` items ahead of the caller."""
    items: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def fill() -> None:
        try:
            for item in source:
                while not stop.is_set():
                    try:
                        items.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            items.put(_END)
        except BaseException as error:  # handed to the caller, who raises it
            items.put(_Failure(error))

    thread = threading.Thread(target=fill, name="batch-reader", daemon=True)
    thread.start()
    try:
        while True:
            item = items.get()
            if item is _END:
                return
            if isinstance(item, _Failure):
                raise item.error
            yield item
    finally:
        stop.set()
        while thread.is_alive():
            with contextlib.suppress(queue.Empty):
                items.get(timeout=0.1)
        thread.join()


class Writer(Generic[T]):
    """One thread that runs `work` on each submitted item, in order, then `last` after the last one; the first
    failure stops it, and is raised by the next `submit` or by `finish`."""

    def __init__(self, work: Callable[[T], None], depth: int = DEPTH, last: Callable[[], None] | None = None) -> None:
        self.work = work
        self.last = last
        self.items: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="batch-writer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            item = self.items.get()
            if item is _END:
                if self.error is None and self.last is not None:
                    try:
                        self.last()
                    except BaseException as error:  # raised in the caller's thread
                        self.error = error
                return
            if self.error is None:
                try:
                    self.work(item)
                except BaseException as error:  # raised in the caller's thread
                    self.error = error

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def submit(self, item: T) -> None:
        while True:
            self.check()
            try:
                self.items.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def finish(self) -> None:
        self.items.put(_END)
        self.thread.join()
        self.check()

    def abandon(self) -> None:
        self.error = self.error or InternalError("the run stopped")
        while self.thread.is_alive():
            try:
                self.items.put(_END, timeout=0.1)
            except queue.Full:
                with contextlib.suppress(queue.Empty):
                    self.items.get_nowait()
        self.thread.join()
