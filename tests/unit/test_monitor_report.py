"""The drift report's HTML (servestack/monitor/report.py) on what traffic can hold: category and column names
that are HTML or mathtext, thousands of categories, empty sides; and the verdicts that must stay quiet on
traffic from the baseline's own distribution."""

from __future__ import annotations

import json
from html.parser import HTMLParser

import numpy as np
import pytest

from servestack.monitor.drift import MOST_SHARES, Comparison, Thresholds, compare
from servestack.monitor.report import render


def comparison(columns: list[object], predictions: list[object] | None = None) -> Comparison:
    return Comparison(
        model="m@1",
        baseline_source="train.csv",
        capture_source="capture/",
        since=None,
        until=None,
        records=1,
        baseline_rows=1,
        current_rows=1,
        thresholds=Thresholds(),
        columns=columns,  # type: ignore[arg-type]
        predictions=predictions or [],  # type: ignore[arg-type]
    )


class Texts(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)


def test_names_from_traffic_are_escaped_and_drawn_verbatim() -> None:
    # GIVEN a column named like markup and categories that are mathtext, markup, or very long
    hostile = ["$x$", "$5 or $10", "<script>alert(1)</script>", r"\frac{", "x" * 500]
    base = np.array(["a", "b"] * 50, dtype=object)
    now = np.array((hostile * 20)[:100], dtype=object)
    drift = compare("<b>name</b> $", "categorical", base, now, Thresholds())
    # WHEN the report is rendered THEN it draws every plot, and the HTML holds no tag of the traffic's
    page = render(comparison([drift]))
    parser = Texts()
    parser.feed(page)
    assert "script" not in parser.tags
    assert "b" not in parser.tags
    assert "&lt;b&gt;name&lt;/b&gt; $" in page
    assert page.count("data:image/png;base64,") == 1


def test_an_id_like_column_keeps_the_summary_small() -> None:
    ids = np.array([f"id-{i}" for i in range(5000)], dtype=object)
    drift = compare("id", "categorical", ids[:2500], ids[2500:], Thresholds())
    assert len(drift.summary["baseline"]) == MOST_SHARES
    assert len(drift.unseen) == 10
    assert len(json.dumps(comparison([drift]).to_json())) < 20_000


def test_an_empty_side_renders() -> None:
    drift = compare("x", "numeric", np.array([1.0, 2.0]), np.array([], dtype=float), Thresholds())
    assert drift.flags == []
    assert "data:image/png;base64," in render(comparison([drift]))


@pytest.mark.parametrize("seed", range(20))
def test_samples_of_the_baselines_own_distribution_are_not_flagged(seed: int) -> None:
    # GIVEN a baseline of 500 rows and a window of 2000 fresh rows of the same distributions (not resampled
    # from the baseline: new values, some past its range)
    rng = np.random.default_rng(seed)
    limits = Thresholds()
    numbers = [
        (rng.normal(size=500), rng.normal(size=2000)),
        (rng.exponential(size=500), rng.exponential(size=2000)),
        (rng.integers(0, 5, 500).astype(float), rng.integers(0, 5, 2000).astype(float)),
    ]
    shares = [0.5, 0.3, 0.15, 0.05]
    sites = np.array(["north", "south", "east", "west"], dtype=object)
    base_sites, now_sites = rng.choice(sites, 500, p=shares), rng.choice(sites, 2000, p=shares)
    # THEN no column is flagged with the default thresholds
    for baseline, current in numbers:
        assert compare("n", "numeric", baseline, current, limits).flags == []
    assert compare("c", "categorical", base_sites, now_sites, limits).flags == []
