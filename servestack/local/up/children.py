"""The supervisor of `local up`'s children: it brings a dead one back, with backoff."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from servestack.local.planning import Child

__all__ = ["Child", "Supervisor", "stop_children"]


class Supervisor:
    """Restarts children that exit, after 1, 2, 4 ... 30 s; a child that ran 60 s starts again at 1 s. What its
    exit left of its process group (workers of a killed master) is killed first. `restarts` counts each child's
    restarts since local up started; `on_restart` hears of each (local up writes them to the state file)."""

    def __init__(
        self, children: list[Child], log: Callable[[str], None], on_restart: Callable[[], None] | None = None
    ) -> None:
        self.children = children
        self.log = log
        self.on_restart = on_restart
        self.restarts: dict[str, int] = dict.fromkeys((child.name for child in children), 0)

    def tick(self) -> None:
        from servestack.local.hosting import kill_group

        now = time.monotonic()
        for child in self.children:
            if child.next_start is not None:
                if now >= child.next_start:
                    self.log(f"{child.name}: restarting (restart {self.restarts[child.name] + 1})")
                    child.start()
                    self.restarts[child.name] += 1
                    if self.on_restart is not None:
                        self.on_restart()
                continue
            code = child.process.poll()
            if code is None:
                continue
            kill_group(child.process)
            if now - child.started_at > 60:
                child.restarts = 0
            delay = min(30.0, 2.0**child.restarts)
            child.restarts += 1
            child.next_start = now + delay
            self.log(f"{child.name}: exited with code {code}; restarting in {delay:.0f}s")


def stop_children(children: list[Child]) -> None:
    """Stop every child at once: each is sent SIGTERM and given its grace period in a thread of its own, so that
    stopping local up takes the slowest child's drain, not the sum of them all."""
    running = [child for child in children if child.process is not None]
    if not running:
        return
    with ThreadPoolExecutor(len(running), thread_name_prefix="stop") as pool:
        list(pool.map(Child.stop, running))
