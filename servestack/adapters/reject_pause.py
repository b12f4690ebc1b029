"""The shared pause before a 429: refusals released together, a timer per slot rather than one per refusal."""

from __future__ import annotations

import asyncio
import math

from servestack.inference.batching import running_loop


class RejectPause:
    """The pause before a 429 (`reject_pause_ms`), shared: refusals due in the same eighth of a pause are
    released together by one timer, instead of one `asyncio.sleep` (a timer and a heap entry) each. Clients
    that retry at once then cannot turn refusals into a storm that starves the admitted requests of the loop,
    and the pause itself costs a future per refusal. Each waits between one pause and 1.125 pauses."""

    def __init__(self, pause_sec: float) -> None:
        self.pause_sec = pause_sec
        self._slot_sec = pause_sec / 8
        self._due: dict[int, list[asyncio.Future[None]]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    async def wait(self) -> None:
        if self.pause_sec <= 0:
            return
        loop = running_loop(self._loop)
        if loop is not self._loop:  # Lambda runs each invocation on a fresh loop
            self._loop, self._due = loop, {}
        slot = math.ceil((loop.time() + self.pause_sec) / self._slot_sec)
        waiter: asyncio.Future[None] = loop.create_future()
        waiting = self._due.get(slot)
        if waiting is None:
            waiting = self._due[slot] = []
            loop.call_at(slot * self._slot_sec, self._release, slot)
        waiting.append(waiter)
        await waiter

    def _release(self, slot: int) -> None:
        for waiter in self._due.pop(slot, ()):
            if not waiter.done():  # a cancelled waiter (its client went away) is skipped
                waiter.set_result(None)
