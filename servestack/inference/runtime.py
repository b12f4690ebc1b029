"""onnxruntime sessions: threads, warmup and batch prediction on numpy arrays, bound to the accelerator's memory
where the session runs on one (providers.py chooses the providers)."""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnxruntime as ort

from servestack.inference.devices import gpu_count, worker_gpu
from servestack.inference.errors import InferenceError, InvalidInput, ModelLoadError
from servestack.inference.manifest import Manifest
from servestack.inference.providers import (
    CUDA,
    GpuProvider,
    binding_device,
    session_providers,
    unloaded_gpu_provider,
)

Arrays = dict[str, np.ndarray]


# How a failed run is told apart: the inputs already match the manifest's names, dtypes and shapes, so what
# onnxruntime still refuses is either a value the graph cannot take (the request's fault, a 400) or the runtime
# failing (a 500, which counts toward the 5xx alarms that roll a release back). onnxruntime raises a class per
# status code: INVALID_ARGUMENT (`InvalidArgument`) is what its kernels and its feed checks return for a bad
# input, e.g. a Gather's "indices element out of data bounds" (a token id past the vocabulary) or a wrong
# dtype or rank. Shape mismatches between inputs (an attention mask longer than its ids) come back as a plain
# FAIL from the broadcasting code, so those few messages are matched; every other FAIL, RUNTIME_EXCEPTION,
# EP_FAIL, ENGINE_ERROR (out of memory, a CUDA error, a kernel bug) stays an `InferenceError`.
_REQUEST_STATUS = "INVALID_ARGUMENT"
_REQUEST_FAILURES = re.compile(
    r"Attempting to broadcast an axis by a dimension other than 1|Incompatible dimensions|"
    r"indices element out of data bounds|dimension mismatch|Invalid input shape|"
    r"Can't broadcast|cannot broadcast|Got invalid dimensions for input|Shape mismatch",
    re.IGNORECASE,
)
_ORT_PREFIX = re.compile(r"\[ONNXRuntimeError\] : \d+ : \w+ : ")
_ORT_SOURCE = re.compile(r"(?:/\S*)?\b\w+\.(?:cc|h|cpp):\d+ (?:[\w:~<>*&, ]+\(.*?\) )?(?:[\w :=|&]+ was false\. )?")
_MAX_ORT_MESSAGE = 300


def _cuda_build() -> str | None:
    """The CUDA version an onnxruntime-gpu build was made for (its package info says; CPU builds do not)."""
    from onnxruntime.capi import build_and_package_info

    version = getattr(build_and_package_info, "cuda_version", None)
    return version if isinstance(version, str) else None


def caused_by_request(error: BaseException) -> bool:
    """Whether onnxruntime refused a run for its input (INVALID_ARGUMENT, or a shape mismatch between inputs)
    rather than failing on its own (see the comment above)."""
    text = str(error)
    if type(error).__name__ == "InvalidArgument" or f": {_REQUEST_STATUS} :" in text:
        return True
    return type(error).__name__ == "Fail" and _REQUEST_FAILURES.search(text) is not None


def onnxruntime_message(error: BaseException) -> str:
    """onnxruntime's message without its status prefix and C++ source location, bounded."""
    text = _ORT_SOURCE.sub("", _ORT_PREFIX.sub("", " ".join(str(error).split()))).strip()
    return text if len(text) <= _MAX_ORT_MESSAGE else text[: _MAX_ORT_MESSAGE - 3] + "..."


def _has_strings(manifest: Manifest) -> bool:
    return any(spec.dtype == "string" for spec in (*manifest.inputs, *manifest.outputs))


class ModelRuntime:
    """One loaded ONNX model: load once per process, warm up, then `predict` on whole batches.

    The session is created from the model's path, not its bytes: onnxruntime then reads the graph's external
    data from the model's folder (and refuses a location outside it), memory-mapped where it can, instead of
    holding a second copy of the weights. The caller verifies that folder's files first (`ServedModel.load`)."""

    def __init__(
        self,
        manifest: Manifest,
        model_path: Path,
        *,
        providers: str = "auto",
        intra_op_threads: int = 1,
        gpu_provider: GpuProvider = "cuda",
        gpu_fp16: bool = False,
        engine_cache: Path | None = None,
        io_binding: bool | None = None,
    ) -> None:
        self.manifest = manifest
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        available = ort.get_available_providers()
        gpus = gpu_count()
        # One worker per GPU (servestack/adapters/realtime.py): each opens its own device, not all device 0.
        self.device_id = worker_gpu(gpus) if CUDA in available and gpus > 1 else 0
        chosen = session_providers(
            providers,
            available,
            gpu_provider=gpu_provider,
            fp16=gpu_fp16,
            engine_cache=engine_cache or Path(tempfile.gettempdir()) / "servestack-tensorrt-engines" / manifest.key,
            gpus=gpus,
            device_id=self.device_id,
        )
        started = time.perf_counter()
        try:
            self.session = ort.InferenceSession(str(model_path), sess_options=options, providers=chosen)
        except Exception as exc:  # onnxruntime raises its own untyped errors for corrupt files
            raise ModelLoadError(f"{model_path}: onnxruntime could not load the model: {exc}") from exc
        self.load_seconds = time.perf_counter() - started
        self.providers: list[str] = list(self.session.get_providers())
        unloaded = unloaded_gpu_provider([name for name, _ in chosen], self.providers, _cuda_build())
        if unloaded is not None:
            # Readiness fails with it (ServedModel.load), rather than a GPU instance serving on its CPU.
            raise ModelLoadError(f"{model_path}: {unloaded}")
        self._check_signature(model_path)
        self._output_names = [output.name for output in manifest.outputs]
        # IO binding: where the session runs on an accelerator, `session.run` would copy each input to the device
        # inside the run and allocate the outputs anew; binding copies each input once, into an OrtValue on the
        # device, and lets onnxruntime place the outputs. `io_binding=True` binds on the CPU too (device 'cpu',
        # the same code path, which the tests run without a GPU); False never binds.
        # onnxruntime binds no string tensor ("Only binding non-string Tensors is currently supported", on the CPU
        # and on CUDA alike): a model with a string input or output (a pipeline's category column, its labels)
        # runs `session.run`, which places its numeric inputs on the device itself.
        device = binding_device(self.providers)
        bind = io_binding or (io_binding is None and device is not None)
        self.binding_device: str | None = (device or "cpu") if bind and not _has_strings(manifest) else None
        self.warmed_up = False

    def _check_signature(self, model_path: Path) -> None:
        declared = {spec.name for spec in self.manifest.inputs}
        actual = {node.name for node in self.session.get_inputs()}
        if declared != actual:
            raise ModelLoadError(
                f"{model_path}: manifest inputs {sorted(declared)} differ from the model's {sorted(actual)}"
            )
        produced = {node.name for node in self.session.get_outputs()}
        missing = [spec.name for spec in self.manifest.outputs if spec.name not in produced]
        if missing:
            raise ModelLoadError(f"{model_path}: manifest outputs {missing} are not produced by the model")

    def predict(self, inputs: Mapping[str, np.ndarray]) -> Arrays:
        """Run one batch. Inputs must already match the manifest (the codecs validate them)."""
        try:
            if self.binding_device is None:
                results = self.session.run(self._output_names, dict(inputs))
            else:
                results = self._run_bound(inputs, self.binding_device)
        except Exception as exc:  # onnxruntime's errors carry no stable type
            if caused_by_request(exc):
                raise InvalidInput(
                    f"model {self.manifest.key}: the model refused the input: {onnxruntime_message(exc)}",
                    field="inputs",
                    value=type(exc).__name__,
                    allowed="values the model's graph accepts (token ids within its vocabulary, matching lengths)",
                ) from exc
            raise InferenceError(f"model {self.manifest.key}: inference failed: {exc}") from exc
        return dict(zip(self._output_names, results, strict=True))

    def _run_bound(self, inputs: Mapping[str, np.ndarray], device: str) -> list[np.ndarray]:
        """One run through an IO binding on `device` (a model without string tensors): the inputs are copied there
        once, as OrtValues, the outputs bound there too and copied back once at the end."""
        binding = self.session.io_binding()
        for name, array in inputs.items():
            value = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), device, self.device_id)
            binding.bind_ortvalue_input(name, value)
        for spec in self.manifest.outputs:
            binding.bind_output(spec.name, device, self.device_id)
        self.session.run_with_iobinding(binding)
        # The binding's outputs come back in the order they were bound: the manifest's, as `session.run`'s.
        results: list[np.ndarray] = binding.copy_outputs_to_cpu()
        return results

    def warm_up(self, rows: int = 1) -> None:
        """Run a zero batch so the first real request does not pay for lazy initialisation."""
        sample: Arrays = {}
        for spec in self.manifest.inputs:
            shape = (rows, *[size or 1 for size in spec.row_shape])
            sample[spec.name] = (
                np.full(shape, "", dtype=object) if spec.dtype == "string" else np.zeros(shape, spec.numpy_dtype)
            )
        self.predict(sample)
        self.warmed_up = True
