"""`servestack plan`: four traffic profiles get the mode SageMaker's decision table gives (steady -> realtime,
spiky and low -> serverless, large payloads -> async, offline rows -> batch), every cost line is its quantity
times the price file's figure, the fragment is valid serving.yaml, and concurrency = QPS x latency exactly."""

from __future__ import annotations

import json
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml

from servestack.cli.main import main
from servestack.loadtest.driver import Report, Sample, rows_in, summarize
from servestack.plan import PRICES_FILE, Measurement, Plan, Prices, load_measurement, plan, render, traffic_from
from servestack.sizing import concurrency
from servestack.spec import parse_spec

HOURS_PER_MONTH = Fraction(730)


def loadtest_report(path: Path, *, ok_qps: float, p99_ms: float, mean_ms: float, body: int, rows: int) -> Path:
    """A report in the exact form `servestack loadtest` writes (its own dataclass and `to_json`)."""
    latency = {"p50": mean_ms, "p90": p99_ms, "p99": p99_ms, "max": p99_ms * 2, "mean": mean_ms}
    report = Report(
        mode="closed loop, 16 connections",
        duration_sec=10.0,
        requests=int(ok_qps * 10),
        qps=ok_qps,
        ok_qps=ok_qps,
        statuses={"200": int(ok_qps * 10)},
        errors={},
        latency_ms=latency,
        ok_latency_ms=latency,
        retry_after_seen=0,
        request_bytes=body,
        request_rows=rows,
    )
    path.write_text(report.to_json())
    return path


@pytest.fixture
def prices() -> Prices:
    return Prices.load()


@pytest.fixture
def local_run(tmp_path: Path) -> Measurement:
    # One local core answering 8,000 req/s of 4-row, 1.4 KB requests, p99 3 ms.
    path = loadtest_report(tmp_path / "local.json", ok_qps=8000.0, p99_ms=3.0, mean_ms=1.6, body=1370, rows=4)
    return load_measurement(path, "local", 1)


def price_of(key: str) -> Fraction:
    """A unit price read straight from the JSON file, independently of servestack.plan's reader."""
    document = json.loads(PRICES_FILE.read_text())
    if key.startswith("sagemaker:"):
        return Fraction(Decimal(document["sagemaker_realtime"]["instances"][key.split(":", 1)[1]]["usd_per_hour"]))
    entry = document["prices"][key]
    count = entry["per"].split(" ")[0]
    return Fraction(Decimal(entry["usd"])) / (int(count) if count.isdigit() else 1)


def assert_costs_match_price_file(result: Plan) -> None:
    for option in result.options:
        if not option.feasible:
            assert option.monthly_usd is None
            assert option.reason
            continue
        for line in option.lines:
            assert line.unit_usd == price_of(line.price_key), line.what
            assert line.usd == line.quantity * price_of(line.price_key)
        assert option.monthly_usd == sum(line.quantity * price_of(line.price_key) for line in option.lines)


def option(result: Plan, mode: str) -> Any:
    return next(o for o in result.options if o.mode == mode)


def assert_fragment_is_valid_serving_yaml(result: Plan) -> None:
    fragment = result.fragment()
    assert fragment is not None
    text = yaml.safe_dump(fragment)
    parse_spec({"models": [{"name": result.model, "version": 1}], **yaml.safe_load(text)})


def test_steady_high_qps_recommends_realtime(prices: Prices, local_run: Measurement) -> None:
    # GIVEN 2,000 req/s on average, peaks of 2,500, all day, small payloads, a 50 ms p99 SLO
    traffic = traffic_from({"peak_qps": 2500, "average_qps": 2000, "payload": "1.4 KB", "p99_ms": 50})
    # WHEN planned from one local core's measurement
    result = plan(traffic, [local_run], prices, model="digits")
    # THEN realtime is recommended, on the cheapest instance whose estimated capacity carries the peak
    chosen = result.recommended
    assert chosen is not None
    assert chosen.mode == "realtime"
    assert chosen.estimate
    assert chosen.deployment == {
        "instance_type": "ml.c6i.large",  # 2 vCPUs x 8,000 req/s; ties with ml.c5.large go to the newer type
        "min_instances": 1,
        "max_instances": 1,
        "target_invocations_per_instance": 640_000,  # 16,000 / 1.5 headroom per second, x 60
    }
    # AND its cost is one instance for the 730 hours of a month at the file's hourly price
    assert chosen.monthly_usd == 730 * Fraction("0.102")
    # AND serverless is feasible but dearer: 5.256 billion requests a month
    serverless = option(result, "serverless")
    assert serverless.details["requests"] == 2000 * 3600 * HOURS_PER_MONTH
    assert serverless.monthly_usd > chosen.monthly_usd
    assert "SLO" in option(result, "async").reason
    assert "SLO" in option(result, "batch").reason
    assert_costs_match_price_file(result)
    assert_fragment_is_valid_serving_yaml(result)


def test_spiky_low_qps_recommends_serverless(prices: Prices, local_run: Measurement) -> None:
    # GIVEN half a request per second on average, bursts of 20 req/s, 10 hours a day, a 300 ms p99 SLO
    traffic = traffic_from(
        {"average_qps": "0.5", "burstiness": 40, "hours_per_day": 10, "payload": "1.4 KB", "p99_ms": 300}
    )
    result = plan(traffic, [local_run], prices, model="digits")
    # THEN serverless: 547,500 requests a month at 1 ms billed (0.125 ms measured) beats an always-on instance
    chosen = result.recommended
    assert chosen is not None
    assert chosen.mode == "serverless"
    requests = Fraction(1, 2) * 10 * 3600 * HOURS_PER_MONTH / 24
    assert chosen.details["requests"] == requests == 547_500
    assert chosen.details["billed_ms"] == 1
    expected = requests * (price_of("lambda.request") + price_of("apigateway.http_request")) + requests * Fraction(
        1, 1000
    ) * 2 * price_of("lambda.duration.x86_64")
    assert chosen.monthly_usd == expected
    realtime = option(result, "realtime")
    assert realtime.feasible
    assert realtime.monthly_usd == 730 * Fraction("0.102")
    assert_costs_match_price_file(result)
    assert_fragment_is_valid_serving_yaml(result)


def test_200_mb_payloads_recommend_async(prices: Prices, local_run: Measurement) -> None:
    # GIVEN 200 MB requests, 3 a minute at peak and 1 a minute on average, answers within 2 minutes
    traffic = traffic_from({"peak_qps": "0.05", "average_qps": "1/60", "payload": "200 MB", "p99_ms": 120_000})
    result = plan(traffic, [local_run], prices, model="digits")
    # THEN the synchronous modes are ruled out by their 6 MB limits and batch by its schedule
    assert "6 MB" in option(result, "realtime").reason
    assert "6 MB" in option(result, "serverless").reason
    assert not option(result, "batch").feasible
    # AND async is recommended; a job takes 200 MB / (1,370 bytes x 8,000 req/s per core)
    chosen = result.recommended
    assert chosen is not None
    assert chosen.mode == "async"
    assert chosen.details["seconds_per_job"] == Fraction(200_000_000, 1370 * 8000)
    jobs = Fraction(1, 60) * 3600 * HOURS_PER_MONTH
    assert chosen.details["jobs"] == jobs == 43_800
    assert chosen.deployment is not None
    assert chosen.deployment["batch_size"] == 1
    storage = next(line for line in chosen.lines if line.price_key == "s3.storage")
    assert storage.quantity == jobs * 200_000_000 * 7 / (HOURS_PER_MONTH / 24) / 2**30
    assert_costs_match_price_file(result)
    assert_fragment_is_valid_serving_yaml(result)


def test_a_nightly_billion_rows_recommends_batch(prices: Prices, local_run: Measurement) -> None:
    # GIVEN a billion rows a night, done within 6 hours, scored at a measured 139,000 rows/s per core
    traffic = traffic_from({"rows_per_day": 1_000_000_000, "batch_window_hours": 6})
    result = plan(traffic, [local_run], prices, model="breast-cancer", batch_rows_per_sec=Fraction(139_000))
    # THEN every online mode is ruled out and batch runs on Fargate (2 hours: over Lambda's 15 minutes)
    for mode in ("realtime", "serverless", "async"):
        assert "no online requests" in option(result, mode).reason
    chosen = result.recommended
    assert chosen is not None
    assert chosen.mode == "batch"
    assert not chosen.estimate
    assert chosen.deployment is not None
    assert chosen.deployment["runner"] == "fargate"
    seconds = Fraction(1_000_000_000, 139_000)
    assert chosen.details["seconds_per_run"] == seconds
    runs = HOURS_PER_MONTH / 24
    hours = Fraction(-(-seconds // 1), 3600) * runs  # billed per second
    parts = 1_000_000_000 // 10_000 + 1
    assert chosen.monthly_usd == (
        hours * (price_of("fargate.vcpu") + 4 * price_of("fargate.memory") + price_of("vpc.public_ipv4"))
        + parts * runs * price_of("s3.put")
    )
    assert_costs_match_price_file(result)
    assert_fragment_is_valid_serving_yaml(result)


def test_batch_rules_itself_out_when_one_run_overflows_the_window(prices: Prices, local_run: Measurement) -> None:
    # GIVEN only the HTTP measurement (4 rows x 8,000 req/s = 32,000 rows/s per core, an estimate)
    traffic = traffic_from({"rows_per_day": 1_000_000_000, "batch_window_hours": 6})
    result = plan(traffic, [local_run], prices)
    # THEN 8.7 hours does not fit 6, and the plan says so rather than recommending anything
    assert result.recommended is None
    assert "8.7 h" in option(result, "batch").reason
    assert "6.0 h window" in option(result, "batch").reason


def test_concurrency_is_qps_times_latency_exactly(prices: Prices, tmp_path: Path) -> None:
    # GIVEN a model measured at 0.2 s per request on one core (5 req/s), and a peak of 100 req/s
    assert concurrency(100, 0.2) == 20
    assert concurrency("0.1", 30) == 3  # binary floats make 0.1 x 30 = 3.0000000000000004, i.e. 4
    slow = load_measurement(
        loadtest_report(tmp_path / "slow.json", ok_qps=5.0, p99_ms=250.0, mean_ms=200.0, body=100, rows=1),
        "local",
        1,
    )
    traffic = traffic_from({"peak_qps": 100, "average_qps": 10, "payload": 100, "p99_ms": 1000})
    # WHEN planned THEN Lambda needs 20 environments at peak, not 21
    serverless = option(plan(traffic, [slow], prices), "serverless")
    assert serverless.details["concurrency_at_peak"] == 20
    assert "concurrency at peak 20 " in serverless.configuration


def test_the_load_tester_sizes_exactly_too() -> None:
    # GIVEN three 0.2 s answers (their float mean is 0.20000000000000004) and a 100 req/s target
    samples = [Sample(started=0.0, latency_sec=0.2, status=200) for _ in range(3)]
    # WHEN summarised without headroom THEN 20 requests are in flight
    report = summarize(samples, "closed loop", 1.0, headroom=1.0, target_qps=100)
    assert report.provisioning["concurrency"] == 20


def test_the_load_tester_records_the_rows_of_its_request() -> None:
    import io

    import numpy as np

    npy = io.BytesIO()
    np.save(npy, np.zeros((32, 64), np.float32))
    assert rows_in(b'{"instances": [[1], [2], [3]]}', "application/json") == 3
    assert rows_in(b'{"inputs": {"a": [[1], [2]], "b": [[3], [4]]}}', "application/json") == 2
    assert rows_in(b"1,2\n3,4\n\n", "text/csv") == 2
    assert rows_in(npy.getvalue(), "application/x-npy") == 32
    assert rows_in(b"not json", "application/json") is None


def test_a_measured_instance_type_is_used_as_measured(prices: Prices, tmp_path: Path) -> None:
    # GIVEN only a load test on a real ml.c6i.xlarge that sustained 20,000 req/s at p99 4 ms
    path = loadtest_report(tmp_path / "c6i.json", ok_qps=20000.0, p99_ms=4.0, mean_ms=2.0, body=1370, rows=4)
    measured = load_measurement(path, "ml.c6i.xlarge", prices.instances["ml.c6i.xlarge"].vcpus)
    traffic = traffic_from({"peak_qps": 30000, "average_qps": 25000, "payload": "1.4 KB", "p99_ms": 50})
    # WHEN planned
    result = plan(traffic, [measured], prices)
    realtime = option(result, "realtime")
    # THEN realtime uses that type at its measured capacity (no estimate for types nobody measured):
    # 30,000 x 1.5 / 20,000 -> 3 instances at peak, 25,000 x 1.5 / 20,000 -> 2 on average
    assert realtime.deployment["instance_type"] == "ml.c6i.xlarge"
    assert not realtime.estimate
    assert realtime.details["capacity_qps"] == 20000
    assert (realtime.deployment["min_instances"], realtime.deployment["max_instances"]) == (2, 3)
    assert realtime.monthly_usd == 730 * 2 * Fraction("0.204")
    # AND serverless is out: 45,000 req/s with headroom is over the HTTP API's 10,000 req/s throttle
    assert "10,000" in option(result, "serverless").reason
    # AND at a rate it takes, Lambda is sized per vCPU of the measurement: 4 vCPUs / 20,000 req/s = 0.2 ms
    lighter = traffic_from({"peak_qps": 6000, "average_qps": 5000, "payload": "1.4 KB", "p99_ms": 50})
    assert option(plan(lighter, [measured], prices), "serverless").details["seconds_per_request"] == Fraction(1, 5000)


def test_a_missed_slo_rules_modes_out_with_the_measured_figure(prices: Prices, local_run: Measurement) -> None:
    traffic = traffic_from({"peak_qps": 100, "average_qps": 50, "payload": "1 KB", "p99_ms": 2})
    result = plan(traffic, [local_run], prices)
    assert "3.00 ms" in option(result, "realtime").reason
    assert "3.00 ms" in option(result, "serverless").reason
    assert result.recommended is None


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"peak_qps": 10, "average_qps": 20, "p99_ms": 100}, "average_qps"),
        ({"peak_qps": 10, "average_qps": 5, "p99_ms": 100, "payload": "lots"}, "payload"),
        ({"peak_qps": 10, "average_qps": 5, "p99_ms": 0}, "p99_ms"),
        ({"peak_qps": 10, "average_qps": 5, "p99_ms": 100, "hours_per_day": 25}, "hours_per_day"),
        ({"peak_qps": 10, "average_qps": 5, "p99_ms": 100, "rows_per_day": 5}, "rows_per_day"),
        ({"peak_qps": 10, "average_qps": 5, "p99_ms": 100, "qps": 5}, "traffic"),
    ],
)
def test_bad_profiles_name_the_field_and_what_is_allowed(values: dict[str, Any], field: str) -> None:
    from servestack.inference.errors import InvalidInput

    with pytest.raises(InvalidInput) as caught:
        traffic_from(values)
    assert caught.value.field == field
    assert caught.value.allowed


def test_the_cli_reads_a_profile_and_states_the_price_date(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN a profile file naming its measurement relative to itself
    loadtest_report(tmp_path / "local.json", ok_qps=8000.0, p99_ms=3.0, mean_ms=1.6, body=1370, rows=4)
    profile = tmp_path / "profile.yaml"
    profile.write_text(
        "model: digits@1\n"
        "traffic: {average_qps: 0.5, peak_qps: 20, hours_per_day: 10, payload: 1.4 KB, p99_ms: 300}\n"
        "measured: [local.json]\n"
    )
    # WHEN `servestack plan --profile` runs
    assert main(["plan", "--profile", str(profile)]) == 0
    out = capsys.readouterr().out
    # THEN it states the prices' date and recommends serverless with a fragment for digits@1
    assert f"read {Prices.load().read_on}" in out
    assert "recommended: serverless" in out
    assert "digits-serverless:" in out
    assert "version: '1'" in out
    # AND --json carries the same decision
    assert main(["plan", "--profile", str(profile), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["recommended"] == "serverless"


def test_the_cli_refuses_bad_input_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--peak-qps", "10", "--average-qps", "5", "--p99-ms", "100", "--measured", "nope.json"]) == 2
    assert "nope.json" in capsys.readouterr().err
    profile = ["--peak-qps", "10", "--average-qps", "5", "--p99-ms", "100"]
    assert main(["plan", *profile, "--measured", "ml.x9.huge=a.json"]) == 2
    assert "ml.x9.huge" in capsys.readouterr().err


def test_plan_says_how_a_lambda_deployment_of_the_model_ships(prices: Prices, local_run: Measurement) -> None:
    # GIVEN the spiky profile serverless suits, for a 2 MB model package and for a 300 MB one (a model with its
    # external weights)
    traffic = traffic_from(
        {"average_qps": "0.5", "burstiness": 40, "hours_per_day": 10, "payload": "1.4 KB", "p99_ms": 300}
    )
    small = plan(traffic, [local_run], prices, model="digits", package_bytes=2 * 2**20)
    large = plan(traffic, [local_run], prices, model="resnet", package_bytes=300 * 2**20)
    # THEN serverless says the first ships as a zip bundle, the second as a container image, and why
    assert any(note.startswith("ships as a zip bundle") for note in option(small, "serverless").notes)
    notes = option(large, "serverless").notes
    assert any("ships as a Lambda container image" in note and "250 MiB zip limit" in note for note in notes)
    # AND without a package to measure (no project), it says nothing of it
    none = plan(traffic, [local_run], prices, model="digits")
    assert not [n for n in option(none, "serverless").notes if n.startswith("ships as")]


def test_graviton_is_priced_beside_x86_and_recommended_where_its_measured_capacity_is_cheaper(
    prices: Prices, tmp_path: Path
) -> None:
    # GIVEN a steady 10,000 req/s (peak 12,000), a load test on a real ml.c6i.xlarge (Intel, 8,000 req/s) and
    # one on a real ml.c7g.xlarge (Graviton3, 12,000 req/s), both at p99 4 ms
    def measured(instance_type: str, ok_qps: float) -> Measurement:
        path = loadtest_report(
            tmp_path / f"{instance_type}.json", ok_qps=ok_qps, p99_ms=4.0, mean_ms=2.0, body=1370, rows=4
        )
        return load_measurement(path, instance_type, prices.instances[instance_type].vcpus)

    intel = measured("ml.c6i.xlarge", 8000.0)
    traffic = traffic_from({"peak_qps": 12000, "average_qps": 10000, "payload": "1.4 KB", "p99_ms": 50})

    # WHEN planned
    result = plan(traffic, [intel, measured("ml.c7g.xlarge", 12000.0)], prices)
    realtime = option(result, "realtime")

    # THEN realtime runs on the Graviton type: 10,000 x 1.5 / 12,000 -> 2 instances all day, 2 x 730 h x $0.174
    # = $254.04 a month, where the Intel type needs 15,000 / 8,000 -> 2 (3 at peak) x 730 h x $0.204 = $297.84
    assert realtime.deployment["instance_type"] == "ml.c7g.xlarge"
    assert (realtime.deployment["min_instances"], realtime.deployment["max_instances"]) == (2, 2)
    assert realtime.monthly_usd == 730 * 2 * price_of("sagemaker:ml.c7g.xlarge")
    # AND the x86_64 option is priced beside it, in the output too
    assert realtime.beside == ["x86_64: ml.c6i.xlarge x 2..3 $297.84/month (8,000 req/s per instance, measured)"]
    text = render(result)
    assert "ml.c7g.xlarge x 2..2" in text
    assert "beside: x86_64: ml.c6i.xlarge x 2..3 $297.84/month" in text
    assert "instance_type: ml.c7g.xlarge" in text  # the fragment

    # WHEN the Graviton type measured only 6,000 req/s: 15,000 / 6,000 -> 3 x 730 h x $0.174 = $381.06
    slower = option(plan(traffic, [intel, measured("ml.c7g.xlarge", 6000.0)], prices), "realtime")
    # THEN the Intel type is recommended, and the Graviton row beside it says what it would cost
    assert slower.deployment["instance_type"] == "ml.c6i.xlarge"
    assert slower.beside == [
        "arm64 (AWS Graviton): ml.c7g.xlarge x 3..3 $381.06/month (6,000 req/s per instance, measured)"
    ]


def test_without_a_graviton_load_test_the_plan_says_what_would_price_one(
    prices: Prices, local_run: Measurement
) -> None:
    # GIVEN only one local x86 core at 8,000 req/s, and 600 req/s of traffic
    traffic = traffic_from({"peak_qps": 600, "average_qps": 500, "payload": "1.4 KB", "p99_ms": 50})

    # WHEN planned
    result = plan(traffic, [local_run], prices)
    realtime = option(result, "realtime")

    # THEN realtime stays on an x86_64 type, estimated from the local core (a local core's rate is not a
    # Graviton vCPU's) ...
    assert realtime.deployment["instance_type"] == "ml.c6i.large"
    # ... and the output has a Graviton row saying which type to load-test, at its price
    (row,) = realtime.beside
    assert row.startswith("arm64 (AWS Graviton): not priced for this traffic")
    assert "--measured ml.c6g.large=FILE" in row
    assert "beside: arm64 (AWS Graviton): not priced" in render(result)
