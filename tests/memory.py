"""Peak resident memory of this process, around a block: what the property tests bound.

Linux keeps the peak (VmHWM) in /proc/self/status, and writing 5 to /proc/self/clear_refs resets it to the
current resident size, so the growth seen is that of the block alone, whatever ran before it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

STATUS = Path("/proc/self/status")


def _field_bytes(name: str) -> int:
    line = next(line for line in STATUS.read_text().splitlines() if line.startswith(f"{name}:"))
    return int(line.split()[1]) * 1024


@dataclass
class PeakGrowth:
    """How far the peak resident size rose above where it was when the block began."""

    bytes: int = 0


@contextmanager
def peak_rss_growth() -> Iterator[PeakGrowth]:
    Path("/proc/self/clear_refs").write_text("5")  # peak := current
    start = _field_bytes("VmRSS")
    growth = PeakGrowth()
    try:
        yield growth
    finally:
        growth.bytes = _field_bytes("VmHWM") - start
