"""The real container writes its overload metrics as EMF lines on stdout: aggregated per interval, not per request,
and counting every 429 it answered."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import ARTIFACTS, RealtimeServer
from tests.waiting import wait_for

pytestmark = pytest.mark.slow
SAMPLE = (ARTIFACTS / "digits" / "1" / "sample-request.json").read_bytes()
INTERVAL_SEC = 0.5


def emf_lines(log: Path) -> list[dict]:
    lines = []
    for raw in log.read_text(encoding="utf-8", errors="replace").splitlines():
        if raw.startswith('{"_aws"'):
            lines.append(json.loads(raw))
    return lines


def rejected_so_far(log: Path) -> int:
    """The 429s counted by the EMF lines the running container has written whole so far."""
    text = log.read_text(encoding="utf-8", errors="replace")
    whole = text[: text.rfind("\n") + 1]
    return sum(json.loads(raw)["Rejected"] for raw in whole.splitlines() if raw.startswith('{"_aws"'))


def test_the_container_reports_queue_depth_in_flight_and_429s_in_emf(tmp_path: Path) -> None:
    # GIVEN a container whose worker admits one request at a time, writing metrics every 0.5 s
    env = {
        "SERVESTACK_MAX_QUEUE_REQUESTS": "1",
        "SERVESTACK_MAX_DELAY_MS": "20",
        "SERVESTACK_REJECT_PAUSE_MS": "0",
        "SERVESTACK_METRICS_INTERVAL_SEC": str(INTERVAL_SEC),
        "SERVESTACK_ENDPOINT_NAME": "digits-realtime",
        "SERVESTACK_VARIANT_NAME": "primary",
    }
    server = RealtimeServer.start(tmp_path, env=env)
    started = time.monotonic()

    async def burst() -> list[int]:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            responses = await asyncio.gather(
                *(
                    client.post("/invocations", content=SAMPLE, headers={"Content-Type": "application/json"})
                    for _ in range(60)
                )
            )
        return [r.status_code for r in responses]

    try:
        # WHEN 60 requests arrive at once (again, up to 5 bursts: a request that finds nothing queued runs at once,
        # so on a busy machine a burst can be served one by one without ever filling the queue)
        statuses: list[int] = []
        for _ in range(5):
            statuses += asyncio.run(burst())
            if 429 in statuses:
                break
        # ...and the lines of the intervals the bursts fell in are written (not only the last partial interval's,
        # which SIGTERM writes)
        wait_for(lambda: rejected_so_far(server.log_path) >= statuses.count(429), "EMF lines counting the 429s")
    finally:
        server.stop()  # SIGTERM: the last partial interval is written too
    elapsed = time.monotonic() - started
    lines = emf_lines(server.log_path)

    # THEN some were refused, and the lines count every 429, no more, no less
    assert statuses.count(429) > 0
    assert statuses.count(200) + statuses.count(429) == len(statuses)  # 60 a burst, nothing else
    assert sum(line["Rejected"] for line in lines) == statuses.count(429)
    # AND the container wrote one line per interval, not one per request
    assert 1 <= len(lines) <= elapsed / INTERVAL_SEC + 2
    assert all(line["EndpointName"] == "digits-realtime" and line["VariantName"] == "primary" for line in lines)
    assert max(max(line["InFlight"]) for line in lines) <= 1  # never more admitted than the worker allows
