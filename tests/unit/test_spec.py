"""serving.yaml schema: defaults, the repo's file, and errors naming path, value and what is allowed."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from servestack.spec import (
    MODES,
    AsyncDeployment,
    BatchDeployment,
    RealtimeDeployment,
    ServerlessDeployment,
    SpecError,
    load_spec,
    parse_spec,
    uses_gpu,
)

REPO = Path(__file__).resolve().parents[2]


def minimal(**deployment: Any) -> dict[str, Any]:
    return {
        "models": [{"name": "digits", "version": 1}],
        "deployments": {"d": {"model": "digits", **deployment}},
    }


def problems_of(data: object) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    return info.value.problems


def test_repo_serving_yaml_uses_every_mode() -> None:
    spec = load_spec(REPO / "serving.yaml")

    assert sorted({d.mode for d in spec.deployments.values()}) == sorted(MODES)
    assert {(m.name, m.version) for m in spec.models} == {("digits", "1"), ("breast-cancer", "1")}


@pytest.mark.parametrize(
    ("mode", "cls"),
    [
        ("realtime", RealtimeDeployment),
        ("serverless", ServerlessDeployment),
        ("async", AsyncDeployment),
        ("batch", BatchDeployment),
    ],
)
def test_every_setting_has_a_default(mode: str, cls: type) -> None:
    spec = parse_spec(minimal(mode=mode))

    d = spec.deployments["d"]
    assert isinstance(d, cls)
    assert d.batching.max_batch_size == 512
    assert d.batching.max_delay_ms == 0
    assert d.batching.max_queue == 64
    assert spec.model("digits", None).artifact_path == "models/artifacts/digits/1"


def test_realtime_defaults_to_a_gpu_instance_and_a_canary() -> None:
    d = parse_spec(minimal(mode="realtime")).deployments["d"]

    assert isinstance(d, RealtimeDeployment)
    assert d.instance_type == "ml.g5.xlarge"
    assert d.strategy.type == "canary"
    assert d.strategy.steps == 1


def test_linear_steps_count_the_waits_before_full_traffic() -> None:
    d = parse_spec(minimal(mode="serverless", strategy={"type": "linear", "linear_step_percent": 25})).deployments["d"]

    assert isinstance(d, ServerlessDeployment)
    assert d.strategy.steps == 3


def test_out_of_range_setting_names_path_value_and_range() -> None:
    data = minimal(mode="serverless", strategy={"type": "canary", "canary_percent": 150})
    data["deployments"]["fraud-api"] = data["deployments"].pop("d")

    assert problems_of(data) == ["deployments.fraud-api.strategy.canary_percent: 150 is not in 1..99"]


def test_unknown_key_is_rejected_with_the_allowed_keys() -> None:
    (problem,) = problems_of(minimal(mode="batch", scheduel="rate(1 day)"))

    assert problem.startswith("deployments.d.scheduel: unknown key is not one of ")
    assert "schedule" in problem
    assert "timezone" in problem


def test_every_problem_is_reported_at_once() -> None:
    data = minimal(mode="realtime", min_instances=0, instance_type="g5.xlarge")
    data["deployments"]["x"] = {"mode": "queue", "model": "digits"}

    problems = problems_of(data)

    assert "deployments.d.min_instances: 0 is not in 1..100" in problems
    assert any(
        p.startswith("deployments.d.instance_type: 'g5.xlarge' is not a SageMaker instance type") for p in problems
    )
    assert "deployments.x.mode: 'queue' is not one of 'realtime', 'serverless', 'async', 'batch'" in problems


@pytest.mark.parametrize(
    ("deployment", "expected"),
    [
        (
            {"mode": "serverless", "architecture": "sparc"},
            "deployments.d.architecture: 'sparc' is not one of 'x86_64' or 'arm64'",
        ),
        ({"mode": "serverless", "timeout_sec": 60}, "deployments.d.timeout_sec: 60 is not in 1..29"),
        (
            {"mode": "batch", "timezone": "Mars/Olympus"},
            "deployments.d.timezone: 'Mars/Olympus' is not an IANA time zone",
        ),
        ({"mode": "batch", "schedule": "daily"}, "deployments.d.schedule: 'daily' is not 'cron(<6 fields>)'"),
        (
            {"mode": "batch", "input_prefix": "/in"},
            "deployments.d.input_prefix: '/in' is not an S3 key prefix",
        ),
        ({"mode": "async", "max_receive_count": 0}, "deployments.d.max_receive_count: 0 is not in 1..1000"),
        (
            {"mode": "async", "batch_size": 50, "batch_window_sec": 0},
            "deployments.d.batch_window_sec: 0 is not in 1..300",
        ),
        (
            {"mode": "realtime", "batching": {"max_batch_size": 5000}},
            "deployments.d.batching.max_batch_size: 5000 is not in 1..4096",
        ),
        (
            {"mode": "realtime", "min_instances": 3, "max_instances": 2},
            "deployments.d.min_instances: 3 is not <= max_instances (2)",
        ),
        (
            {"mode": "serverless", "log_retention_days": 2},
            "deployments.d.log_retention_days: 2 is not one of 1, 3, 5, 7",
        ),
        (
            {"mode": "serverless", "strategy": {"type": "blue"}},
            "deployments.d.strategy.type: 'blue' is not one of 'all_at_once'",
        ),
        (
            {"mode": "serverless", "provisioned_concurrency_min": 0, "provisioned_concurrency_max": 3},
            "deployments.d.provisioned_concurrency_min: 0 is not in 1..10000 when autoscaling",
        ),
        (
            {"mode": "realtime", "alarms": {"error_rate_percent": 0}},
            "deployments.d.alarms.error_rate_percent: 0 is not in 0.01..100",
        ),
        ({"mode": "batch", "fargate_cpu": 300}, "deployments.d.fargate_cpu: 300 is not one of 256, 512"),
        (
            {"mode": "batch", "output_format": "parquet"},
            "deployments.d.output_format: 'parquet' is not writable with runner: lambda (Parquet needs pyarrow, "
            "which the Lambda bundle leaves out to stay under 150 MB); use runner: fargate",
        ),
        (
            {"mode": "batch", "input_format": "parquet"},
            "deployments.d.input_format: 'parquet' is not readable with runner: lambda (Parquet needs pyarrow",
        ),
        (
            {"mode": "batch", "engine": "transform", "input_format": "parquet"},
            "deployments.d.input_format: 'parquet' is not readable with runner: transform (Batch Transform splits",
        ),
        (
            {"mode": "batch", "engine": "transform", "runner": "lambda"},
            "deployments.d.engine: 'transform' is not allowed together with runner:",
        ),
        (
            {"mode": "batch", "engine": "transform", "instance_type": "ml.x.large"},
            "deployments.d.instance_type: 'ml.x.large' is not a SageMaker instance type for batch transform",
        ),
        (
            {"mode": "batch", "engine": "transform", "max_payload_mb": 101},
            "deployments.d.max_payload_mb: 101 is not in",
        ),
        (
            {"mode": "realtime", "multi_model": True},  # the default instance type, ml.g5.xlarge
            "deployments.d.instance_type: 'ml.g5.xlarge' is not a CPU instance type (ml.c*, ml.m*, ml.r*...) "
            "with multi_model: true: SageMaker runs custom multi-model containers on CPU instances only",
        ),
        (
            {"mode": "realtime", "multi_model": True, "instance_type": "ml.c6i.large", "serverless": {}},
            "deployments.d.multi_model: true is not combinable with serverless",
        ),
        (
            {"mode": "realtime", "instance_type": "ml.inf2.xlarge"},
            "deployments.d.instance_type: 'ml.inf2.xlarge' is not supported: Inferentia and Trainium instances",
        ),
        (
            {"mode": "async", "backend": "sagemaker", "instance_type": "ml.trn1.2xlarge"},
            "deployments.d.instance_type: 'ml.trn1.2xlarge' is not supported",
        ),
        (  # Kepler: CUDA 12 dropped it; AWS lists ml.p2 under NVIDIA driver 470 only
            {"mode": "realtime", "instance_type": "ml.p2.xlarge"},
            "deployments.d.instance_type: 'ml.p2.xlarge' is not supported: its NVIDIA K80 (Kepler, compute "
            "capability 3.7) is below 7.5 (Turing), the oldest GPU that CUDA 13, the GPU image's CUDA, supports",
        ),
        (  # Volta: CUDA 13.0 dropped it (and Maxwell and Pascal)
            {"mode": "realtime", "variants": [{"name": "a", "model": "digits", "instance_type": "ml.p3.2xlarge"}]},
            "deployments.d.variants.0.instance_type: 'ml.p3.2xlarge' is not supported: its NVIDIA V100 (Volta, "
            "compute capability 7.0) is below 7.5 (Turing)",
        ),
        (  # Batch Transform too, where no GPU type is left to suggest (next case)
            {"mode": "batch", "engine": "transform", "instance_type": "ml.p2.8xlarge"},
            "deployments.d.instance_type: 'ml.p2.8xlarge' is not supported: its NVIDIA K80",
        ),
        (  # a GPU the image runs on, but no TransformAmiVersion carries the driver >= 580 CUDA 13 needs
            {"mode": "batch", "engine": "transform", "instance_type": "ml.g4dn.xlarge"},
            "deployments.d.instance_type: 'ml.g4dn.xlarge' is not supported for Batch Transform: Batch Transform's "
            "GPU host AMIs carry NVIDIA drivers older than 580",
        ),
        (  # Grace: arm64 CPUs, an image built for amd64
            {"mode": "async", "backend": "sagemaker", "instance_type": "ml.p6e-gb200.36xlarge"},
            "deployments.d.instance_type: 'ml.p6e-gb200.36xlarge' is not supported: its CPUs are NVIDIA Grace "
            "(arm64), and servestack builds the GPU image for linux/amd64 only",
        ),
    ],
)
def test_bad_values_say_what_is_allowed(deployment: dict[str, Any], expected: str) -> None:
    (problem,) = problems_of(minimal(**deployment))

    assert problem.startswith(expected)


def test_a_gpu_transform_is_refused_in_one_line_that_says_why_and_what_to_use_instead() -> None:
    # GIVEN Batch Transform on a GPU type that endpoints run the GPU image on (ml.g5: A10G, compute capability 8.6)
    (problem,) = problems_of(minimal(mode="batch", engine="transform", instance_type="ml.g5.2xlarge"))

    # THEN one line: the drivers Transform's host AMIs carry, what CUDA 13 needs, and what to choose instead
    assert "\n" not in problem
    assert "al2-ami-sagemaker-batch-gpu-535: driver 535" in problem
    assert "the GPU image's CUDA 13.0 needs 580 or newer, so its CUDA provider could not load" in problem
    assert problem.endswith(
        "choose a CPU type (ml.c*, ml.m*, ml.r*...) for Batch Transform, or serve the model on a GPU with mode: "
        "async (backend: sagemaker) or mode: realtime"
    )
    # AND the same GPU type stays an endpoint's: realtime and SageMaker-async deployments take it
    parse_spec(minimal(mode="realtime", instance_type="ml.g5.2xlarge"))
    parse_spec(minimal(mode="async", backend="sagemaker", instance_type="ml.g5.2xlarge"))


def test_deployment_names_must_be_dns_names() -> None:
    data = minimal(mode="serverless")
    data["deployments"]["Fraud_API"] = data["deployments"].pop("d")

    (problem,) = problems_of(data)

    assert problem.startswith("deployments.Fraud_API: 'Fraud_API' is not a DNS-style name")


def test_references_to_undeclared_models_and_versions_fail() -> None:
    data = minimal(mode="realtime", variants=[{"name": "a", "model": "digits"}, {"name": "b", "model": "cats"}])
    data["deployments"]["e"] = {"mode": "batch", "model": "digits", "version": "7"}

    problems = problems_of(data)

    assert "deployments.d.variants.1.model: 'cats' is not a declared model (digits)" in problems
    assert "deployments.e.version: '7' is not a declared version of 'digits' (1)" in problems


def test_ambiguous_model_version_must_be_named() -> None:
    data = minimal(mode="serverless")
    data["models"].append({"name": "digits", "version": 2})

    assert problems_of(data) == [
        "deployments.d.version: missing is not allowed when 'digits' has several versions (1, 2)"
    ]


def test_models_of_lists_variant_and_shadow_models_once() -> None:
    data = minimal(
        mode="realtime",
        variants=[{"name": "a", "model": "digits", "weight": 3}],
        shadow={"model": "cancer", "sample_percent": 20},
    )
    data["models"].append({"name": "cancer", "version": "2", "path": "elsewhere/cancer"})

    spec = parse_spec(data)

    assert [(m.name, m.artifact_path) for m in spec.models_of("d")] == [
        ("digits", "models/artifacts/digits/1"),
        ("cancer", "elsewhere/cancer"),
    ]


def test_load_spec_reports_yaml_and_file_errors(tmp_path: Path) -> None:
    bad = tmp_path / "serving.yaml"
    bad.write_text("models: [\n", encoding="utf-8")

    with pytest.raises(SpecError, match="is not valid YAML"):
        load_spec(bad)
    with pytest.raises(SpecError, match="is not readable"):
        load_spec(tmp_path / "missing.yaml")


def test_repo_file_with_a_bad_value_fails_before_synth(tmp_path: Path) -> None:
    data = yaml.safe_load((REPO / "serving.yaml").read_text(encoding="utf-8"))
    broken = copy.deepcopy(data)
    broken["deployments"]["digits-realtime"]["max_instances"] = 500
    path = tmp_path / "serving.yaml"
    path.write_text(yaml.safe_dump(broken), encoding="utf-8")

    with pytest.raises(SpecError) as info:
        load_spec(path)

    assert info.value.problems == ["deployments.digits-realtime.max_instances: 500 is not in 1..100"]
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("instance_type", "gpu"),
    [
        ("ml.g4dn.xlarge", True),
        ("ml.g5.xlarge", True),
        ("ml.g6e.2xlarge", True),
        ("ml.p3.2xlarge", True),
        ("ml.p4d.24xlarge", True),
        ("ml.p5.48xlarge", True),
        ("ml.m5.large", False),
        ("ml.c6i.xlarge", False),
        ("ml.c7g.xlarge", False),  # Graviton: the trailing g is not a GPU
        ("ml.r7g.large", False),
        ("ml.t2.medium", False),
    ],
)
def test_the_image_follows_the_instance_family(instance_type: str, gpu: bool) -> None:
    assert uses_gpu(instance_type) is gpu


def test_multi_model_on_a_cpu_instance_is_accepted() -> None:
    d = parse_spec(minimal(mode="realtime", multi_model=True, instance_type="ml.m5.large")).deployments["d"]

    assert isinstance(d, RealtimeDeployment)
    assert d.multi_model


TWO_MODELS = {
    "models": [{"name": "digits", "version": 1}, {"name": "breast-cancer", "version": 1}],
    "deployments": {
        "d": {
            "mode": "realtime",
            "instance_type": "ml.c6i.xlarge",
            "components": [{"model": "digits"}, {"name": "cancer", "model": "breast-cancer", "min_copies": 0}],
        }
    },
}


def with_components(*components: dict[str, Any], **deployment: Any) -> dict[str, Any]:
    data: dict[str, Any] = copy.deepcopy(TWO_MODELS)
    d = data["deployments"]["d"]
    if components:
        d["components"] = list(components)
    d.update(deployment)
    return data


def test_components_place_several_models_on_one_endpoint() -> None:
    spec = parse_spec(copy.deepcopy(TWO_MODELS))

    d = spec.deployments["d"]
    assert isinstance(d, RealtimeDeployment)
    assert [c.component_name for c in d.components] == ["digits", "cancer"]
    assert d.model == "digits"  # the first component's model stands for the deployment
    assert [m.key for m in spec.models_of("d")] == ["digits@1", "breast-cancer@1"]
    cancer = d.components[1]
    assert (cancer.copies, cancer.min_copies, cancer.max_copies, cancer.cpu_cores, cancer.memory_mib) == (
        1, 0, 2, 1.0, 1024
    )  # fmt: skip


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            with_components({"model": "digits", "copies": 0}),
            "deployments.d.components.0.copies: 0 is not in 1..1000: SageMaker creates a component with at least "
            "one copy",
        ),
        (
            with_components({"model": "digits", "min_copies": 3, "max_copies": 2}),
            "deployments.d.components.0.min_copies: 3 is not <= max_copies (2)",
        ),
        (
            with_components({"model": "digits", "copies": 5, "max_copies": 4}),
            "deployments.d.components.0.copies: 5 is not in min_copies..max_copies (1..4)",
        ),
        (
            with_components({"model": "digits", "cpu_cores": 0.1}),
            "deployments.d.components.0.cpu_cores: 0.1 is not in 0.25..192",
        ),
        (
            with_components({"model": "digits", "memory_mib": 64}),
            "deployments.d.components.0.memory_mib: 64 is not in 128..2097152",
        ),
        (
            with_components({"model": "digits", "accelerators": 1}),
            "deployments.d.components.0.accelerators: 1 is not available on ml.c6i.xlarge, which has no GPU",
        ),
        (
            with_components({"model": "digits", "cpu_cores": 8}),
            "deployments.d.components.0.cpu_cores: 8 is not <= the 4 vCPUs of one ml.c6i.xlarge",
        ),
        (
            with_components({"model": "digits", "accelerators": 2}, instance_type="ml.g5.xlarge"),
            "deployments.d.components.0.accelerators: 2 is not <= the 1 GPU(s) of one ml.g5.xlarge",
        ),
        (
            with_components(serverless={}),
            "deployments.d.components: inference components is not combinable with serverless: SageMaker places "
            "inference components on instance-based variants only",
        ),
        (
            with_components(multi_model=True),
            "deployments.d.components: inference components is not combinable with multi_model: true",
        ),
        (
            with_components(variants=[{"name": "a", "model": "digits"}]),
            "deployments.d.components: inference components is not combinable with variants or shadow",
        ),
        (
            with_components({"model": "digits"}, {"model": "digits"}),
            "deployments.d.components: 'digits' is not a unique component name",
        ),
        (
            with_components({"model": "digits"}, model="breast-cancer"),
            "deployments.d.model: 'breast-cancer' is not one of the components' models (digits)",
        ),
        (
            with_components({"model": "digits", "gpus": 1}),
            "deployments.d.components.0.gpus: unknown key is not one of name, model, version, cpu_cores",
        ),
    ],
)
def test_component_settings_sagemaker_refuses_are_refused(data: dict[str, Any], expected: str) -> None:
    (problem,) = problems_of(data)

    assert problem.startswith(expected)


def test_a_components_model_must_be_declared() -> None:
    problems = problems_of(with_components({"model": "digits"}, {"model": "cats"}))

    assert "deployments.d.components.1.model: 'cats' is not a declared model (breast-cancer, digits)" in problems


def test_a_transform_batch_deployment_takes_engine_and_instances_and_fargate_takes_parquet() -> None:
    # GIVEN a batch deployment on Batch Transform (named with `engine:`), and one on Fargate with Parquet
    data = minimal(mode="batch", engine="transform", instance_type="ml.c5.xlarge", instance_count=3)
    data["deployments"]["p"] = {"model": "digits", "mode": "batch", "runner": "fargate", "output_format": "parquet"}
    # WHEN it is parsed
    spec = parse_spec(data)
    # THEN engine is the runner, with the transform settings and their defaults
    transform, fargate = spec.deployments["d"], spec.deployments["p"]
    assert isinstance(transform, BatchDeployment)
    assert isinstance(fargate, BatchDeployment)
    assert (transform.runner, transform.instance_type, transform.instance_count) == ("transform", "ml.c5.xlarge", 3)
    assert (transform.max_payload_mb, transform.output_format) == (6, "jsonl")
    assert (fargate.runner, fargate.output_format) == ("fargate", "parquet")


# --- settings AWS refuses or mishandles: each refusal quotes the AWS rule and links the page stating it ---------


@pytest.mark.parametrize(
    ("deployment", "expected", "rule", "page"),
    [
        (
            {"mode": "batch", "engine": "transform", "max_payload_mb": 30, "max_concurrent_transforms": 4},
            "deployments.d.max_concurrent_transforms: 4 x max_payload_mb 30 = 120 MB is not <= 100 MB",
            "(MaxConcurrentTransforms * MaxPayloadInMB) also cannot exceed 100 MB",
            "https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_CreateTransformJob.html",
        ),
        (
            {"mode": "batch", "engine": "transform", "max_payload_mb": 101, "max_concurrent_transforms": 1},
            "deployments.d.max_payload_mb: 101 is not in 1..100",
            "CreateTransformJob refuses a MaxPayloadInMB greater than 100 MB",
            "https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_CreateTransformJob.html",
        ),
        (
            {"mode": "batch", "runner": "fargate", "fargate_cpu": 256, "fargate_memory_mib": 4096},
            "deployments.d.fargate_memory_mib: 4096 is not a memory size Fargate allows with fargate_cpu: 256 "
            "(512, 1024, 2048 MiB)",
            "a Fargate task's memory must be one of the values its CPU allows",
            "https://docs.aws.amazon.com/AmazonECS/latest/developerguide/task-cpu-memory-error.html",
        ),
        (
            {"mode": "batch", "runner": "fargate", "fargate_cpu": 8192, "fargate_memory_mib": 18432},
            "deployments.d.fargate_memory_mib: 18432 is not a memory size Fargate allows with fargate_cpu: 8192 "
            "(16384..61440 in steps of 4096 MiB)",
            "8192: 16-60 GiB in 4 GiB steps",
            "https://docs.aws.amazon.com/AmazonECS/latest/developerguide/task-cpu-memory-error.html",
        ),
        (
            {
                "mode": "realtime",
                "serverless": {},
                "variants": [{"name": "a", "model": "digits"}, {"name": "b", "model": "digits"}],
            },
            "deployments.d.variants: 2 variants is not allowed with serverless (one variant at most)",
            "Serverless Inference does not support GPUs, multi-model endpoints, VPC configuration, network isolation, "
            "data capture, multiple production variants",
            "https://docs.aws.amazon.com/sagemaker/latest/dg/serverless-endpoints.html",
        ),
        (
            {"mode": "realtime", "serverless": {}, "instance_type": "ml.g5.xlarge"},
            "deployments.d.instance_type: 'ml.g5.xlarge' is not usable with serverless (CPU only)",
            "Serverless Inference does not support GPUs",
            "https://docs.aws.amazon.com/sagemaker/latest/dg/serverless-endpoints.html",
        ),
        (
            {
                "mode": "realtime",
                "serverless": {},
                "variants": [{"name": "a", "model": "digits", "instance_type": "ml.p4d.24xlarge"}],
            },
            "deployments.d.variants.0.instance_type: 'ml.p4d.24xlarge' is not usable with serverless (CPU only)",
            "Serverless Inference does not support GPUs",
            "https://docs.aws.amazon.com/sagemaker/latest/dg/serverless-endpoints.html",
        ),
        (
            {"mode": "realtime", "serverless": {}, "shadow": {"model": "digits"}},
            "deployments.d.shadow: a shadow variant is not supported with serverless",
            "multiple production variants",
            "https://docs.aws.amazon.com/sagemaker/latest/dg/serverless-endpoints.html",
        ),
        (
            {"mode": "realtime", "serverless": {}, "multi_model": True, "instance_type": "ml.c6i.large"},
            "deployments.d.multi_model: true is not combinable with serverless",
            "Serverless Inference does not support GPUs, multi-model endpoints",
            "https://docs.aws.amazon.com/sagemaker/latest/dg/serverless-endpoints.html",
        ),
        *[
            (
                {"mode": mode, "alarms": {"period_sec": period}},
                f"deployments.d.alarms.period_sec: {period} is not 60 or more (a multiple of 60)",
                "specify a period of 10, 20 or 30 s only for metrics stored with a StorageResolution of 1",
                "https://docs.aws.amazon.com/AmazonCloudWatch/latest/APIReference/API_PutMetricAlarm.html",
            )
            for mode, period in (("realtime", 10), ("serverless", 20), ("async", 30))
        ],
    ],
)
def test_settings_aws_refuses_are_refused_with_its_rule_and_page(
    deployment: dict[str, Any], expected: str, rule: str, page: str
) -> None:
    # GIVEN a deployment with a setting AWS refuses (or mishandles) WHEN it is parsed
    (problem,) = problems_of(minimal(**deployment))
    # THEN the one problem names the path and value, quotes AWS's rule and links the page that states it
    assert problem.startswith(expected)
    assert rule in problem
    assert problem.endswith(f"({page})")


def test_the_edges_of_the_aws_rules_are_accepted() -> None:
    # GIVEN settings right at the limits: 4 x 25 MB = 100 MB, 100 MB alone, every Fargate size at its ends,
    # one serverless variant on a CPU type, and a 60 s alarm period
    accepted = [
        {"mode": "batch", "engine": "transform", "max_payload_mb": 25, "max_concurrent_transforms": 4},
        {"mode": "batch", "engine": "transform", "max_payload_mb": 100, "max_concurrent_transforms": 1},
        {"mode": "batch", "runner": "fargate", "fargate_cpu": 256, "fargate_memory_mib": 512},
        {"mode": "batch", "runner": "fargate", "fargate_cpu": 4096, "fargate_memory_mib": 30720},
        {"mode": "batch", "runner": "fargate", "fargate_cpu": 16384, "fargate_memory_mib": 122880},
        {"mode": "batch", "runner": "lambda", "architecture": "arm64"},
        # arm64 Fargate: the task's image is built for linux/arm64 (servestack/cdk/deployment.py)
        {"mode": "batch", "runner": "fargate", "architecture": "arm64"},
        {
            "mode": "realtime",
            "serverless": {},
            "variants": [{"name": "a", "model": "digits", "instance_type": "ml.m5.large"}],
        },
        {"mode": "realtime", "alarms": {"period_sec": 60}},
    ]
    # WHEN each is parsed THEN none is refused
    for deployment in accepted:
        assert parse_spec(minimal(**deployment)).deployments["d"].mode == deployment["mode"]


def test_a_transform_limit_applies_to_transform_jobs_only() -> None:
    # GIVEN transform settings over the product limit on a Lambda batch, which starts no transform job
    spec = parse_spec(minimal(mode="batch", max_payload_mb=50, max_concurrent_transforms=4))
    # THEN they are accepted (unused), while the same on a transform job is refused
    assert isinstance(spec.deployments["d"], BatchDeployment)
    (problem,) = problems_of(minimal(mode="batch", engine="transform", max_payload_mb=50, max_concurrent_transforms=4))
    assert "also cannot exceed 100 MB" in problem


def test_every_serving_yaml_example_in_the_docs_is_still_accepted() -> None:
    # GIVEN every YAML block of README.md and docs/ that declares deployments (with the repo's models when the
    # block leaves them out)
    models = yaml.safe_load((REPO / "serving.yaml").read_text(encoding="utf-8"))["models"]
    examples = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for block in re.findall(r"```ya?ml\n(.*?)```", doc.read_text(encoding="utf-8"), re.S):
            data = yaml.safe_load(block)
            if isinstance(data, dict) and "deployments" in data:
                examples.append((doc.name, {"models": models, **data}))
    assert len(examples) >= 3
    # WHEN each is validated THEN none breaks a rule the spec holds
    for name, data in examples:
        assert parse_spec(data, name).deployments


def test_a_batch_deployment_takes_an_id_column_and_a_record_limit_except_on_transform() -> None:
    # GIVEN a Fargate batch deployment with an id column and a record limit
    spec = parse_spec(minimal(mode="batch", runner="fargate", id_column="customer id", max_record_bytes=4096))
    batch = spec.deployments["d"]
    assert isinstance(batch, BatchDeployment)
    assert (batch.id_column, batch.max_record_bytes) == ("customer id", 4096)
    # AND the defaults: no id column (rows are known by file and line), records of at most 1 MiB
    default = parse_spec(minimal(mode="batch")).deployments["d"]
    assert isinstance(default, BatchDeployment)
    assert (default.id_column, default.max_record_bytes) == (None, 1024 * 1024)
    # WHEN the id column is set on Batch Transform, or takes an output field's name / THEN refused, saying why
    (transform,) = problems_of(minimal(mode="batch", runner="transform", id_column="id"))
    assert "id_column" in transform
    assert "runner: transform" in transform
    (reserved,) = problems_of(minimal(mode="batch", id_column="prediction"))
    assert "output's own fields" in reserved
    (small,) = problems_of(minimal(mode="batch", max_record_bytes=10))
    assert "max_record_bytes" in small
