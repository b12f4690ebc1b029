"""The GPU check: servestack's inference core and realtime server on onnxruntime's CUDA provider, against the CPU,
where there is an NVIDIA GPU and onnxruntime-gpu (the GPU image's environment). CI has no GPU; a session that is
lent one runs this once and records its figures in docs/performance.md ("On a GPU").

    python -m bench.gpu_check --pipeline DIR --out gpu-check.json

Per model (digits, the two-input torch MLP, the zoo's ColumnTransformer pipeline with a string column, a
ResNet-18-shaped CNN): the providers its session got and where its inputs are bound, the largest difference
between the GPU's answers and the CPU's on the same arrays, and the median latency of a batch on each. Then what
asking for TensorRT gives on this machine, and the realtime server (`serve`, as the GPU image starts it, workers
by its own default) answering /ping and /invocations on the GPU, with the same answers as the CPU and its
latency. Answers and providers are checked (the exit status is 1 when one is wrong); no time is asserted.
`--pipeline`: a model folder holding the pipeline's package (`flowers/1`) and `flowers-request.json`, built where
scikit-learn and skl2onnx are installed (`python -m bench.gpu_check --write-pipeline DIR`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from servestack.local.hosting.processes import REPO_ROOT

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "deep_learning" / "registry"
DIGITS = REPO_ROOT / "models" / "artifacts" / "digits" / "1"
BATCHES = {"digits": (1, 32, 512), "torch-two-inputs": (1, 32, 512), "flowers": (1, 32), "resnet18": (1, 8, 64)}
# Answers may differ by float32 rounding of a different kernel order (cuBLAS, cuDNN against MLAS).
TOLERANCE = {"resnet18": 2e-2}
DEFAULT_TOLERANCE = 1e-4


def write_pipeline(destination: Path) -> None:
    """The zoo's pipeline package and a 32-row `dataframe_split` request for it, for a machine without
    scikit-learn (the GPU machine)."""
    from tests.pipeline_model import COLUMNS, pipeline_model

    model = pipeline_model()
    shutil.copytree(model.package, destination / "flowers" / "1", dirs_exist_ok=True)
    rows = [[model.rows[name][i % len(model.rows[name])] for name in COLUMNS] for i in range(32)]
    body = {"dataframe_split": {"columns": list(COLUMNS), "data": rows}}
    (destination / "flowers-request.json").write_text(json.dumps(body))


def model_dir(scratch: Path, pipeline: Path | None) -> Path:
    from bench.resnet import write_resnet18
    from servestack.inference.packaging import build_package

    root = scratch / "models"
    shutil.copytree(DIGITS, root / "digits" / "1")
    shutil.copytree(FIXTURES / "torch-two-inputs" / "1", root / "torch-two-inputs" / "1")
    if pipeline is not None:
        shutil.copytree(pipeline / "flowers" / "1", root / "flowers" / "1")
    onnx_file = write_resnet18(scratch / "resnet18.onnx")
    build_package(onnx_file, root / "resnet18" / "1", name="resnet18", version="1")
    return root


def arrays_for(model: Any, rows: int, pipeline: Path | None) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(rows)
    if model.manifest.name == "flowers" and pipeline is not None:
        body = json.loads((pipeline / "flowers-request.json").read_text())["dataframe_split"]
        data = [body["data"][i % len(body["data"])] for i in range(rows)]
        out = {}
        for index, name in enumerate(body["columns"]):
            spec = next(spec for spec in model.manifest.inputs if spec.name == name)
            values = [row[index] for row in data]
            dtype = object if spec.dtype == "string" else spec.numpy_dtype
            out[name] = np.asarray(values, dtype=dtype).reshape(rows, 1)
        return out
    arrays = {}
    for spec in model.manifest.inputs:
        shape = (rows, *[size or 1 for size in spec.row_shape])
        arrays[spec.name] = (rng.random(shape, dtype=np.float32) * 4).astype(spec.numpy_dtype)
    return arrays


def median_ms(run: Any, repeats: int) -> float:
    run()  # the first run of a shape sets up its kernels
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def check_models(root: Path, pipeline: Path | None, problems: list[str]) -> list[dict[str, Any]]:
    from servestack.inference.service import ServedModel
    from servestack.inference.settings import ServingSettings

    results = []
    for package in sorted(root.glob("*/1")):
        name = package.parent.name
        gpu = ServedModel.load(package, ServingSettings(model_dir=root, default_model=name, providers="auto"))
        cpu = ServedModel.load(
            package, ServingSettings(model_dir=root, default_model=name, providers="CPUExecutionProvider")
        )
        row: dict[str, Any] = {
            "model": name,
            "gpu_providers": gpu.runtime.providers,
            "binding_device": gpu.runtime.binding_device,
            "gpu_load_sec": round(gpu.runtime.load_seconds, 3),
            "batches": {},
        }
        if gpu.runtime.providers[:1] != ["CUDAExecutionProvider"]:
            problems.append(f"{name}: the GPU session runs on {gpu.runtime.providers}")
        # onnxruntime binds no string tensor: a model with one runs `session.run` (servestack/inference/runtime.py)
        strings = any(spec.dtype == "string" for spec in (*gpu.manifest.inputs, *gpu.manifest.outputs))
        if gpu.runtime.binding_device != (None if strings else "cuda"):
            problems.append(f"{name}: inputs bound to {gpu.runtime.binding_device}")
        gpu.warm_up()
        for rows in BATCHES.get(name, (1, 32)):
            arrays = arrays_for(gpu, rows, pipeline)
            on_gpu, on_cpu = gpu.runtime.predict(arrays), cpu.runtime.predict(arrays)
            worst = 0.0
            for output, value in on_cpu.items():
                if value.dtype.kind == "f":
                    worst = max(worst, float(np.max(np.abs(value - on_gpu[output]))))
                elif not np.array_equal(value, on_gpu[output]):
                    problems.append(f"{name} at {rows} rows: output {output} differs between GPU and CPU")
            if worst > TOLERANCE.get(name, DEFAULT_TOLERANCE):
                problems.append(f"{name} at {rows} rows: GPU and CPU answers differ by {worst:g}")
            cpu_repeats = 5 if name == "resnet18" and rows > 1 else 30
            row["batches"][rows] = {
                "max_abs_difference": worst,
                "gpu_ms": round(median_ms(partial(gpu.runtime.predict, arrays), 50), 3),
                "cpu_one_thread_ms": round(median_ms(partial(cpu.runtime.predict, arrays), cpu_repeats), 3),
            }
        print(json.dumps(row), flush=True)
        results.append(row)
    return results


def check_tensorrt(root: Path) -> dict[str, Any]:
    """What `gpu: {provider: tensorrt}` gives here: the providers the session got, or the error."""
    from servestack.inference.service import ServedModel
    from servestack.inference.settings import ServingSettings

    settings = ServingSettings(model_dir=root, default_model="digits", providers="auto", gpu_provider="tensorrt")
    try:
        model = ServedModel.load(root / "digits" / "1", settings)
        model.warm_up()
        return {"providers": model.runtime.providers}
    except Exception as exc:  # recorded, not raised: TensorRT's libraries may be absent here
        return {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}


def check_server(root: Path, pipeline: Path | None, problems: list[str]) -> dict[str, Any]:
    """`serve` on the GPU, as the image runs it: /ping, then each model's answer against the CPU's and latency."""
    import httpx

    from servestack.inference.service import ServedModel
    from servestack.inference.settings import ServingSettings
    from servestack.local.hosting.processes import free_port

    port = free_port()
    env = {**os.environ, "SAGEMAKER_BIND_TO_PORT": str(port), "SERVESTACK_HOST": "127.0.0.1",
           "SERVESTACK_MODEL_DIR": str(root), "SERVESTACK_LOG_LEVEL": "warning"}  # fmt: skip
    log = root.parent / "serve.log"
    with log.open("wb") as output:
        server = subprocess.Popen(
            [sys.executable, "-m", "servestack.adapters.realtime", "serve"], env=env, stdout=output, stderr=output
        )
    out: dict[str, Any] = {}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            started = time.monotonic()
            while True:
                try:
                    if client.get("/ping").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if server.poll() is not None or time.monotonic() - started > 120:
                    raise RuntimeError("serve did not become ready: " + log.read_text(errors="replace")[-3000:])
                time.sleep(0.2)
            out["ready_sec"] = round(time.monotonic() - started, 2)
            cpu_settings = ServingSettings(model_dir=root, providers="CPUExecutionProvider")
            image = np.random.default_rng(1).random((1, 3, 224, 224), dtype=np.float32)
            requests = [
                ("digits", (DIGITS / "sample-request.json").read_bytes()),
                ("resnet18", json.dumps({"inputs": {"image": image.tolist()}}).encode()),
            ]
            if pipeline is not None:
                requests.append(("flowers", (pipeline / "flowers-request.json").read_bytes()))
            media_type = "application/json"
            for name, body in requests:
                headers = {"content-type": media_type, "x-amzn-sagemaker-target-model": name}
                answer = client.post("/invocations", content=body, headers=headers)
                if answer.status_code != 200:
                    problems.append(f"serve {name}: {answer.status_code} {answer.text[:300]}")
                    continue
                cpu = ServedModel.load(root / name / "1", cpu_settings)
                same = compare_answers(answer.json(), cpu, body, media_type)
                if same is not True:
                    problems.append(f"serve {name}: the GPU server's answer differs from the CPU's: {same}")
                latency = median_ms(lambda b=body, h=headers: client.post("/invocations", content=b, headers=h), 100)
                out[name] = {"status": answer.status_code, "same_as_cpu": same is True, "median_ms": round(latency, 3)}
                print(json.dumps({name: out[name]}), flush=True)
    finally:
        server.terminate()
        server.wait(timeout=60)
    out["log_tail"] = log.read_text(errors="replace")[-1500:]
    return out


def compare_answers(answer: dict[str, Any], cpu: Any, body: bytes, media_type: str) -> bool | str:
    """The server's JSON answer against the CPU model's answer to the same body (decoded as the server does):
    every label or class index the CPU gives for the first rows appears in the GPU server's answer."""
    expected = cpu.runtime.predict(cpu.decode(body, media_type))
    flat = json.dumps(answer)
    for value in expected.values():
        if value.dtype.kind in "iuUO":
            for item in np.asarray(value).ravel()[:8]:
                if json.dumps(item.item() if hasattr(item, "item") else item) not in flat:
                    return f"{item!r} not in the answer"
    return True


def nvidia_smi() -> str:
    query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    try:
        return subprocess.run(query, capture_output=True, text=True, check=False).stdout.strip()
    except FileNotFoundError:
        return "nvidia-smi: not found"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    parser.add_argument("--pipeline", type=Path, help="the folder --write-pipeline wrote")
    parser.add_argument("--write-pipeline", type=Path, help="write the pipeline's package and request here, and stop")
    args = parser.parse_args(argv)
    if args.write_pipeline:
        write_pipeline(args.write_pipeline)
        return 0
    import onnxruntime as ort

    from servestack.inference.devices import gpu_count

    report: dict[str, Any] = {
        "onnxruntime": ort.__version__,
        "available_providers": ort.get_available_providers(),
        "gpus": gpu_count(),
        "nvidia_smi": nvidia_smi(),
    }
    problems: list[str] = []
    if report["gpus"] == 0 and report["nvidia_smi"] and "not found" not in report["nvidia_smi"]:
        # The driver lists a GPU that /proc/driver/nvidia does not show (a sandboxed kernel): name it, so that the
        # rest of the check still runs on it, and report the miss.
        problems.append("gpu_count() found no GPU under /proc/driver/nvidia/gpus although nvidia-smi lists one")
        os.environ["CUDA_VISIBLE_DEVICES"] = "0"
        report["gpus_with_cuda_visible_devices"] = gpu_count()
    print(json.dumps(report), flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        root = model_dir(Path(scratch), args.pipeline)
        for part, check in (
            ("models", lambda: check_models(root, args.pipeline, problems)),
            ("tensorrt", lambda: check_tensorrt(root)),
            ("server", lambda: check_server(root, args.pipeline, problems)),
        ):
            try:
                report[part] = check()
            except Exception:
                problems.append(f"{part}: " + traceback.format_exc(limit=6))
            print(json.dumps({part: report.get(part)}, default=str)[:4000], flush=True)
    report["problems"] = problems
    if args.out:
        args.out.write_text(json.dumps(report, indent=2, default=str))
    print("problems:" if problems else "no problems", *problems, sep="\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
