"""One synth per test session: the repo's serving.yaml plus a few extra deployments that exercise the
options the repo file does not use (A/B variants, shadow, multi-model, serverless variant, inference
components on CPU and GPU, SageMaker async backend, Fargate batch). Bundling is skipped
(`aws:cdk:bundling-stacks: []`); only test_bundling bundles.

The synth runs in a throwaway project root holding the repo's serving.yaml and stub model artifacts, so these
tests check the templates whatever state `models/` is in.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # `pytest` (not `python -m pytest`) does not put the repo root on sys.path
    sys.path.insert(0, str(REPO))
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

MONITOR_BASELINE = "monitoring/train.csv"
# Deployments added to the repo's serving.yaml for coverage of every construct option.
EXTRA_DEPLOYMENTS: dict[str, dict[str, Any]] = {
    "digits-ab": {
        "mode": "realtime",
        "model": "digits",
        "variants": [
            {"name": "current", "model": "digits", "weight": 9},
            {"name": "candidate", "model": "breast-cancer", "weight": 1, "instance_type": "ml.g4dn.xlarge"},
        ],
        "strategy": {"type": "linear", "linear_step_percent": 25, "interval_minutes": 3, "bake_minutes": 5},
    },
    "digits-shadow": {
        "mode": "realtime",
        "model": "digits",
        "shadow": {"model": "breast-cancer", "sample_percent": 20},
        "strategy": {"type": "all_at_once", "bake_minutes": 0},
        "gpu": {"provider": "tensorrt", "fp16": True},
    },
    "digits-mme": {
        "mode": "realtime",
        "model": "digits",
        "multi_model": True,
        "instance_type": "ml.c6i.xlarge",
    },
    "digits-mixed": {
        "mode": "realtime",
        "model": "digits",
        "instance_type": "ml.m5.large",
        "variants": [
            {"name": "cpu", "model": "digits", "weight": 1},
            {"name": "gpu", "model": "breast-cancer", "weight": 1, "instance_type": "ml.g6.xlarge"},
        ],
    },
    "cancer-cpu-async": {
        "mode": "async",
        "model": "breast-cancer",
        "backend": "sagemaker",
        "instance_type": "ml.m5.xlarge",
        "result_ttl_days": 3,
    },
    "digits-sls": {
        "mode": "realtime",
        "model": "digits",
        "serverless": {"memory_mib": 3072, "max_concurrency": 5},
    },
    "cancer-gpu-async": {
        "mode": "async",
        "model": "breast-cancer",
        "backend": "sagemaker",
        "max_instances": 3,
        "gpu": {"provider": "tensorrt"},
    },
    "two-models": {
        "mode": "realtime",
        "instance_type": "ml.c6i.xlarge",
        "min_instances": 1,
        "max_instances": 3,
        "strategy": {"type": "linear", "linear_step_percent": 25, "interval_minutes": 2, "bake_minutes": 5},
        "components": [
            {"model": "digits", "cpu_cores": 1, "memory_mib": 1024, "copies": 2, "min_copies": 1, "max_copies": 4},
            {
                "name": "cancer",
                "model": "breast-cancer",
                "cpu_cores": 0.5,
                "memory_mib": 512,
                "min_copies": 0,
                "max_copies": 2,
                "target_invocations_per_copy": 200,
            },
        ],
    },
    "gpu-components": {
        "mode": "realtime",
        "instance_type": "ml.g5.xlarge",
        "components": [{"model": "digits", "accelerators": 1, "cpu_cores": 2, "memory_mib": 2048}],
    },
    "digits-weekly": {
        "mode": "batch",
        "model": "digits",
        "runner": "fargate",
        "schedule": "rate(7 days)",
        "fargate_cpu": 2048,
    },
    # Data capture (servestack/cdk/capture.py): SageMaker's own; through log lines where columns are left out;
    # and the log lines of a Lambda function and an async worker.
    "digits-captured": {
        "mode": "realtime",
        "model": "digits",
        "instance_type": "ml.m5.large",
        "capture": {"sample_percent": 12.5, "what": "both"},
        # Scheduled drift monitoring (servestack/cdk/monitoring.py), with a baseline file of the project.
        "monitor": {"schedule": "rate(6 hours)", "window_hours": 6, "max_psi": 0.3, "baseline": MONITOR_BASELINE},
    },
    "digits-captured-private": {
        "mode": "realtime",
        "model": "digits",
        "instance_type": "ml.m5.large",
        "capture": {"exclude_columns": ["pixel"], "prefix": "private-capture/"},
    },
    "digits-api-captured": {
        "mode": "serverless",
        "model": "digits",
        "capture": {"sample_percent": 10, "what": "inputs"},
    },
    "cancer-async-captured": {"mode": "async", "model": "breast-cancer", "capture": {}},
    # A batch deployment's scheduled drift check reads its runs (servestack/monitor/batch_runs.py)
    "cancer-watched": {
        "mode": "batch",
        "model": "breast-cancer",
        "input_prefix": "scoring/in/",
        "output_prefix": "scoring/out/",
        "capture": {},
        "monitor": {"window_hours": 26, "baseline": MONITOR_BASELINE},
    },
    "cancer-transform": {
        "mode": "batch",
        "model": "breast-cancer",
        "engine": "transform",
        "schedule": "cron(0 4 * * ? *)",
        # A CPU type: Batch Transform's host AMIs have no driver the CUDA 13 GPU image runs on (gpu_families.py)
        "instance_type": "ml.c5.xlarge",
        "instance_count": 3,
        "max_payload_mb": 4,
        "input_format": "csv",
    },
}
# The pipeline stack joins the session synth, deploying two deployments per stage to keep it small.
PIPELINE_CONTEXT = {
    "servestack:pipeline": "true",
    "servestack:pipeline-deployments": "digits-api,cancer-nightly",
    "servestack:repo": "acme/serving",
    "servestack:connection-arn": "arn:aws:codeconnections:us-east-1:111111111111:connection/0f2b5e1c-5c3a-4b7e-9a8d",
    "servestack:account": "111111111111",
    "servestack:region": "us-east-1",
}
SAMPLE_REQUEST = {"instances": [[0.0, 1.0, 2.0, 3.0]]}
SAMPLE_RESPONSE = {"predictions": [3]}


@dataclass
class Synth:
    """The session's cloud assembly: templates by stack name, the nag/validation outcome, the app."""

    outdir: Path
    templates: dict[str, dict[str, Any]]
    pipeline: dict[str, Any]
    validation_error: str | None
    app: Any
    deployments: dict[str, str]  # deployment name -> mode

    def template(self, deployment: str) -> Any:
        from aws_cdk.assertions import Template

        return Template.from_json(self.templates[f"servestack-{deployment}"])

    def resources(self, deployment: str, type_: str) -> dict[str, dict[str, Any]]:
        res = self.templates[f"servestack-{deployment}"]["Resources"]
        return {k: v for k, v in res.items() if v["Type"] == type_}


def make_project(root: Path) -> Path:
    """A minimal project root: serving.yaml (repo's + extras) and stub model artifacts (the images' Dockerfiles
    and the entry points are servestack's own)."""
    spec = yaml.safe_load((REPO / "serving.yaml").read_text(encoding="utf-8"))
    spec["deployments"].update(EXTRA_DEPLOYMENTS)
    (root / "serving.yaml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    for model in spec["models"]:
        d = root / "models" / "artifacts" / model["name"] / str(model["version"])
        d.mkdir(parents=True)
        (d / "model.onnx").write_bytes(b"stub onnx for " + model["name"].encode())
        (d / "manifest.json").write_text(json.dumps({"name": model["name"]}), encoding="utf-8")
        (d / "sample-request.json").write_text(json.dumps(SAMPLE_REQUEST), encoding="utf-8")
        (d / "sample-response.json").write_text(json.dumps(SAMPLE_RESPONSE), encoding="utf-8")
    (root / MONITOR_BASELINE).parent.mkdir(parents=True)
    (root / MONITOR_BASELINE).write_text("pixel\n0.5\n", encoding="utf-8")
    return root


@pytest.fixture(scope="session")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    from servestack.cdk import app as cdk_app

    root = make_project(tmp_path_factory.mktemp("project"))
    outdir = tmp_path_factory.mktemp("cdk.out")
    context = json.loads((REPO / "cdk.json").read_text(encoding="utf-8"))["context"]
    context.update(PIPELINE_CONTEXT)
    context["aws:cdk:bundling-stacks"] = []
    # Without aws-cdk-lib's own validation, which can only warn here (over half of this synth's CPU): the
    # templates are checked by cdk-nag (below) and cfn-lint (test_checks.py).
    app = cdk_app.build_app(root=root, context=context, outdir=str(outdir), builtin_validation=False)
    error = None
    try:
        app.synth()
    except Exception as exc:  # nag findings surface as a ValidationFailed error after templates are written
        error = str(exc)
    templates = {
        p.name.removesuffix(".template.json"): json.loads(p.read_text(encoding="utf-8"))
        for p in outdir.glob("*.template.json")
        if p.name != "servestack-pipeline.template.json"
    }
    pipeline = json.loads((outdir / "servestack-pipeline.template.json").read_text(encoding="utf-8"))
    spec = yaml.safe_load((root / "serving.yaml").read_text(encoding="utf-8"))
    return Synth(
        outdir=outdir,
        templates=templates,
        pipeline=pipeline,
        validation_error=error,
        app=app,
        deployments={k: v["mode"] for k, v in spec["deployments"].items()},
    )
