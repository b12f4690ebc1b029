"""A SIGKILLed endpoint variant comes back: the router (what `local up` runs per endpoint) restarts each variant's
container when it exits, in its own process group so that killing only granian's master leaves no orphaned
worker serving, and every caller meanwhile gets an answer or a retryable refusal, never a hang or a reset."""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from tests.conftest import ARTIFACTS
from tests.control import control
from tests.functional.test_router import RouterProcess

pytestmark = pytest.mark.slow
KILLS = 20
SAMPLE = (ARTIFACTS / "digits" / "1" / "sample-request.json").read_bytes()
RETRYABLE = {429, 502, 503, 504}
T = TypeVar("T")


def children_of(pid: int) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(proc.name))
    return found


def serving_masters(router: RouterProcess) -> list[int]:
    """The variant containers' master processes (`python -m servestack.adapters.realtime serve`) the router started."""
    masters = []
    for pid in children_of(router.process.pid):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"servestack.adapters.realtime" in command:
            masters.append(pid)
    return masters


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        children = children_of(todo.pop())
        found += children
        todo += children
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_for(what: str, check: Callable[[], T], timeout_sec: float) -> T:
    deadline = time.monotonic() + timeout_sec
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"no {what} after {timeout_sec}s")


# A variant that served this long restarts after the backoff's first delay again (SERVESTACK_VARIANT_STABLE_SEC,
# 2 s by default): each kill below comes once the restarted variant has served a little longer than that.
STABLE_SEC = 0.5
PACE_SEC = 0.005  # each caller's pause between requests: load all the time, without one core spent on sending it


@pytest.fixture
def router(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RouterProcess]:
    monkeypatch.setenv("SERVESTACK_VARIANT_STABLE_SEC", str(STABLE_SEC))
    primary = {"name": "primary", "model": "digits", "version": "1", "weight": 1,
               "package_dir": str(ARTIFACTS / "digits" / "1")}  # fmt: skip
    started = RouterProcess.start(tmp_path, "digits-rt", [primary])
    yield started
    started.stop()


class Load:
    """Realtime requests on keep-alive connections from a few threads, each outcome counted."""

    def __init__(self, url: str, threads: int = 4) -> None:
        self.host, port = url.removeprefix("http://").split(":")
        self.port = int(port)
        self.outcomes: Counter[str] = Counter()
        self.unexpected: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=30)
        while not self._stop.is_set():
            try:
                connection.request("POST", "/invocations", SAMPLE, {"Content-Type": "application/json"})
                response = connection.getresponse()
                body = response.read()
                outcome = str(response.status)
                if response.status not in RETRYABLE and response.status != 200:
                    self.unexpected.append(f"{response.status} {body[:200]!r}")
                if response.status in RETRYABLE:
                    time.sleep(0.05)  # a caller retries after a pause, as boto3's standard retry mode does
            except (OSError, http.client.HTTPException) as error:  # a hang (timeout) or a reset: never expected
                outcome = type(error).__name__
                self.unexpected.append(f"{outcome}: {error}")
                connection.close()
                connection = http.client.HTTPConnection(self.host, self.port, timeout=30)
            with self._lock:
                self.outcomes[outcome] += 1
            self._stop.wait(PACE_SEC)
        connection.close()

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)


def test_twenty_variant_kills_under_load_each_restarted_and_every_request_answered(router: RouterProcess) -> None:
    kills: Counter[str] = Counter()
    with Load(router.url) as load:
        for kill in range(KILLS):
            (master,) = wait_for("serving variant", lambda: serving_masters(router), 60)
            workers = descendants(master)
            # WHEN the variant is SIGKILLed: its master alone (the workers stay), or its whole process tree
            if kill % 2 == 0:
                os.kill(master, signal.SIGKILL)
                kills["master only"] += 1
            else:
                for pid in [master, *workers]:
                    os.kill(pid, signal.SIGKILL)
                kills["master and workers"] += 1
            # THEN the router starts a new container, and no worker of the old one is left serving
            dead, orphans = master, workers
            wait_for("restarted variant", lambda: [p for p in serving_masters(router) if p != dead], 60)  # noqa: B023
            wait_for("orphans gone", lambda: not any(alive(pid) for pid in orphans), 60)  # noqa: B023
            wait_for("ready variant", lambda: load.outcomes["200"] > 0 and _ping_ok(router), 60)
            time.sleep(STABLE_SEC + 0.1)  # it serves past the backoff's stable time: each restart after 0.25 s
    requests = sum(load.outcomes.values())
    print(f"\nvariant kills: {dict(kills)}; requests: {requests}; outcomes: {dict(load.outcomes)}")
    # AND every request was answered 200 or refused with a retryable status
    assert not load.unexpected, load.unexpected[:5]
    assert load.outcomes["200"] > 0
    # AND the router counts the restarts where `local status` reads them
    variants = json.loads(_control_get(router, "/_servestack/metrics"))["variants"]
    assert variants["primary"]["restarts"] == KILLS


def _control_get(router: RouterProcess, path: str) -> bytes:
    return control("GET", f"{router.control_url}{path}", timeout=10).content


def _ping_ok(router: RouterProcess) -> bool:
    connection = http.client.HTTPConnection(router.url.removeprefix("http://").split(":")[0],
                                            int(router.url.rsplit(":", 1)[1]), timeout=10)  # fmt: skip
    try:
        connection.request("GET", "/ping")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()
