"""The shared pause before a 429 (servestack/adapters/app.py `RejectPause`): refusals of the same moment share one
timer, none is answered before its pause, and a refusal whose client went away does not break the others."""

from __future__ import annotations

import asyncio

from servestack.adapters.reject_pause import RejectPause


def test_refusals_of_one_moment_share_a_timer_and_each_waits_its_whole_pause() -> None:
    pause = RejectPause(0.05)

    async def scenario() -> tuple[list[float], int]:
        loop = asyncio.get_running_loop()
        started = loop.time()

        async def refused() -> float:
            await pause.wait()
            return loop.time() - started

        # GIVEN 50 refusals made at once
        waits = [asyncio.ensure_future(refused()) for _ in range(50)]
        await asyncio.sleep(0)
        timers = len(pause._due)
        # WHEN their pause is over
        return list(await asyncio.gather(*waits)), timers

    elapsed, timers = asyncio.run(scenario())
    # THEN one or two timers served all 50 (a slot boundary may fall between them), and none returned early
    assert 1 <= timers <= 2
    assert min(elapsed) >= 0.05


def test_a_cancelled_refusal_does_not_release_or_break_the_others() -> None:
    pause = RejectPause(0.02)

    async def scenario() -> list[object]:
        waits = [asyncio.ensure_future(pause.wait()) for _ in range(3)]
        await asyncio.sleep(0)
        # GIVEN one refused client went away while paused
        waits[0].cancel()
        # WHEN the pause ends
        return await asyncio.gather(*waits, return_exceptions=True)

    outcomes = asyncio.run(scenario())
    # THEN the others are released normally
    assert isinstance(outcomes[0], asyncio.CancelledError)
    assert outcomes[1:] == [None, None]


def test_no_pause_configured_returns_at_once() -> None:
    pause = RejectPause(0.0)
    asyncio.run(pause.wait())
    assert pause._due == {}
