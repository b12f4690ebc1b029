"""The drift report as one self-contained HTML file: the summary, a table of every column, each column's two
distributions side by side, and the predictions and class balance.

Self-contained: the plots are PNG images inline (`data:` URIs, drawn with matplotlib, which `servestack[cli]`
installs), the style is inline, and there is no script, font or link to fetch: the file opens offline, and
can be attached to a ticket or a CI run as it is. tests/functional/test_monitor.py parses it.
"""

from __future__ import annotations

import base64
import html
import io
from typing import Any

import numpy as np

from servestack.monitor.drift import ColumnDrift, Comparison

BASELINE_COLOUR = "#4c72b0"
CURRENT_COLOUR = "#dd8452"
MOST_CATEGORIES = 15  # categories plotted per column, the most frequent on either side first

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px; color: #222; max-width: 1200px; }
h1 { font-size: 22px; margin-bottom: 4px; }
h2 { font-size: 18px; border-bottom: 1px solid #ddd; padding-bottom: 4px; margin-top: 28px; }
.verdict { font-size: 16px; font-weight: 600; padding: 8px 12px; border-radius: 4px; display: inline-block; }
.verdict.drift { background: #fde2e1; color: #a4161a; }
.verdict.stable { background: #e1f4e4; color: #1b6b2f; }
table { border-collapse: collapse; font-size: 13px; margin-top: 8px; }
th, td { border: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
tr.drifted td { background: #fff3f2; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.grid { display: flex; flex-wrap: wrap; gap: 12px; margin-top: 12px; }
figure.plot { margin: 0; border: 1px solid #e4e4e4; padding: 6px; border-radius: 4px; }
figure.plot.drifted { border-color: #e5989b; }
figure.plot img { display: block; width: 340px; height: auto; }
figcaption { font-size: 12px; color: #444; margin-top: 4px; max-width: 340px; }
.notes li, .method li { font-size: 13px; }
"""


def render(comparison: Comparison) -> str:
    """The report's HTML text."""
    title = f"Drift report: {comparison.model}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_text(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{_text(title)}</h1>",
        _summary(comparison),
        '<section id="columns"><h2>Columns</h2>',
        _table(comparison.columns),
        "</section>",
        '<section id="distributions"><h2>Distributions: baseline and current, side by side</h2><div class="grid">',
        *(_figure(drift, "column") for drift in comparison.columns),
        "</div></section>",
        '<section id="predictions"><h2>Predictions and class balance</h2>',
        _table(comparison.predictions) if comparison.predictions else "<p>No answer held predictions.</p>",
        '<div class="grid">',
        *(_figure(drift, "prediction") for drift in comparison.predictions),
        "</div></section>",
        _method(),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _text(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _summary(comparison: Comparison) -> str:
    if comparison.drifted:
        drifted = ", ".join([*comparison.drifted_columns, *comparison.drifted_predictions])
        verdict = f'<p class="verdict drift">Drift: {_text(drifted)}</p>'
    else:
        verdict = '<p class="verdict stable">No drift past the thresholds</p>'
    limits = comparison.thresholds
    window = f"{comparison.since or 'no record'} to {comparison.until or 'no record'}"
    facts = [
        ("Model", comparison.model),
        ("Baseline", f"{comparison.baseline_source}: {comparison.baseline_rows} rows"),
        ("Current", f"{comparison.capture_source}: {comparison.records} records, {comparison.current_rows} rows"),
        ("Window", window),
        (
            "Thresholds",
            f"PSI > {limits.psi:g}; Jensen-Shannon > {limits.js:g}; unseen categories > {limits.unseen:.1%}; "
            f"outside the baseline's range > {limits.out_of_range:.1%}; missing rate rise > {limits.missing:.1%}",
        ),
        (
            "Drifted",
            f"{len(comparison.drifted_columns)} of {len(comparison.columns)} columns, "
            f"{len(comparison.drifted_predictions)} of {len(comparison.predictions)} prediction statistics",
        ),
    ]
    rows = "".join(f"<tr><th>{_text(name)}</th><td>{_text(value)}</td></tr>" for name, value in facts)
    notes = ""
    if comparison.notes:
        notes = '<ul class="notes">' + "".join(f"<li>{_text(note)}</li>" for note in comparison.notes) + "</ul>"
    return f'<section id="summary"><h2>Summary</h2>{verdict}<table>{rows}</table>{notes}</section>'


def _table(drifts: list[ColumnDrift]) -> str:
    head = (
        "<tr><th>Column</th><th>Type</th><th>Drift statistic</th><th>Other statistics</th>"
        "<th>Missing (baseline, current)</th><th>Outside range / unseen</th><th>Verdict</th></tr>"
    )
    body = []
    for drift in drifts:
        stats = drift.statistics
        if drift.kind == "numeric":
            main = f"PSI {stats['psi']:.3f}"
            other = f"Wasserstein {stats['wasserstein']:.4g} ({stats['wasserstein_std']:.2f} std)"
            outside = f"{stats['out_of_range']:.1%} outside [{_range(drift)}]"
        else:
            main = f"Jensen-Shannon {stats['js']:.3f}"
            other = f"chi-square p {stats['chi_square_p']:.3g}"
            unseen = ", ".join(f"{name} ({count})" for name, count in drift.unseen.items())
            outside = f"{stats['unseen']:.1%} unseen" + (f": {unseen}" if unseen else "")
        verdict = "; ".join(drift.flags) if drift.flags else "stable"
        body.append(
            f'<tr class="{"drifted" if drift.drifted else "stable"}" data-column="{_text(drift.name)}">'
            f"<td>{_text(drift.name)}</td><td>{drift.kind}</td><td class=num>{_text(main)}</td>"
            f"<td>{_text(other)}</td><td class=num>{drift.baseline_missing:.1%}, {drift.current_missing:.1%}</td>"
            f"<td>{_text(outside)}</td><td>{_text(verdict)}</td></tr>"
        )
    return f"<table>{head}{''.join(body)}</table>"


def _range(drift: ColumnDrift) -> str:
    base = drift.summary.get("baseline", {})
    if base.get("min") is None:
        return "none"
    return f"{base['min']:.4g}, {base['max']:.4g}"


def _figure(drift: ColumnDrift, role: str) -> str:
    image = base64.b64encode(_plot(drift)).decode("ascii")
    main = f"PSI {drift.statistics['psi']:.3f}" if drift.kind == "numeric" else f"JS {drift.statistics['js']:.3f}"
    caption = f"{drift.name}: {main}" + (f" (drift: {'; '.join(drift.flags)})" if drift.flags else "")
    classes = f"plot {role}" + (" drifted" if drift.drifted else "")
    return (
        f'<figure class="{classes}" data-column="{_text(drift.name)}">'
        f'<img alt="{_text(drift.name)}: baseline and current distributions" src="data:image/png;base64,{image}">'
        f"<figcaption>{_text(caption)}</figcaption></figure>"
    )


# ------------------------------------------------------------------------------------------ plots


def _plot(drift: ColumnDrift) -> bytes:
    """The column's two distributions as grouped bars, baseline then current in each bin or category."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no backend to choose

    figure = Figure(figsize=(5.0, 2.6), dpi=80)
    axes = figure.subplots()
    labels, baseline, current, unseen = _bars(drift)
    positions = np.arange(len(labels))
    width = 0.4
    axes.bar(positions - width / 2, baseline, width, color=BASELINE_COLOUR, label="baseline")
    axes.bar(positions + width / 2, current, width, color=CURRENT_COLOUR, label="current")
    for position, share, is_unseen in zip(positions, current, unseen, strict=True):
        if is_unseen:  # above the bar: the category the baseline never had
            axes.annotate(
                "unseen", (position + width / 2, share), ha="center", va="bottom", fontsize=7, color="#a4161a"
            )
    step = max(1, len(labels) // 8) if drift.kind == "numeric" else 1
    ticks = [_plain_text(labels[i]) for i in range(0, len(labels), step)]
    axes.set_xticks(positions[::step], ticks, fontsize=7, rotation=30)
    axes.tick_params(axis="y", labelsize=7)
    axes.set_ylabel("share of rows", fontsize=8)
    axes.set_title(
        _plain_text(drift.name, 60) + ("  (drift)" if drift.drifted else ""),
        fontsize=9,
        color="#a4161a" if drift.drifted else "#222",
    )
    axes.legend(fontsize=7, frameon=False)
    figure.tight_layout()
    stream = io.BytesIO()
    figure.savefig(stream, format="png")
    return stream.getvalue()


def _plain_text(text: str, longest: int = 24) -> str:
    """A category or a column name as matplotlib draws it verbatim: `$` escaped (two of them would start
    mathtext, which refuses most text from traffic), cut to `longest` characters."""
    cut = text if len(text) <= longest else text[: longest - 1] + "…"
    return cut.replace("$", r"\$")


def _bars(drift: ColumnDrift) -> tuple[list[str], np.ndarray, np.ndarray, list[bool]]:
    if drift.kind == "categorical":
        base, now = drift.summary["baseline"], drift.summary["current"]
        ranked = sorted(set(base) | set(now), key=lambda name: -max(base.get(name, 0.0), now.get(name, 0.0)))
        shown = ranked[:MOST_CATEGORIES]
        return (
            shown,
            np.array([base.get(name, 0.0) for name in shown]),
            np.array([now.get(name, 0.0) for name in shown]),
            [name in drift.unseen for name in shown],
        )
    hist = drift.summary["histogram"]
    edges = hist["edges"]
    labels = [f"{edge:.3g}" for edge in edges[:-1]]
    return labels, np.asarray(hist["baseline"]), np.asarray(hist["current"]), [False] * len(labels)


def _method() -> str:
    items = [
        "Numeric columns: population stability index (PSI) over ten quantile bins of the baseline; the first "
        "Wasserstein distance, also in baseline standard deviations; the share of values outside the baseline's "
        "minimum and maximum.",
        "Categorical columns (text, booleans, predicted classes): the Jensen-Shannon distance (base 2, 0 to 1) and "
        "the chi-square test's p-value; the share of values in categories the baseline never had.",
        "Missing values (NaN, null) are counted apart and left out of the distributions.",
        "Predictions: a classifier's predicted classes are its class balance, its highest probability per row its "
        "confidence; a regressor's predictions are numbers. The baseline's are the model's answers to its rows.",
    ]
    listed = "".join(f"<li>{_text(item)}</li>" for item in items)
    return f'<section id="method"><h2>How it is computed</h2><ul class="method">{listed}</ul></section>'
