"""The one test that really bundles the Lambda asset (no Docker) and runs its handler from the bundle alone.

It stages the function's sources (servestack's runtime, the example project's entry points, the model package),
installs servestack's locked runtime wheels for CPython 3.12 / manylinux x86_64 (from uv's cache, or the package
index the first time), then starts a clean python3.12 (`-I -S`: no site-packages, no user paths) whose only
extra `sys.path` entry is the bundle, imports the function's handler `handlers.serverless.handler` and answers
an API Gateway HTTP API (v2) event for POST /invocations with the model's sample request.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from servestack.cdk.bundling import LocalPythonBundler, find_python, lambda_source, tree_size_bytes
from servestack.cdk.sources import RUNTIME_BUNDLE_BYTES
from tests.infra.conftest import REPO

LIMIT_BYTES = RUNTIME_BUNDLE_BYTES  # what the zip-or-image choice counts servestack's runtime as (bundling.py)
MODEL = "models/artifacts/digits/1"

RUN_HANDLER = r"""
import json, sys, types
sys.path.insert(0, sys.argv[1])
event = json.loads(sys.argv[2])
import handlers.serverless as entry
assert all(not p.endswith("site-packages") for p in sys.path), sys.path
context = types.SimpleNamespace(
    function_name="bundle-test", function_version="1", memory_limit_in_mb=2048, aws_request_id="req-1",
    invoked_function_arn="arn:aws:lambda:us-east-1:123456789012:function:bundle-test",
    log_group_name="/aws/lambda/bundle-test", log_stream_name="s", get_remaining_time_in_millis=lambda: 30000,
)
reply = entry.handler(event, context)
third_party = [n for n in ("numpy", "onnxruntime", "fastapi", "mangum", "pydantic", "servestack") if n in sys.modules]
assert all(sys.modules[n].__file__.startswith(sys.argv[1]) for n in third_party), third_party
print("REPLY " + json.dumps(reply))
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bundle_imports_and_answers_an_http_api_event_from_the_bundle_alone(tmp_path: Path) -> None:
    python = find_python("3.12")
    if python is None:
        pytest.skip("no python3.12 interpreter to run the bundle (pyenv install 3.12)")
    source = lambda_source(entry_points=REPO / "handlers", artifacts=[MODEL], artifacts_root=REPO, cache_dir=tmp_path)
    bundler = LocalPythonBundler(source=source, architecture="x86_64")

    bundle = bundler.bundle(tmp_path / "bundle")
    size = tree_size_bytes(bundle)
    print(f"\nLambda bundle: {size / 1e6:.1f} MB ({size / 2**20:.1f} MiB) unzipped at {bundle}")

    assert size <= LIMIT_BYTES
    assert not list(bundle.glob("onnxruntime/capi/libonnxruntime.so*"))
    assert not list(bundle.glob("numpy/**/tests"))
    assert list(bundle.glob("handlers/__pycache__/serverless.cpython-312.pyc"))
    # servestack's runtime only: the core and the adapters, none of its CLI, constructs or local mode
    assert sorted(p.name for p in (bundle / "servestack").iterdir() if p.name != "__pycache__") == [
        "__init__.py",
        "adapters",
        "inference",
    ]
    event = json.loads((REPO / "tests" / "events" / "apiGatewayHttpApiV2Event.json").read_text(encoding="utf-8"))
    event["body"] = (REPO / MODEL / "sample-request.json").read_text(encoding="utf-8")
    env = {
        "SERVESTACK_MODEL_DIR": str(bundle / "models" / "artifacts"),
        "SERVESTACK_DEFAULT_MODEL": "digits",
        "SERVESTACK_PROVIDERS": "auto",
        "POWERTOOLS_SERVICE_NAME": "servestack",
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
    }

    done = subprocess.run(
        [python, "-I", "-S", "-c", RUN_HANDLER, str(bundle), json.dumps(event)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )

    assert done.returncode == 0, done.stderr[-3000:]
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("REPLY "))
    reply = json.loads(line.removeprefix("REPLY "))
    assert reply["statusCode"] == 200, reply
    expected = json.loads((REPO / MODEL / "sample-response.json").read_text(encoding="utf-8"))
    assert json.loads(reply["body"])["predictions"] == expected["predictions"]


def test_asset_hash_is_stable_and_tracks_the_requirements_platform_and_sources(tmp_path: Path) -> None:
    from servestack.cdk.sources import stage

    def hashed(requirements: bytes, handler: bytes, architecture: str = "x86_64") -> str:
        members = [("requirements.txt", requirements), ("handlers/serverless.py", handler)]
        source = stage(members, "lambda-source", tmp_path)
        return LocalPythonBundler(source=source, architecture=architecture).asset_hash()

    first = hashed(b"numpy==1\n", b"x = 1\n")
    assert hashed(b"numpy==1\n", b"x = 1\n") == first
    assert hashed(b"numpy==1\n", b"x = 1\n", "arm64") != first
    assert hashed(b"numpy==2\n", b"x = 1\n") != first
    assert hashed(b"numpy==1\n", b"x = 2\n") != first


def test_unknown_architecture_is_rejected_with_the_allowed_values(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"architecture='sparc' is not one of 'x86_64', 'arm64'"):
        LocalPythonBundler(source=tmp_path, architecture="sparc")
