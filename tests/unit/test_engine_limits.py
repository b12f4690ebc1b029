"""Limits per engine (issue 38, finding 5): one table (servestack/aws_rules.py), the spec refuses what the engine
refuses, each deployment defaults to its engine's limit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from servestack.aws_rules import (
    ENGINE_LIMITS,
    LAMBDA_SYNC,
    SAGEMAKER_ASYNC,
    SAGEMAKER_REALTIME,
    SAGEMAKER_SERVERLESS,
)
from servestack.spec import SpecError, parse_spec

MIB = 1024 * 1024


def spec_of(**deployment: Any) -> dict[str, Any]:
    return {"models": [{"name": "digits", "version": 1}], "deployments": {"d": {"model": "digits", **deployment}}}


def test_every_engine_names_its_aws_page_and_the_numbers_are_awss() -> None:
    # GIVEN the table of engines
    # WHEN it is read
    numbers = {limit.engine: (limit.max_payload_bytes, limit.timeout_sec) for limit in ENGINE_LIMITS}
    # THEN every value has a page of AWS's documentation, and the numbers are those the pages state
    assert all(limit.payload_source.startswith("https://docs.aws.amazon.com/") for limit in ENGINE_LIMITS)
    assert all(limit.timeout_source.startswith("https://docs.aws.amazon.com/") for limit in ENGINE_LIMITS)
    assert numbers[SAGEMAKER_REALTIME.engine] == (6 * MIB, 60)
    assert numbers[SAGEMAKER_SERVERLESS.engine] == (4 * MIB, 60)
    assert numbers[SAGEMAKER_ASYNC.engine] == (1024 * MIB, 3600)
    assert numbers[LAMBDA_SYNC.engine] == (6 * MIB, 900)


@pytest.mark.parametrize(
    ("deployment", "expected"),
    [
        ({"mode": "async", "backend": "sagemaker"}, 1024 * MIB),
        ({"mode": "realtime", "serverless": {}}, 4 * MIB),
        ({"mode": "realtime"}, 6 * MIB),
        ({"mode": "serverless"}, 6 * MIB),
        ({"mode": "async"}, 6 * MIB),
    ],
)
def test_a_deployment_takes_its_engines_payload_limit_by_default(deployment: dict[str, Any], expected: int) -> None:
    # GIVEN a deployment that sets no max_payload_bytes
    # WHEN serving.yaml is read
    spec = parse_spec(spec_of(**deployment))
    # THEN its limit is its engine's: a SageMaker async job of 1 GB is no longer a 413
    assert spec.deployments["d"].max_payload_bytes == expected


def test_a_large_async_payload_is_accepted_on_the_sagemaker_backend() -> None:
    # GIVEN a SageMaker async deployment asking for 200 MB bodies
    # WHEN serving.yaml is read
    spec = parse_spec(spec_of(mode="async", backend="sagemaker", max_payload_bytes=200 * MIB))
    # THEN it is accepted
    assert spec.deployments["d"].max_payload_bytes == 200 * MIB


@pytest.mark.parametrize(
    ("deployment", "value", "allowed"),
    [
        ({"mode": "realtime", "serverless": {}}, 6 * MIB, f"in 1..{4 * MIB}"),
        ({"mode": "realtime"}, 7 * MIB, f"in 1..{6 * MIB}"),
        ({"mode": "async"}, 7 * MIB, f"in 1..{6 * MIB}"),
        ({"mode": "async", "backend": "sagemaker"}, 1024 * MIB + 1, f"in 1..{1024 * MIB}"),
    ],
)
def test_a_payload_limit_past_the_engines_is_one_line_naming_field_value_and_range(
    deployment: dict[str, Any], value: int, allowed: str
) -> None:
    # GIVEN a deployment asking for more than its engine accepts
    # WHEN serving.yaml is read
    with pytest.raises(SpecError) as refused:
        parse_spec(spec_of(**deployment, max_payload_bytes=value))
    # THEN one problem names the field, the value, the range and the AWS page
    (problem,) = refused.value.problems
    assert problem.startswith(f"deployments.d.max_payload_bytes: {value} is not {allowed}")
    assert "https://docs.aws.amazon.com/" in problem


def test_docs_deploy_has_the_table_with_each_engines_aws_source() -> None:
    # GIVEN the deploy guide
    deploy = (Path(__file__).resolve().parents[2] / "docs" / "deploy.md").read_text(encoding="utf-8")
    # WHEN its limits table is read
    table = deploy.split("## Limits per engine", 1)[1].split("\n## ", 1)[0]
    # THEN every engine of the code's table is there with the pages its numbers come from
    for limit in ENGINE_LIMITS:
        assert limit.payload_source in table, limit.engine
        assert limit.timeout_source in table, limit.engine
