"""The Fargate batch task runs what `cdk deploy` ships: the image's staged build context in cdk.out, the
Dockerfile's WORKDIR and ENV, the task definition's entry point and environment, and the model that context
carries (not the working tree's). S3 is moto over HTTP."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from moto.server import ThreadedMotoServer

from servestack.local.hosting.processes import free_port
from tests.infra.conftest import REPO

pytestmark = pytest.mark.slow  # a synth of servestack's own sources, and a real batch run

MODEL = ("digits", "1")
BUCKET = "batch-bucket"
ROWS = 25


def dockerfile_settings(dockerfile: Path) -> tuple[str, dict[str, str]]:
    """The last WORKDIR and every ENV of a Dockerfile (`ENV k=v ...`, with line continuations)."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text(encoding="utf-8"))
    workdir, env = "/", {}
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if words[0].upper() == "WORKDIR":
            workdir = words[1]
        elif words[0].upper() == "ENV":
            for pair in words[1:]:
                key, _, value = pair.partition("=")
                env[key] = re.sub(r"\$(\w+)", lambda m: env.get(m.group(1), ""), value)
    return workdir, env


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A project with one Fargate batch deployment of the digits model, synthesized with servestack's real
    Dockerfiles and sources (bundling skipped: no Lambda here)."""
    from servestack.cdk import app as cdk_app

    project = tmp_path_factory.mktemp("project")
    name, version = MODEL
    shutil.copytree(REPO / "models" / "artifacts" / name / version, project / "models" / "artifacts" / name / version)
    spec = {
        "models": [{"name": name, "version": int(version)}],
        "deployments": {"weekly": {"mode": "batch", "model": name, "runner": "fargate", "schedule": "rate(7 days)"}},
    }
    (project / "serving.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    outdir = tmp_path_factory.mktemp("cdk.out")
    context = json.loads((REPO / "cdk.json").read_text(encoding="utf-8"))["context"]
    context |= {"servestack:project": str(project), "aws:cdk:bundling-stacks": []}
    cdk_app.build_app(root=REPO, context=context, outdir=str(outdir), nag=False, builtin_validation=False).synth()
    template = json.loads((outdir / "servestack-weekly.template.json").read_text(encoding="utf-8"))
    assets = json.loads((outdir / "servestack-weekly.assets.json").read_text(encoding="utf-8"))
    (image,) = assets["dockerImages"].values()
    (task,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::ECS::TaskDefinition"]
    (container,) = task["Properties"]["ContainerDefinitions"]
    return {
        "project": project,
        "context": outdir / image["source"]["directory"],
        "dockerfile": image["source"]["dockerFile"],
        "container": container,
    }


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_staged_image_context_carries_the_deployments_model_package(shipped: dict[str, Any]) -> None:
    # GIVEN the Fargate image's build context as cdk.out stages it for `cdk deploy`
    name, version = MODEL
    source = shipped["project"] / "models" / "artifacts" / name / version
    staged = shipped["context"] / "models" / "artifacts" / name / version
    # THEN it holds the model package the deployment serves, byte for byte (model, manifest, samples)
    assert sorted(p.name for p in staged.iterdir()) == sorted(p.name for p in source.iterdir())
    for file in ("model.onnx", "manifest.json"):
        assert sha256(staged / file) == sha256(source / file)
    # AND only that package: not the working tree's others
    assert [p.relative_to(staged.parents[1]).as_posix() for p in staged.parents[1].glob("*/*")] == [f"{name}/{version}"]
    # AND the task definition names the directory the Dockerfile copies it to
    environment = {e["Name"]: e["Value"] for e in shipped["container"]["Environment"]}
    workdir, _ = dockerfile_settings(shipped["context"] / shipped["dockerfile"])
    assert environment["SERVESTACK_MODEL_DIR"] == f"{workdir}/models/artifacts"
    assert environment["SERVESTACK_DEFAULT_MODEL"] == name


@pytest.fixture
def s3() -> Any:
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    try:
        client = boto3.client(
            "s3",
            endpoint_url=f"http://127.0.0.1:{port}",
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        client.create_bucket(Bucket=BUCKET)
        yield client
    finally:
        server.stop()


def test_the_fargate_task_runs_from_its_staged_context_and_scores_with_the_model_it_carries(
    shipped: dict[str, Any], s3: Any
) -> None:
    # GIVEN input rows under the deployment's prefix in S3 (moto over HTTP)
    context: Path = shipped["context"]
    container = shipped["container"]
    sample = json.loads((shipped["project"] / "models/artifacts/digits/1/sample-request.json").read_text())
    rows = "".join(json.dumps(sample["instances"][0]) + "\n" for _ in range(ROWS))
    s3.put_object(Bucket=BUCKET, Key="batch/weekly/input/rows.jsonl", Body=rows.encode())
    # AND the task as ECS would start it: the image's WORKDIR is the staged context, its ENV and the task
    # definition's environment apply (container paths under WORKDIR mapped into the context), the task
    # definition's entry point replaces the image's; the interpreter is this one (the image's has the lock's
    # packages too), and the working tree's models are nowhere on the path
    workdir, image_env = dockerfile_settings(context / shipped["dockerfile"])
    task_env = {
        e["Name"]: e["Value"] if isinstance(e["Value"], str) else BUCKET for e in container["Environment"]
    }  # the only non-literal value is the bucket's Ref
    env = {k: v for k, v in image_env.items() if k not in {"PATH", "VIRTUAL_ENV"}}
    env |= {k: v.replace(workdir, str(context), 1) if v.startswith(workdir) else v for k, v in task_env.items()}
    env |= {
        "PATH": os.environ["PATH"],
        "HOME": str(context),
        "AWS_ENDPOINT_URL": s3.meta.endpoint_url,
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }
    entry = container["EntryPoint"]
    assert entry[0] == "python"
    # WHEN the task's command runs
    done = subprocess.run(
        [sys.executable, *entry[1:], *container.get("Command", [])],
        cwd=context,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    # THEN it loads the model from the context and scores every row into the output prefix
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = json.loads(s3.get_object(Bucket=BUCKET, Key="batch/weekly/output/manifest.json")["Body"].read())
    assert manifest["rows"] == {"total": ROWS, "succeeded": ROWS, "failed": 0}
    # AND its answers are the model's: each row's is the package's sample response
    expected = json.loads((shipped["project"] / "models/artifacts/digits/1/sample-response.json").read_text())
    (part,) = manifest["parts"]
    body = s3.get_object(Bucket=BUCKET, Key=f"batch/weekly/output/{part['key']}")["Body"].read().decode()
    answers = [json.loads(line) for line in body.splitlines()]
    assert len(answers) == ROWS
    assert {json.dumps(a["prediction"]) for a in answers} == {json.dumps(expected["predictions"][0])}
