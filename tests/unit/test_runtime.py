"""onnxruntime sessions: provider choice, warmup, batch prediction, versions and readiness."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from servestack.inference.errors import ConfigurationError, ModelLoadError, ModelNotFound, ModelNotReady
from servestack.inference.providers import (
    CPU,
    CUDA,
    TENSORRT,
    binding_device,
    choose_providers,
    session_providers,
    unloaded_gpu_provider,
)
from servestack.inference.service import ModelRepository
from servestack.inference.settings import ServingSettings
from tests.conftest import ARTIFACTS


def test_auto_prefers_cuda_when_onnxruntime_offers_it_and_a_gpu_is_visible() -> None:
    assert choose_providers("auto", [CUDA, CPU], gpus=1) == [CUDA, CPU]


def test_auto_takes_the_cpu_where_a_cuda_build_sees_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN the GPU image's onnxruntime (it lists CUDA) on a machine whose driver exposes no GPU
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    # THEN auto asks for the CPU alone: CUDA asked for there logs an error before falling back
    assert choose_providers("auto", [CUDA, CPU]) == [CPU]
    assert choose_providers("auto", [CUDA, CPU], gpus=0) == [CPU]


def test_auto_falls_back_to_cpu_without_cuda() -> None:
    assert choose_providers("auto", ["AzureExecutionProvider", CPU]) == [CPU]


def test_explicit_providers_are_kept_in_order() -> None:
    assert choose_providers(f"{CPU}", [CUDA, CPU]) == [CPU]


def test_unknown_provider_lists_the_available_ones() -> None:
    with pytest.raises(ConfigurationError) as caught:
        choose_providers("TensorrtExecutionProvider", [CPU])
    assert caught.value.allowed is not None
    assert CPU in caught.value.allowed


ENGINES = Path("/tmp/servestack-tensorrt-engines/digits/1")
CUDA_OPTIONS = {"use_tf32": "0"}  # float32 math, as on the CPU


def test_a_session_asked_for_cuda_that_came_back_on_the_cpu_is_refused_saying_how_to_run_on_the_cpu() -> None:
    # GIVEN a session asked for CUDA whose providers came back without it (onnxruntime logs the library it could
    # not load, a CUDA 12 one under a CUDA 13 build say, and falls back to the CPU without raising)
    why = unloaded_gpu_provider([CUDA, CPU], [CPU], cuda_build="13.0")

    # THEN that is a refusal: the CUDA provider did not load, likely a library mismatch, and how to choose the CPU
    assert why is not None
    assert "onnxruntime did not load the CUDA execution provider it was asked for" in why
    assert "would run on CPUExecutionProvider" in why
    assert "likely a CUDA/cuDNN library mismatch" in why
    assert "(this onnxruntime was built for CUDA 13.0)" in why
    assert why.endswith("To run on the CPU deliberately, set SERVESTACK_PROVIDERS=CPUExecutionProvider")
    # AND TensorRT asked for before CUDA changes nothing: losing CUDA is refused, with or without TensorRT
    assert unloaded_gpu_provider([TENSORRT, CUDA, CPU], [CPU]) is not None
    assert "built for" not in (unloaded_gpu_provider([CUDA, CPU], [CPU]) or "")


@pytest.mark.parametrize(
    ("chosen", "loaded"),
    [
        ([CUDA, CPU], [CUDA, CPU]),  # CUDA loaded
        ([TENSORRT, CUDA, CPU], [TENSORRT, CUDA, CPU]),
        ([TENSORRT, CUDA, CPU], [CUDA, CPU]),  # TensorRT's libraries absent: CUDA serves (docs/realtime.md)
        ([CPU], [CPU]),  # the CPU chosen: auto without a visible GPU, or SERVESTACK_PROVIDERS=CPUExecutionProvider
    ],
)
def test_a_session_with_the_cuda_it_was_asked_for_or_never_asked_for_it_is_kept(
    chosen: list[str], loaded: list[str]
) -> None:
    assert unloaded_gpu_provider(chosen, loaded) is None


def test_on_a_laptop_the_gpu_images_environment_picks_the_cpu_and_nothing_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN `local up` running the GPU image's setting (SERVESTACK_PROVIDERS=auto) where no GPU is visible, with a
    # CUDA build of onnxruntime (it lists CUDA whether or not there is a GPU)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    chosen = [name for name, _ in session_providers("auto", [TENSORRT, CUDA, CPU], engine_cache=ENGINES)]

    # THEN auto asks for the CPU alone, and the session's CPU is what was asked for
    assert chosen == [CPU]
    assert unloaded_gpu_provider(chosen, [CPU]) is None


TRT_OPTIONS = {"trt_engine_cache_enable": "True", "trt_engine_cache_path": str(ENGINES), "trt_fp16_enable": "True"}


def test_tensorrt_goes_before_cuda_with_its_engine_cache_and_fp16() -> None:
    # GIVEN the GPU image's onnxruntime (TensorRT, CUDA, CPU) on a GPU, and `gpu: {provider: tensorrt, fp16: true}`
    chosen = session_providers(
        "auto", [TENSORRT, CUDA, CPU], gpu_provider="tensorrt", fp16=True, engine_cache=ENGINES, gpus=1
    )
    # THEN TensorRT comes first, caching its engines and allowed float16, then CUDA, then the CPU
    assert chosen == [(TENSORRT, TRT_OPTIONS), (CUDA, CUDA_OPTIONS), (CPU, {})]
    assert binding_device([name for name, _ in chosen]) == "cuda"


def test_tensorrt_is_asked_for_only_with_cuda_and_where_onnxruntime_offers_it() -> None:
    # GIVEN `provider: tensorrt`: without a GPU the CPU serves alone, and a build without TensorRT serves on CUDA
    cpu_only = session_providers("auto", [TENSORRT, CUDA, CPU], gpu_provider="tensorrt", engine_cache=ENGINES, gpus=0)
    assert cpu_only == [(CPU, {})]
    assert binding_device([name for name, _ in cpu_only]) is None
    no_trt = session_providers("auto", [CUDA, CPU], gpu_provider="tensorrt", engine_cache=ENGINES, gpus=1)
    assert no_trt == [(CUDA, CUDA_OPTIONS), (CPU, {})]
    # AND the default (`cuda`) never adds TensorRT, fp16 off where it is named in the explicit list
    default = session_providers("auto", [TENSORRT, CUDA, CPU], engine_cache=ENGINES, gpus=1)
    assert default == [(CUDA, CUDA_OPTIONS), (CPU, {})]
    named = session_providers(f"{TENSORRT},{CPU}", [TENSORRT, CUDA, CPU], engine_cache=ENGINES)
    assert named == [(TENSORRT, {**TRT_OPTIONS, "trt_fp16_enable": "False"}), (CPU, {})]


def test_the_gpu_provider_setting_is_read_from_the_environment() -> None:
    settings = ServingSettings.from_environment({"SERVESTACK_GPU_PROVIDER": "tensorrt", "SERVESTACK_GPU_FP16": "1"})
    assert (settings.gpu_provider, settings.gpu_fp16) == ("tensorrt", True)
    with pytest.raises(ConfigurationError) as caught:
        ServingSettings.from_environment({"SERVESTACK_GPU_PROVIDER": "openvino"})
    assert caught.value.field == "SERVESTACK_GPU_PROVIDER"


@pytest.fixture(scope="module")
def repository() -> ModelRepository:
    repository = ModelRepository(ServingSettings(model_dir=ARTIFACTS))
    repository.load_all()
    return repository


def test_every_bundled_model_loads_warm_on_cpu_here(repository: ModelRepository) -> None:
    names = sorted(model.manifest.name for model in repository.models())
    assert names == ["breast-cancer", "digits"]
    assert all(model.runtime.warmed_up for model in repository.models())
    assert all(model.runtime.providers == [CPU] for model in repository.models())


def test_predict_runs_a_whole_batch(repository: ModelRepository, digits: tuple[np.ndarray, np.ndarray]) -> None:
    features, _ = digits
    outputs = repository.get("digits").predict({"input": features[:128]})
    assert outputs["label"].shape == (128,)
    assert outputs["probabilities"].shape == (128, 10)
    np.testing.assert_allclose(outputs["probabilities"].sum(axis=1), 1.0, rtol=1e-5)


def test_unknown_model_and_version_list_what_is_served(repository: ModelRepository) -> None:
    with pytest.raises(ModelNotFound) as caught:
        repository.get("fraud")
    assert caught.value.allowed == "breast-cancer, digits"
    with pytest.raises(ModelNotFound, match="no version '7'"):
        repository.get("digits", "7")


@pytest.mark.parametrize("target", ["digits", "digits@1", "digits/1", "digits/1.tar.gz", "digits.tar.gz", None, ""])
def test_target_model_forms_resolve(repository: ModelRepository, target: str | None) -> None:
    assert repository.resolve(target).manifest.key == "digits@1"


def test_newest_version_is_the_default(tmp_path: Path) -> None:
    for version in ("2", "10"):
        target = tmp_path / "digits" / version
        shutil.copytree(ARTIFACTS / "digits" / "1", target)
        manifest = (target / "manifest.json").read_text().replace('"version": "1"', f'"version": "{version}"')
        (target / "manifest.json").write_text(manifest)
    repository = ModelRepository(ServingSettings(model_dir=tmp_path))
    repository.load_all()
    assert repository.get("digits").manifest.version == "10"


def test_not_ready_before_loading() -> None:
    repository = ModelRepository(ServingSettings(model_dir=ARTIFACTS))
    with pytest.raises(ModelNotReady):
        repository.get("digits")


def test_empty_model_dir_is_a_load_error(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no model packages"):
        ModelRepository(ServingSettings(model_dir=tmp_path)).load_all()


def test_default_model_must_be_served() -> None:
    with pytest.raises(ModelLoadError, match="default_model"):
        ModelRepository(ServingSettings(model_dir=ARTIFACTS, default_model="fraud")).load_all()


def test_a_batch_job_loads_only_the_model_it_scores(tmp_path: Path) -> None:
    # GIVEN a folder of two models, one of them broken (a batch job's bundle may carry more than its own)
    shutil.copytree(ARTIFACTS / "digits", tmp_path / "digits")
    shutil.copytree(ARTIFACTS / "breast-cancer", tmp_path / "breast-cancer")
    (tmp_path / "digits" / "1" / "model.onnx").write_bytes(b"not the model its checksum names")

    # WHEN only breast-cancer is asked for (the job's model is not the folder's default)
    repository = ModelRepository(ServingSettings(model_dir=tmp_path, default_model="digits"))
    repository.load_all(only="breast-cancer")

    # THEN it alone was loaded and verified, and it is ready
    assert [model.manifest.key for model in repository.models()] == ["breast-cancer@1"]
    assert repository.resolve("breast-cancer").manifest.key == "breast-cancer@1"
    # AND a name with no package loads them all, so the broken one fails the load as it always did
    with pytest.raises(ModelLoadError):
        ModelRepository(ServingSettings(model_dir=tmp_path, default_model="digits")).load_all(only="fraud")


def test_single_package_layout_as_sagemaker_mounts_it() -> None:
    repository = ModelRepository(ServingSettings(model_dir=ARTIFACTS / "digits" / "1"))
    repository.load_all()
    assert [model.manifest.key for model in repository.models()] == ["digits@1"]
