"""Latency summaries: the one way loadtest's report and local mode's router (variants, shadow) state them."""

from __future__ import annotations

import numpy as np


def percentiles_ms(values_ms: np.ndarray) -> dict[str, float]:
    """p50, p90, p99, max and mean of latencies in milliseconds ({} for none)."""
    if values_ms.size == 0:
        return {}
    p50, p90, p99 = np.percentile(values_ms, [50, 90, 99])
    return {
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "max": float(values_ms.max()),
        "mean": float(values_ms.mean()),
    }
