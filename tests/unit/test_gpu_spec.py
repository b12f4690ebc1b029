"""serving.yaml's `gpu:` block (issue 36, item 6): TensorRT and fp16 for a GPU realtime deployment, refused with
the path, the value and what is allowed where the deployment runs on CPU instances."""

from __future__ import annotations

from typing import Any

import pytest

from servestack.spec import GpuSettings, RealtimeDeployment, SpecError, parse_spec


def _spec(**deployment: Any) -> dict[str, Any]:
    return {
        "models": [{"name": "digits", "version": 1}],
        "deployments": {"d": {"model": "digits", "mode": "realtime", **deployment}},
    }


def _problems(data: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecError) as caught:
        parse_spec(data)
    return caught.value.problems


def test_tensorrt_with_fp16_on_a_gpu_type_sets_the_containers_environment() -> None:
    spec = parse_spec(_spec(instance_type="ml.g5.xlarge", gpu={"provider": "tensorrt", "fp16": True}))
    deployment = spec.deployments["d"]
    assert isinstance(deployment, RealtimeDeployment)
    assert deployment.gpu == GpuSettings(provider="tensorrt", fp16=True)
    assert deployment.gpu.environment == {"SERVESTACK_GPU_PROVIDER": "tensorrt", "SERVESTACK_GPU_FP16": "true"}


def test_without_a_gpu_block_the_default_is_none() -> None:
    deployment = parse_spec(_spec()).deployments["d"]
    assert isinstance(deployment, RealtimeDeployment)
    assert deployment.gpu is None


def test_a_gpu_block_on_a_cpu_instance_type_is_refused_naming_it() -> None:
    # GIVEN `gpu: {provider: tensorrt}` on a CPU instance type
    problems = _problems(_spec(instance_type="ml.c6i.xlarge", gpu={"provider": "tensorrt"}))
    # THEN the refusal names the field, the value and what is allowed
    assert len(problems) == 1
    assert "deployments.d" in problems[0]
    assert "'ml.c6i.xlarge'" in problems[0]
    assert "a GPU instance type (ml.g*, ml.p*) with gpu: set" in problems[0]


def test_a_cpu_variant_of_a_gpu_deployment_is_refused_too() -> None:
    variants = [
        {"name": "a", "model": "digits"},
        {"name": "b", "model": "digits", "instance_type": "ml.m5.large"},
    ]
    problems = _problems(_spec(instance_type="ml.g5.xlarge", gpu={"provider": "tensorrt"}, variants=variants))
    assert any("'ml.m5.large'" in problem and "GPU instance type" in problem for problem in problems)


def test_serverless_and_unknown_providers_and_cuda_fp16_are_refused() -> None:
    serverless = _problems(_spec(serverless={}, gpu={"provider": "tensorrt"}))
    assert any("serverless" in problem for problem in serverless)
    unknown = _problems(_spec(gpu={"provider": "openvino"}))
    assert any("'cuda'" in problem and "'tensorrt'" in problem for problem in unknown)
    fp16 = _problems(_spec(gpu={"fp16": True}))
    assert any("provider: tensorrt" in problem for problem in fp16)


def _problems_of(mode: str, **deployment: Any) -> list[str]:
    data = {
        "models": [{"name": "digits", "version": 1}],
        "deployments": {"d": {"model": "digits", "mode": mode, **deployment}},
    }
    return _problems(data)


def test_async_takes_a_gpu_block_only_on_sagemaker_gpu_instances_and_batch_never() -> None:
    tensorrt = {"provider": "tensorrt"}
    # GIVEN async on SageMaker, on a GPU type: accepted
    spec = _spec()
    spec["deployments"] = {"a": {"model": "digits", "mode": "async", "backend": "sagemaker", "gpu": tensorrt}}
    parsed = parse_spec(spec)
    assert [getattr(d, "gpu", None) for d in parsed.deployments.values()] == [GpuSettings(provider="tensorrt")]
    # WHEN async runs on Lambda THEN refused, naming what to choose
    (lambda_async,) = _problems_of("async", gpu=tensorrt)
    assert "deployments.d.gpu" in lambda_async
    assert "backend: sagemaker" in lambda_async
    # AND a batch deployment takes no gpu block on any runner: Lambda and Fargate have no GPU, and Batch
    # Transform's host AMIs carry no driver the CUDA 13 image runs on (servestack/gpu_families.py)
    for runner in ("lambda", "fargate", "transform"):
        (batch,) = _problems_of("batch", runner=runner, gpu=tensorrt)
        assert "deployments.d.gpu" in batch
        assert "Batch Transform runs on CPU types" in batch
        assert "mode: async (backend: sagemaker) or mode: realtime" in batch
