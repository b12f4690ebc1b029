"""One set of alarm definitions: CloudWatch's evaluation rule, applied locally by the rehearsal."""

from __future__ import annotations

import pytest

from servestack.alarms import Observation, datapoints, sagemaker_variant_alarms
from servestack.local.sagemaker.backends import Faults
from servestack.local.sagemaker.rehearsal import steps_of
from servestack.spec import AlarmSettings


def test_definitions_carry_the_spec_thresholds_in_cloudwatch_units() -> None:
    rate, latency = sagemaker_variant_alarms(AlarmSettings(error_rate_percent=2, p99_latency_ms=50))
    assert (rate.metric, rate.denominator, rate.threshold, rate.unit) == (
        "Invocation5XXErrors",
        "Invocations",
        2,
        "percent",
    )
    assert (latency.metric, latency.statistic, latency.threshold) == ("ModelLatency", "p99", 50_000)


def test_an_alarm_fires_only_when_every_evaluated_period_breaches() -> None:
    rate, latency = (a.with_period(1, 2) for a in sagemaker_variant_alarms(AlarmSettings()))
    ok = [Observation(t / 10, 200, 1000) for t in range(20)]
    bad = [Observation(0.5, 500, 1000), Observation(1.5, 503, 1000)]
    assert datapoints(rate, ok, 0, 2.0) == [0.0, 0.0]
    assert not rate.evaluate(datapoints(rate, ok, 0, 2.0))
    assert datapoints(rate, ok + bad, 0, 2.0) == pytest.approx([100 / 11, 100 / 11])
    assert rate.evaluate(datapoints(rate, ok + bad, 0, 2.0))
    assert not rate.evaluate(datapoints(rate, ok + bad[:1], 0, 2.0))  # one breaching period of two
    assert not rate.evaluate([None, None])  # missing data is not breaching
    slow = [Observation(0.5, 200, 900_000), Observation(1.5, 200, 900_000)]
    assert latency.evaluate(datapoints(latency, slow, 0, 2.0))


def test_strategies_become_traffic_steps() -> None:
    assert [(s.percent, s.hold_sec) for s in steps_of("canary", 10, 20, 5, 7)] == [(10, 5), (100, 7)]
    assert [s.percent for s in steps_of("linear", 10, 25, 5, 7)] == [25, 50, 75, 100]
    assert [s.percent for s in steps_of("all_at_once", 10, 25, 5, 7)] == [100]


def test_fault_specs_are_checked() -> None:
    assert Faults.parse("error_rate=0.2,latency_ms=50") == Faults(0.2, 50)
    assert not Faults.parse(None)
    with pytest.raises(ValueError, match="'oops' is not one of error_rate, latency_ms"):
        Faults.parse("oops=1")
    with pytest.raises(ValueError, match=r"error_rate=2.0 is not in 0..1"):
        Faults.parse("error_rate=2")
