"""A model package's hook that imports a package of its own (Pillow), declared with `models push --requirement`:
it ships in the deployment's Lambda bundle and image, and local mode runs each function and container on what
its deployment ships (servestack/local/hosting/environments.py), so the same hook without the declaration
fails under `local up` as it would in AWS, naming the distribution to declare.

- `pil-api` (serverless) and `pil-rt` (realtime) serve version 1, pushed with `--requirement Pillow`: both answer.
- `pil-bare` (serverless) serves version 2, the same hook pushed without it: it fails to start, and says
  `--requirement Pillow`.
- The synthesized bundle of pil-api, built for Lambda's platform, answers from the bundle alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import LocalUp, start_local_up

pytestmark = pytest.mark.slow
SERVESTACK = str(Path(sys.executable).parent / "servestack")
HOOK = '''"""Each row an 8x8 image, made a PIL image and back before the model sees it."""
import numpy as np
from PIL import Image


def preprocess(payload, content_type):
    rows = np.asarray(payload["instances"], dtype=np.float32)
    return np.stack([np.asarray(Image.fromarray(row.reshape(8, 8)), dtype=np.float32).reshape(64) for row in rows])
'''


@dataclass
class Project:
    root: Path
    up: LocalUp

    def invoke(self, deployment: str) -> subprocess.CompletedProcess[str]:
        sample = self.root / "models" / "artifacts" / "pil-digits" / "1" / "sample-request.json"
        return subprocess.run([SERVESTACK, "invoke", deployment, "--data", str(sample)], cwd=self.root,
                              capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


def servestack(*args: str, cwd: Path) -> None:
    done = subprocess.run([SERVESTACK, *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    root = tmp_path_factory.mktemp("requirements-project")
    servestack("init", ".", cwd=root)
    (root / "process.py").write_text(HOOK)
    digits = root / "models" / "artifacts" / "digits" / "1"
    push = ["models", "push", str(digits / "model.onnx"), "--name", "pil-digits", "--process", "process.py"]
    push += ["--sample", str(digits / "sample-request.json")]
    servestack(*push, "--requirement", "Pillow", cwd=root)  # version 1
    servestack(*push, cwd=root)  # version 2: the same hook, its requirement undeclared
    spec = {
        "models": [{"name": "pil-digits", "version": 1}, {"name": "pil-digits", "version": 2}],
        "deployments": {
            "pil-api": {"mode": "serverless", "model": "pil-digits", "version": 1},
            "pil-rt": {"mode": "realtime", "model": "pil-digits", "version": 1, "instance_type": "ml.c6i.xlarge"},
            "pil-bare": {"mode": "serverless", "model": "pil-digits", "version": 2},
        },
    }
    (root / "serving.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SERVESTACK_"))}
    up = start_local_up(root, cwd=root, found_state=root / ".servestack" / "local.json", timeout_sec=300, env=env)
    try:
        yield Project(root, up)
    finally:
        up.stop()


def test_the_declared_requirement_ships_and_both_modes_answer(project: Project) -> None:
    # GIVEN version 1, pushed with --requirement Pillow, whose manifest says so
    manifest = json.loads((project.root / "models/artifacts/pil-digits/1/manifest.json").read_text())
    assert manifest["requirements"] == ["Pillow"]
    expected = json.loads((project.root / "models/artifacts/pil-digits/1/sample-response.json").read_text())
    # WHEN the serverless function and the realtime container answer its sample
    for deployment in ("pil-api", "pil-rt"):
        done = project.invoke(deployment)
        # THEN each answers, its hook having imported PIL from what the deployment ships
        assert done.returncode == 0, done.stdout + done.stderr
        assert json.loads(done.stdout)["predictions"] == expected["predictions"], deployment


def test_the_undeclared_requirement_fails_the_function_naming_the_distribution(project: Project) -> None:
    # GIVEN version 2, the same hook pushed without --requirement, served by pil-bare
    log = project.up.log_text()
    # THEN its function failed to start, and the reason names what to declare
    assert "pil-bare/" in log
    assert (
        "process.py: model pil-digits@2's hooks import 'PIL', which this deployment does not ship (it declares none)"
        in log
    )
    assert "servestack models push model.onnx --requirement pillow" in log.lower()  # names are case-blind
    done = project.invoke("pil-bare")
    assert done.returncode != 0


def test_the_bundle_and_the_image_install_it_locked_beside_servestacks_runtime(project: Project) -> None:
    # GIVEN the synthesized templates' code assets and image contexts (cdk.out's assets manifests)
    out = project.root / ".servestack" / "cdk.out"
    files = {
        stack.name.split(".")[0]: json.loads(stack.read_text()) for stack in out.glob("servestack-pil-*.assets.json")
    }
    sources = [Path(a["source"]["path"]) for a in files["servestack-pil-api"]["files"].values()
               if "lambda-source" in a["source"]["path"]]  # fmt: skip
    contexts = [out / a["source"]["directory"] for a in files["servestack-pil-rt"]["dockerImages"].values()]
    # THEN the function's requirements.txt and the image's pin Pillow beside the runtime's onnxruntime
    for listed in [*(s / "requirements.txt" for s in sources), *(c / "requirements.txt" for c in contexts)]:
        text = listed.read_text()
        assert "\npillow==" in text.lower(), listed
        assert "\nonnxruntime==" in text, listed
    # AND the bare deployment's lists no Pillow
    bare = [Path(a["source"]["path"]) for a in files["servestack-pil-bare"]["files"].values()
            if "lambda-source" in a["source"]["path"]]  # fmt: skip
    assert all("pillow==" not in (s / "requirements.txt").read_text().lower() for s in bare)


def test_the_bundle_built_for_lambda_answers_from_the_bundle_alone(project: Project, tmp_path: Path) -> None:
    from servestack.cdk.bundling import LocalPythonBundler, find_python
    from tests.infra.test_bundling import RUN_HANDLER

    python = find_python("3.12")
    if python is None:
        pytest.skip("no python3.12 interpreter to run the bundle (pyenv install 3.12)")
    out = project.root / ".servestack" / "cdk.out"
    assets = json.loads((out / "servestack-pil-api.assets.json").read_text())["files"].values()
    (source,) = [Path(a["source"]["path"]) for a in assets if "lambda-source" in a["source"]["path"]]
    # GIVEN the function's bundle, built as `cdk synth` builds it (wheels for CPython 3.12 on manylinux)
    bundle = LocalPythonBundler(source=source).bundle(tmp_path / "bundle")
    assert list(bundle.glob("PIL/__init__.py")), "Pillow is not in the bundle"
    # WHEN a bare python3.12 runs its handler from the bundle alone on an HTTP API event
    event = json.loads((Path(__file__).parents[1] / "events" / "apiGatewayHttpApiV2Event.json").read_text())
    package = project.root / "models/artifacts/pil-digits/1"
    event["body"] = (package / "sample-request.json").read_text()
    env = {"SERVESTACK_MODEL_DIR": str(bundle / "models" / "artifacts"), "SERVESTACK_DEFAULT_MODEL": "pil-digits",
           "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # fmt: skip
    done = subprocess.run([python, "-I", "-S", "-c", RUN_HANDLER, str(bundle), json.dumps(event)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    # THEN it answers the sample, its hook importing the bundle's Pillow
    assert done.returncode == 0, done.stderr[-3000:]
    reply = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("REPLY "))[6:])
    expected = json.loads((package / "sample-response.json").read_text())
    assert json.loads(reply["body"])["predictions"] == expected["predictions"]
