"""How `local up` brings a dead child back: after a delay that doubles while the child keeps dying soon after
it started (1, 2, 4 ... up to a ceiling), and starts again from the first delay once a child ran long enough to
count as healthy. `local up` supervises its own children with it (servestack/local/up/children.py) and each endpoint's
router its variants' containers (servestack/local/sagemaker/router.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Backoff:
    """The delays before each restart of one child."""

    first_sec: float = 1.0
    most_sec: float = 30.0
    stable_sec: float = 60.0  # a child that ran this long died of something new: start again at `first_sec`
    quick_deaths: int = 0

    def next_delay(self, ran_sec: float) -> float:
        """The delay before restarting a child that died after running `ran_sec`."""
        if ran_sec >= self.stable_sec:
            self.quick_deaths = 0
        delay = min(self.most_sec, self.first_sec * 2.0**self.quick_deaths)
        self.quick_deaths += 1
        return delay
