"""Local mode enforces each engine's limits from servestack/aws_rules.py's table (issue 38, finding 5)."""

from __future__ import annotations

import json

from servestack.aws_rules import SAGEMAKER_ASYNC, SAGEMAKER_REALTIME, SAGEMAKER_SERVERLESS
from servestack.local.hosting import Request
from servestack.local.sagemaker.definitions import EndpointDef, VariantDef
from servestack.local.sagemaker.planning import endpoint_payload_limit
from servestack.local.sagemaker.runtime_front import RealtimeTarget, SageMakerRuntime

MIB = 1024 * 1024


def endpoint(*, serverless: bool = False, asynchronous: bool = False) -> EndpointDef:
    variant = VariantDef("primary", "m", None, "Role", 1.0, None, 1, {"MemorySizeInMB": 2048} if serverless else None)
    async_config = {"OutputConfig": {"S3OutputPath": "s3://b/out/"}} if asynchronous else None
    return EndpointDef("E", "e", "arn:aws:sagemaker:::endpoint/e", (variant,), (), async_config, None)


def test_each_endpoint_lets_through_what_its_engine_takes() -> None:
    # GIVEN an instance-backed, a Serverless Inference and an asynchronous endpoint of a template
    # WHEN local up plans their routers
    limits = [endpoint_payload_limit(endpoint(**kind)) for kind in ({}, {"serverless": True}, {"asynchronous": True})]
    # THEN each router lets through what SageMaker lets through: 6 MB, 4 MB, 1 GB (a 200 MB async job reaches its
    # container; it was the router's 413 at the container default of 6 MiB)
    assert limits == [
        SAGEMAKER_REALTIME.max_payload_bytes,
        SAGEMAKER_SERVERLESS.max_payload_bytes,
        SAGEMAKER_ASYNC.max_payload_bytes,
    ]


def test_a_serverless_inference_endpoint_refuses_5_mb_with_sagemakers_413() -> None:
    # GIVEN the runtime front with a Serverless Inference endpoint (its router is never reached)
    runtime = SageMakerRuntime(
        {
            "sls": RealtimeTarget(
                "http://127.0.0.1:9", ("primary",), max_body_bytes=SAGEMAKER_SERVERLESS.max_payload_bytes
            )
        },
        {},
        s3=None,
    )
    # WHEN a 5 MB body is invoked
    request = Request("POST", "/endpoints/sls/invocations", {}, {"content-type": "application/json"}, b"1" * 5 * MIB)
    reply = runtime.invoke_endpoint("sls", request)
    # THEN it is refused as SageMaker refuses a body past the engine's limit
    assert reply.status == 413
    assert json.loads(reply.body) == {"message": f"HTTP content length exceeded {4 * MIB} bytes."}
