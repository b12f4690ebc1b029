"""arm64 (AWS Graviton) end to end at synth: the cloud assembly of a project whose deployments run on arm64 declares
linux/arm64 for their images, and what they install is aarch64 machine code only.

One synth of a small project with the repo's digits package: a realtime endpoint on ml.c7g.xlarge beside an x86
variant, a SageMaker-async endpoint on ml.m6g.large, a Fargate batch task and a serverless function with
`architecture: arm64`. Only the serverless stack is bundled (a real bundle: uv installs the locked runtime's
aarch64 wheels, from its cache or the package index the first time).
"""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from servestack.cdk.bundling import find_uv
from servestack.cdk.images import image_context
from tests.infra.conftest import PIPELINE_CONTEXT, REPO

pytestmark = pytest.mark.slow  # a synth with one real Lambda bundle

MODEL = ("digits", "1")
DEPLOYMENTS: dict[str, dict[str, Any]] = {
    "graviton-api": {
        "mode": "realtime",
        "model": "digits",
        "instance_type": "ml.c7g.xlarge",
        "variants": [
            {"name": "graviton", "model": "digits", "weight": 1},
            {"name": "intel", "model": "digits", "weight": 1, "instance_type": "ml.c6i.large"},
        ],
    },
    "graviton-async": {"mode": "async", "model": "digits", "backend": "sagemaker", "instance_type": "ml.m6g.large"},
    "graviton-weekly": {
        "mode": "batch",
        "model": "digits",
        "runner": "fargate",
        "architecture": "arm64",
        "schedule": "rate(7 days)",
    },
    "graviton-fn": {"mode": "serverless", "model": "digits", "architecture": "arm64"},
}
# ELF e_machine (a 2-byte little-endian field at offset 18): what a shared object's code runs on.
ELF_MACHINES = {62: "x86_64", 183: "aarch64"}


def elf_machines(tree: Path) -> dict[str, str]:
    """Every ELF file under `tree` (by path relative to it) and the machine its code is for."""
    found: dict[str, str] = {}
    for path in sorted(tree.rglob("*")):
        if not path.is_file() or path.is_symlink():
            continue
        with path.open("rb") as file:
            head = file.read(20)
        if head[:4] == b"\x7fELF":
            machine = int.from_bytes(head[18:20], "little")
            found[path.relative_to(tree).as_posix()] = ELF_MACHINES.get(machine, f"e_machine {machine}")
    return found


def wheel_platforms(site: Path) -> dict[str, set[str]]:
    """Each installed distribution's platform tags, from its `*.dist-info/WHEEL` (`Tag: cp312-cp312-...`)."""
    platforms: dict[str, set[str]] = {}
    for wheel in site.glob("*.dist-info/WHEEL"):
        tags = [line.split(":", 1)[1].strip() for line in wheel.read_text().splitlines() if line.startswith("Tag:")]
        platforms[wheel.parent.name] = {tag.rsplit("-", 1)[-1] for tag in tags}
    return platforms


@pytest.fixture(scope="module")
def assembly(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from servestack.cdk import app as cdk_app

    project = tmp_path_factory.mktemp("project")
    name, version = MODEL
    shutil.copytree(REPO / "models" / "artifacts" / name / version, project / "models" / "artifacts" / name / version)
    spec = {"models": [{"name": name, "version": int(version)}], "deployments": DEPLOYMENTS}
    (project / "serving.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    outdir = tmp_path_factory.mktemp("cdk.out")
    context = json.loads((REPO / "cdk.json").read_text(encoding="utf-8"))["context"]
    context |= {"servestack:project": str(project), "aws:cdk:bundling-stacks": ["servestack-graviton-fn"]}
    # The delivery pipeline too, releasing the Graviton endpoint: its image is built for linux/arm64 in CodeBuild.
    context |= PIPELINE_CONTEXT | {"servestack:pipeline-deployments": "graviton-api"}
    cdk_app.build_app(root=REPO, context=context, outdir=str(outdir), nag=False, builtin_validation=False).synth()
    return outdir


def image_platforms(outdir: Path, stack: str) -> dict[str, str]:
    """Each docker image asset of `stack` in the assets manifest: its Dockerfile and declared platform, by the
    logical id of the image's construct (`GpuImage`, `CpuArm64Image`... as its display name ends)."""
    assets = json.loads((outdir / f"{stack}.assets.json").read_text(encoding="utf-8"))
    return {
        image["displayName"].rsplit("/", 1)[-1]: image["source"].get("platform", "(none)")
        for image in assets["dockerImages"].values()
    }


def template(outdir: Path, stack: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((outdir / f"{stack}.template.json").read_text(encoding="utf-8"))
    return result


def test_a_graviton_endpoint_runs_an_image_built_for_linux_arm64(assembly: Path) -> None:
    # GIVEN an endpoint with a variant on ml.c7g.xlarge (Graviton3) and one on ml.c6i.large (Intel)
    # WHEN it is synthesized
    platforms = image_platforms(assembly, "servestack-graviton-api")

    # THEN the assets manifest holds the CPU image twice, once for each architecture
    assert platforms == {"CpuImage": "linux/amd64", "CpuArm64Image": "linux/arm64"}, platforms
    # AND each variant's model runs the image of its instance type's architecture
    resources = template(assembly, "servestack-graviton-api")["Resources"]
    configs = [r for r in resources.values() if r["Type"] == "AWS::SageMaker::EndpointConfig"]
    by_variant = {v["VariantName"]: v for c in configs for v in c["Properties"]["ProductionVariants"]}
    models = {k: r for k, r in resources.items() if r["Type"] == "AWS::SageMaker::Model"}

    def image_of(variant: str) -> str:
        model = models[by_variant[variant]["ModelName"]["Fn::GetAtt"][0]]
        return json.dumps(model["Properties"]["PrimaryContainer"]["Image"])

    assert by_variant["graviton"]["InstanceType"] == "ml.c7g.xlarge"
    assert image_of("graviton") != image_of("intel")


def asset_projects(pipeline: dict[str, Any]) -> list[list[str]]:
    """The commands of each CodeBuild project of the pipeline's asset stage (those that run cdk-assets)."""
    specs = [
        json.loads(r["Properties"]["Source"]["BuildSpec"])
        for r in pipeline["Resources"].values()
        if r["Type"] == "AWS::CodeBuild::Project"
    ]
    commands = [[c for phase in s["phases"].values() for c in phase.get("commands", [])] for s in specs]
    return [c for c in commands if any("cdk-assets" in command for command in c)]


def test_the_pipeline_registers_the_arm64_emulator_before_building_a_graviton_image(assembly: Path) -> None:
    from servestack.cdk.pipeline import REGISTER_ARM64_EMULATOR

    # GIVEN the pipeline releasing the endpoint with a Graviton variant (its CodeBuild hosts are x86_64)
    # WHEN it is synthesized
    projects = asset_projects(template(assembly, "servestack-pipeline"))
    # THEN every asset project registers QEMU's arm64 emulator first, from ECR Public, then builds and publishes
    assert projects
    for commands in projects:
        assert commands[0] == REGISTER_ARM64_EMULATOR, commands
        assert "public.ecr.aws/" in commands[0]
        assert any("cdk-assets" in c for c in commands[1:]), commands


def test_the_workflows_deploy_job_sets_up_the_arm64_emulator_before_cdk_deploy() -> None:
    # GIVEN the example GitHub workflow, whose deploy job builds the images on an x86_64 runner
    document = yaml.safe_load((REPO / ".github" / "workflows" / "deploy.yml").read_text(encoding="utf-8"))
    steps = document["jobs"]["deploy"]["steps"]
    uses = [str(step.get("uses", "")) for step in steps]
    runs = [str(step.get("run", "")) for step in steps]
    # THEN QEMU is set up for arm64 before the step that runs cdk deploy
    qemu = next(i for i, u in enumerate(uses) if u.startswith("docker/setup-qemu-action@"))
    assert "arm64" in steps[qemu]["with"]["platforms"]
    assert qemu < next(i for i, r in enumerate(runs) if "cdk deploy" in r)


def test_a_graviton_async_endpoint_and_an_arm64_fargate_task_get_arm64_images(assembly: Path) -> None:
    # GIVEN a SageMaker-async endpoint on ml.m6g.large and a Fargate batch task with architecture: arm64
    # WHEN they are synthesized
    # THEN both image assets declare linux/arm64
    assert image_platforms(assembly, "servestack-graviton-async") == {"CpuArm64Image": "linux/arm64"}
    assert image_platforms(assembly, "servestack-graviton-weekly") == {"BatchImage": "linux/arm64"}
    # AND the task definition asks Fargate for ARM64 hosts
    (task,) = [
        r for r in template(assembly, "servestack-graviton-weekly")["Resources"].values()
        if r["Type"] == "AWS::ECS::TaskDefinition"
    ]  # fmt: skip
    assert task["Properties"]["RuntimePlatform"] == {"CpuArchitecture": "ARM64", "OperatingSystemFamily": "LINUX"}


def test_an_arm64_function_is_bundled_with_aarch64_native_code_only(assembly: Path) -> None:
    # GIVEN a serverless deployment with architecture: arm64, bundled at synth
    resources = template(assembly, "servestack-graviton-fn")["Resources"]
    (function,) = [
        r for r in resources.values()
        if r["Type"] == "AWS::Lambda::Function" and r["Properties"].get("Handler") == "handlers.serverless.handler"
    ]  # fmt: skip
    # WHEN its code asset is read from the cloud assembly
    assert function["Properties"]["Architectures"] == ["arm64"]
    key = function["Properties"]["Code"]["S3Key"]
    bundle = assembly / f"asset.{key.removesuffix('.zip')}"

    # THEN it carries onnxruntime's, numpy's and pydantic-core's native code, every file of it for aarch64
    machines = elf_machines(bundle)
    assert any(p.startswith("onnxruntime/") for p in machines), sorted(machines)
    assert any(p.startswith("numpy/") for p in machines)
    assert any(p.startswith("pydantic_core/") for p in machines)
    assert {p: m for p, m in machines.items() if m != "aarch64"} == {}
    # AND every installed wheel is pure Python or built for aarch64
    assert {d: p for d, p in wheel_platforms(bundle).items() if not p <= {"any"} and not _aarch64(p)} == {}


def _aarch64(platforms: set[str]) -> bool:
    return all("aarch64" in platform for platform in platforms)


def test_the_cpu_image_context_installs_aarch64_wheels_only_for_linux_arm64(tmp_path: Path) -> None:
    # GIVEN the CPU image's staged context (what a Graviton endpoint's and an arm64 Fargate task's build runs
    # `uv pip install -r requirements.txt` on), with the digits package a task carries
    context = image_context(
        flavour="cpu",
        entry_points=REPO / "handlers",
        artifacts_root=REPO,
        artifacts=["models/artifacts/digits/1"],
        cache_dir=tmp_path / "staged",
    )
    # WHEN its requirements are installed as the linux/arm64 build installs them: CPython 3.12 on glibc 2.28 or
    # later (the image's python:3.12-slim is newer), wheels only: the slim image has no compiler
    site = tmp_path / "site"
    command = [find_uv(), "pip", "install", "--quiet", "--no-deps", "--only-binary", ":all:", "--target", str(site)]
    command += ["--python-platform", "aarch64-manylinux_2_28", "--python-version", "3.12", "--python", sys.executable]
    command += ["-r", str(context / "requirements.txt")]
    done = subprocess.run([*command, "--offline"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        shutil.rmtree(site, ignore_errors=True)
        done = subprocess.run(command, capture_output=True, text=True, check=False)

    # THEN every pinned package has such a wheel (no source build in the image) ...
    assert done.returncode == 0, done.stderr[-3000:]
    # ... and what they install is aarch64 code only: onnxruntime, numpy, pyarrow, the HTTP servers' speedups
    machines = elf_machines(site)
    for package in ("onnxruntime/", "numpy/", "pyarrow/", "granian/", "uvloop/", "orjson/"):
        assert any(p.startswith(package) for p in machines), (package, sorted(machines)[:20])
    assert {p: m for p, m in machines.items() if m != "aarch64"} == {}
    assert {d: p for d, p in wheel_platforms(site).items() if not p <= {"any"} and not _aarch64(p)} == {}


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="says how an x86_64 machine runs arm64")
def test_local_up_explain_says_graviton_code_runs_as_its_x86_64_equivalent(assembly: Path) -> None:
    from servestack.local.cloudformation.templates import LocalValues, Resolver, StackTemplate
    from servestack.local.stack.topology import read_stack
    from servestack.local.up.fidelity import APPROXIMATED, fidelity_rows

    # GIVEN the Graviton endpoint, the arm64 Fargate task and the arm64 function, read as `local up` reads them
    topologies = []
    for deployment in ("graviton-api", "graviton-weekly", "graviton-fn"):
        stack = f"servestack-{deployment}"
        loaded = StackTemplate.load(assembly / f"{stack}.template.json", stack)
        topologies.append(read_stack(loaded, Resolver(loaded, LocalValues(emulator_url="http://emu:5000"))))

    # WHEN --explain describes how each run compares with the deploy on this x86_64 machine
    rows = fidelity_rows(topologies, assembly)

    # THEN the two linux/arm64 images and the arm64 function are each said to run as their x86_64 equivalent
    equivalents = [(subject, how) for kind, subject, how in rows if kind == APPROXIMATED and "equivalent" in how]
    assert len(equivalents) == 3, equivalents
    assert all("built for arm64 (AWS Graviton), run here as its x86_64 equivalent" in how for _, how in equivalents)
    assert any(subject == "servestack-graviton-fn code" for subject, _ in equivalents), equivalents
    # AND the x86_64 image beside them is not
    assert sum("image" in subject for subject, _ in equivalents) == 2
