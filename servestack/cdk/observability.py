"""One CloudWatch dashboard per deployment: latency percentiles, traffic, errors, throttles, queues and
utilisation, from whatever metrics AWS publishes for the deployment's mode."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cw
from constructs import Construct

PERIOD = Duration.minutes(1)


@dataclass
class Panel:
    """One graph: a title, its metrics (left axis) and optional right-axis metrics."""

    title: str
    left: Sequence[cw.IMetric]
    right: Sequence[cw.IMetric] = field(default_factory=list)


def percentiles(metric: cw.Metric, label: str, scale: str = "") -> list[cw.IMetric]:
    """p50/p90/p99 of one metric (`scale`, e.g. '/1000', turns microseconds into ms via math)."""
    out: list[cw.IMetric] = []
    for p in ("p50", "p90", "p99"):
        m = cw.Metric(
            namespace=metric.namespace,
            metric_name=metric.metric_name,
            dimensions_map=metric.dimensions,
            statistic=p,
            period=PERIOD,
            label=f"{label} {p}",
        )
        if scale:
            key = "m_" + re.sub(r"[^a-z0-9]", "_", f"{label}_{p}".lower())
            out.append(cw.MathExpression(expression=f"{key}{scale}", using_metrics={key: m}, label=f"{label} {p} (ms)"))
        else:
            out.append(m)
    return out


class DeploymentDashboard(Construct):
    """A dashboard named after the deployment with one row of graphs per panel, alarms on top."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        dashboard_name: str,
        panels: Sequence[Panel],
        alarms: Sequence[cw.IAlarm] = (),
    ) -> None:
        super().__init__(scope, id)
        if not panels:
            raise ValueError(f"DeploymentDashboard {dashboard_name}: panels=[] is not allowed (need >= 1)")
        self.dashboard = cw.Dashboard(self, "Dashboard", dashboard_name=dashboard_name)
        if alarms:
            self.dashboard.add_widgets(cw.AlarmStatusWidget(title="Guardrails", alarms=list(alarms), width=24))
        widgets: list[cw.IWidget] = [
            cw.GraphWidget(title=p.title, left=list(p.left), right=list(p.right), width=12, height=6, period=PERIOD)
            for p in panels
        ]
        for i in range(0, len(widgets), 2):
            self.dashboard.add_widgets(*widgets[i : i + 2])
