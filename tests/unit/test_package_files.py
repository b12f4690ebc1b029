"""A model package carries its files: the ONNX external data found beside the model, and the files named with
`--file` (a vocabulary, labels, a tokenizer's folder). Each is listed in the manifest with its sha256 and size,
verified at every load, and carried by every copy of the package: the registry's, its multi-model archive,
SageMaker's model data, a Lambda bundle's sources and an image context. A push that fails names the user's own
files, never the scratch folder the package is built in. (The same with a 105 MB model, pushed by the command
and served by the realtime container and the Lambda handler: tests/functional/test_external_data.py.)"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from servestack.inference.errors import ChecksumMismatch, InvalidInput, ModelLoadError, VersionConflict
from servestack.inference.manifest import PackageFile, package_files, read_manifest
from servestack.inference.multi_model import MultiModelStore
from servestack.inference.package_files import gather_files
from servestack.inference.packaging import build_package
from servestack.inference.registry import DirectoryStore, ModelRegistry
from servestack.inference.service import ServedModel
from servestack.inference.settings import ServingSettings
from tests.conftest import REPO_ROOT
from tests.external_data_model import ExternalDataModel, write_external_data_model

SETTINGS = ServingSettings(providers="CPUExecutionProvider")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def predictions(model: ServedModel, rows: np.ndarray) -> np.ndarray:
    body = json.dumps({"instances": rows.tolist()}).encode()
    return np.array(json.loads(model.infer(body, "application/json", None).body)["predictions"], np.float32)


@pytest.fixture
def exported(tmp_path: Path) -> ExternalDataModel:
    """What an exporter leaves in the user's folder: `model.onnx` and `model.onnx.data` beside it."""
    return write_external_data_model(tmp_path / "export")


@pytest.fixture
def package(exported: ExternalDataModel, tmp_path: Path) -> Path:
    build_package(exported.onnx_file, tmp_path / "affine" / "1", name="affine", version="1")
    return tmp_path / "affine" / "1"


# ------------------------------------------------------------------------------------------ external data


def test_external_data_beside_the_model_is_found_listed_and_served_exactly(
    exported: ExternalDataModel, package: Path
) -> None:
    # GIVEN a model whose weights are in model.onnx.data, packaged with no flag naming the data file
    manifest = read_manifest(package)
    # THEN the manifest lists the data file, as external data, with its checksum and size
    data = exported.data_file
    assert manifest.files == (
        PackageFile(name=data.name, sha256=sha256(data), size=data.stat().st_size, external_data=True),
    )
    assert (package / data.name).read_bytes() == data.read_bytes()
    # AND the package answers what numpy computes from the same weights
    rows = exported.rows()
    model = ServedModel.load(package, SETTINGS)
    np.testing.assert_array_equal(predictions(model, rows), exported.expected(rows))


@pytest.mark.parametrize("damage", ["one byte changed", "truncated"])
def test_a_damaged_data_file_is_a_checksum_mismatch_naming_it(package: Path, damage: str) -> None:
    # GIVEN a package whose external data file was changed after the push
    data = package / "model.onnx.data"
    raw = bytearray(data.read_bytes())
    if damage == "one byte changed":
        raw[len(raw) // 2] ^= 0x01
    else:
        del raw[-4:]
    data.write_bytes(bytes(raw))
    # WHEN it loads THEN it is refused before any session is made, naming the file
    with pytest.raises(ChecksumMismatch) as refused:
        ServedModel.load(package, SETTINGS)
    assert str(data) in refused.value.message


def test_a_listed_file_missing_refuses_the_package_in_every_copy(package: Path, tmp_path: Path) -> None:
    from servestack.cdk.realtime import model_data_archive
    from servestack.cdk.sources import package_members
    from servestack.spec import ModelSpec

    # GIVEN a package that lost its data file
    (package / "model.onnx.data").unlink()
    # THEN loading it, copying it into a registry, a bundle or SageMaker's model data each refuses it, naming it
    with pytest.raises(ModelLoadError, match=r"model\.onnx\.data"):
        ServedModel.load(package, SETTINGS)
    with pytest.raises(ModelLoadError, match=r"model\.onnx\.data"):
        package_files(package, read_manifest(package))
    with pytest.raises(ModelLoadError, match=r"model\.onnx\.data"):
        ModelRegistry(DirectoryStore(tmp_path / "registry")).push_package(package)
    with pytest.raises(FileNotFoundError, match=r"model\.onnx\.data"):
        package_members(package)
    spec = ModelSpec(name="affine", version="1", path=str(package.relative_to(tmp_path)))
    with pytest.raises(FileNotFoundError, match=r"model\.onnx\.data"):
        model_data_archive(tmp_path, [spec], cache_dir=tmp_path / "model-data")


def test_the_registry_its_archive_and_its_fetch_carry_the_data_file(
    exported: ExternalDataModel, tmp_path: Path
) -> None:
    # GIVEN a registry, and the exported model pushed to it with one call
    registry = ModelRegistry(DirectoryStore(tmp_path / "registry"))
    pushed = registry.push(exported.onnx_file, name="affine")
    # THEN the version's files and its multi-model archive hold the data file, byte for byte
    data = exported.data_file.read_bytes()
    assert (tmp_path / "registry" / "affine" / "1" / "model.onnx.data").read_bytes() == data
    with tarfile.open(tmp_path / "registry" / "affine" / "1.tar.gz") as archive:
        member = archive.extractfile("model.onnx.data")
        assert member is not None
        assert member.read() == data
    # AND a fetch brings it back, verified, and the fetched package answers
    fetched = registry.fetch("affine", pushed.manifest.version, tmp_path / "cache")
    rows = exported.rows()
    np.testing.assert_array_equal(predictions(ServedModel.load(fetched, SETTINGS), rows), exported.expected(rows))


def test_pushing_a_present_version_again_puts_back_a_file_the_store_lost(package: Path, tmp_path: Path) -> None:
    # GIVEN a registry whose copy of a version lost its data file (an emulator's state restored in part)
    registry = ModelRegistry(DirectoryStore(tmp_path / "registry"))
    registry.push_package(package)
    lost = tmp_path / "registry" / "affine" / "1" / "model.onnx.data"
    lost.unlink()
    # WHEN the same package is pushed again (local up seeds its registry at every start)
    again = registry.push_package(package)
    # THEN nothing is created, the file is back, and the version fetches and verifies
    assert not again.created
    assert lost.read_bytes() == (package / "model.onnx.data").read_bytes()
    registry.fetch("affine", "1", tmp_path / "cache")


def test_a_version_pushed_again_with_other_files_is_a_conflict(exported: ExternalDataModel, tmp_path: Path) -> None:
    registry = ModelRegistry(DirectoryStore(tmp_path / "registry"))
    registry.push(exported.onnx_file, name="affine", version="1")
    labels = tmp_path / "labels.txt"
    labels.write_text("a\nb\n")
    with pytest.raises(VersionConflict):
        registry.push(exported.onnx_file, name="affine", version="1", files=[labels])


def test_the_multi_model_container_loads_the_extracted_archive_with_its_data(
    exported: ExternalDataModel, tmp_path: Path
) -> None:
    # GIVEN the version's archive extracted as SageMaker extracts a TargetModel
    registry = ModelRegistry(DirectoryStore(tmp_path / "registry"))
    registry.push(exported.onnx_file, name="affine", version="1")
    root = tmp_path / "models"
    with tarfile.open(tmp_path / "registry" / "affine" / "1.tar.gz") as archive:
        archive.extractall(root / "m1" / "model", filter="data")
    store = MultiModelStore(
        ServingSettings(providers="CPUExecutionProvider", multi_model_root=root, multi_model_state_dir=str(tmp_path))
    )
    try:
        # WHEN the container is told to load it
        store.load_model("m1", str(root / "m1" / "model"))
        # THEN its cost counts the external data, and it answers exactly
        (record,) = store._records()
        assert record.cost_bytes >= exported.data_file.stat().st_size
        rows = exported.rows()
        np.testing.assert_array_equal(predictions(store.resolve("m1"), rows), exported.expected(rows))
    finally:
        store.close()


# ------------------------------------------------------------------------------------------ push errors


def push(argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, cwd: Path) -> str:
    """`servestack models push ...` in this process; its stderr (the exit code must be a failure's)."""
    from servestack.cli.main import main

    for variable in ("SERVESTACK_REGISTRY_URI", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.chdir(cwd)
    code = main(["models", "push", *argv, "--name", "m", "--artifacts", str(cwd / "artifacts")])
    err = capsys.readouterr().err
    assert code != 0, err
    return err


@pytest.mark.parametrize("fault", ["data file missing", "data file truncated", "not onnx", "hook fails to import"])
def test_a_push_error_names_the_users_file_never_a_scratch_path(
    exported: ExternalDataModel,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    fault: str,
) -> None:
    # GIVEN a model (or hook) of the user's with something wrong
    argv = [str(exported.onnx_file)]
    named = exported.onnx_file
    if fault == "data file missing":
        exported.data_file.unlink()
        named = exported.data_file
    elif fault == "data file truncated":
        exported.data_file.write_bytes(exported.data_file.read_bytes()[:100])
    elif fault == "not onnx":
        exported.onnx_file.write_bytes(b"these are not the bytes of a model")
    else:
        named = tmp_path / "my_hooks.py"
        named.write_text("import a_module_nobody_has\n")
        argv += ["--process", str(named)]
    # WHEN it is pushed
    err = push(argv, capsys, monkeypatch, tmp_path)
    # THEN the error names the user's file, and nothing of the folder the package was built in
    assert str(named) in err
    assert "servestack-push" not in err
    assert "<package>" not in err
    assert "onnxruntime_src" not in err
    assert "[ONNXRuntimeError]" not in err
    assert not (tmp_path / "artifacts" / "m").exists()


def test_an_external_data_location_outside_the_models_folder_is_refused(
    exported: ExternalDataModel, tmp_path: Path
) -> None:
    import onnx

    # GIVEN a graph whose tensor is read from ../weights.bin
    model = onnx.load(str(exported.onnx_file), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "../weights.bin"
    shutil.copyfile(exported.data_file, tmp_path / "weights.bin")
    onnx.save_model(model, str(exported.onnx_file))
    # WHEN it is packaged THEN it is refused, naming the model and the location
    with pytest.raises(ModelLoadError) as refused:
        build_package(exported.onnx_file, tmp_path / "package", name="m", version="1")
    assert str(exported.onnx_file) in refused.value.message
    assert "../weights.bin" in refused.value.message


# ------------------------------------------------------------------------------------------ named files

WORDS = ("good", "great", "fine", "bad", "awful", "poor")
HOOK = """
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent  # the package folder: its files are beside the hook, verified before it loads
VOCABULARY = HERE.joinpath("vocab.txt").read_text(encoding="utf-8").split()
LABELS = HERE.joinpath("labels", "labels.txt").read_text(encoding="utf-8").split()


def preprocess(payload, content_type):
    counts = np.zeros((len(payload["texts"]), len(VOCABULARY)), np.float32)
    for row, text in enumerate(payload["texts"]):
        for word in text.lower().split():
            if word in VOCABULARY:
                counts[row, VOCABULARY.index(word)] += 1
    return counts


def postprocess(outputs):
    return {"sentiment": [LABELS[int(i)] for i in outputs["scores"].argmax(axis=1)]}
"""
TEXTS = {"texts": ["good great fine", "awful poor day", "good but bad bad"]}
ANSWER = ["positive", "negative", "negative"]


def write_words_model(folder: Path) -> dict[str, Path]:
    """A bag-of-words classifier (6 words -> 2 scores), its hook, a vocabulary and a folder of labels."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    folder.mkdir(parents=True, exist_ok=True)
    weights = np.array([[1, -1]] * 3 + [[-1, 1]] * 3, np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["counts", "W"], ["scores"])],
        "words",
        [helper.make_tensor_value_info("counts", TensorProto.FLOAT, [None, len(WORDS)])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [None, 2])],
        [numpy_helper.from_array(weights, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save_model(model, str(folder / "words.onnx"))
    (folder / "process.py").write_text(HOOK, encoding="utf-8")
    (folder / "vocab.txt").write_text("\n".join(WORDS) + "\n", encoding="utf-8")
    (folder / "labels").mkdir()
    (folder / "labels" / "labels.txt").write_text("positive\nnegative\n", encoding="utf-8")
    (folder / "labels" / ".DS_Store").write_bytes(b"\0")  # what a folder picks up: left out
    (folder / "request.json").write_text(json.dumps(TEXTS), encoding="utf-8")
    return {name: folder / name for name in ("words.onnx", "process.py", "vocab.txt", "labels", "request.json")}


def answer(package: Path) -> list[str]:
    model = ServedModel.load(package, SETTINGS)
    body: dict[str, Any] = json.loads(model.infer(json.dumps(TEXTS).encode(), "application/json", None).body)
    return list(body["sentiment"])


def test_a_hook_reads_its_vocabulary_in_the_registry_copy_the_lambda_bundle_and_the_image(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from servestack.cdk.bundling import lambda_source
    from servestack.cdk.images import image_context
    from servestack.cli.main import main

    # GIVEN a project, and a model whose hook reads a vocabulary file and a labels folder beside itself
    project = tmp_path / "project"
    project.mkdir()
    (project / "serving.yaml").write_text("models: []\ndeployments: {}\n", encoding="utf-8")
    files = write_words_model(tmp_path / "work")
    monkeypatch.delenv("SERVESTACK_REGISTRY_URI", raising=False)
    monkeypatch.chdir(project)
    # WHEN it is pushed with one command, naming the file and the folder
    code = main(
        [
            "models", "push", str(files["words.onnx"]), "--name", "words",
            "--process", str(files["process.py"]), "--sample", str(files["request.json"]),
            "--file", str(files["vocab.txt"]), "--file", str(files["labels"]),
        ]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert "vocab.txt" in out
    assert "labels/labels.txt" in out
    # THEN the manifest lists both files (the folder's hidden file left out), and the package answers by them
    package = project / "models" / "artifacts" / "words" / "1"
    listed = {entry.name: entry for entry in read_manifest(package).files}
    assert sorted(listed) == ["labels/labels.txt", "vocab.txt"]
    assert listed["vocab.txt"].sha256 == sha256(files["vocab.txt"])
    assert not listed["vocab.txt"].external_data
    assert answer(package) == ANSWER
    # AND the registry's copy (the project's artifacts are one), its fetch, the Lambda bundle's sources and the
    # image context each carry them, byte for byte, and answer the same
    registry = ModelRegistry(DirectoryStore(project / "models" / "artifacts"))
    fetched = registry.fetch("words", "1", tmp_path / "cache")
    source = lambda_source(
        entry_points=REPO_ROOT / "handlers", artifacts=["models/artifacts/words/1"], artifacts_root=project,
        cache_dir=tmp_path / "staged",
    )  # fmt: skip
    context = image_context(
        flavour="cpu", entry_points=REPO_ROOT / "handlers", artifacts_root=project,
        artifacts=["models/artifacts/words/1"], cache_dir=tmp_path / "staged",
    )  # fmt: skip
    for copy in (fetched, source / "models/artifacts/words/1", context / "models/artifacts/words/1"):
        for name in ("vocab.txt", "labels/labels.txt"):
            assert sha256(copy / name) == sha256(package / name), (copy, name)
        assert not (copy / "labels" / ".DS_Store").exists()
        assert answer(copy) == ANSWER


def test_the_bundle_and_image_carry_the_packages_files_and_not_a_stray_one(tmp_path: Path) -> None:
    from servestack.cdk.sources import package_files as staged_files

    # GIVEN a package folder holding a file no manifest lists (put there by hand)
    files = write_words_model(tmp_path / "work")
    package = tmp_path / "models" / "artifacts" / "words" / "1"
    build_package(
        files["words.onnx"], package, name="words", version="1", process_file=files["process.py"],
        sample=files["request.json"], files=gather_files([files["vocab.txt"], files["labels"]]),
    )  # fmt: skip
    (package / "notes.txt").write_text("mine", encoding="utf-8")
    # THEN what a bundle or image stages is the package's files, as the registry carries them, and not the stray one
    staged = sorted(name for name, _ in staged_files(tmp_path, ["models/artifacts/words/1"]))
    prefix = "models/artifacts/words/1/"
    assert staged == [
        prefix + name
        for name in sorted(
            [
                "manifest.json", "model.onnx", "process.py", "vocab.txt", "labels/labels.txt",
                "sample-request.json", "sample-response.json",
            ]
        )
    ]  # fmt: skip


def test_sagemaker_model_data_holds_the_listed_files(tmp_path: Path) -> None:
    from servestack.cdk.realtime import model_data_archive
    from servestack.spec import ModelSpec

    files = write_words_model(tmp_path / "work")
    build_package(
        files["words.onnx"], tmp_path / "models" / "artifacts" / "words" / "1", name="words", version="1",
        process_file=files["process.py"], sample=files["request.json"],
        files=gather_files([files["vocab.txt"], files["labels"]]),
    )  # fmt: skip
    archive = model_data_archive(tmp_path, [ModelSpec(name="words", version="1")], cache_dir=tmp_path / "data")
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert "words/1/vocab.txt" in names
    assert "words/1/labels/labels.txt" in names
    # AND it is reproducible: the same package, the same bytes
    again = model_data_archive(tmp_path, [ModelSpec(name="words", version="1")], cache_dir=tmp_path / "again")
    assert archive.read_bytes() == again.read_bytes()


def test_gather_files_keeps_a_folder_as_a_folder_and_names_what_it_refuses(tmp_path: Path) -> None:
    files = write_words_model(tmp_path / "work")
    (files["labels"] / "__pycache__").mkdir()
    (files["labels"] / "__pycache__" / "x.pyc").write_bytes(b"\0")
    gathered = gather_files([files["vocab.txt"], files["labels"]])
    assert gathered == {"vocab.txt": files["vocab.txt"], "labels/labels.txt": files["labels"] / "labels.txt"}
    for bad, said in (
        (tmp_path / "nothing.txt", "no such file or folder"),
        (tmp_path / "my words.txt", "cannot be a file of a model package"),
        (tmp_path / "manifest.json", "cannot be a file of a model package"),
    ):
        if bad.name != "nothing.txt":
            bad.write_text("x")
        with pytest.raises(InvalidInput) as refused:
            gather_files([bad])
        assert str(bad) in refused.value.message
        assert said in refused.value.message
    other = tmp_path / "other"
    other.mkdir()
    (other / "vocab.txt").write_text("different")
    with pytest.raises(InvalidInput, match="one file of each name"):
        gather_files([files["vocab.txt"], other / "vocab.txt"])


@pytest.mark.parametrize(
    "files",
    [
        [{"name": "../x", "sha256": "0" * 64, "size": 1}],
        [{"name": "/etc/passwd", "sha256": "0" * 64, "size": 1}],
        [{"name": ".hidden", "sha256": "0" * 64, "size": 1}],
        [{"name": "process.py", "sha256": "0" * 64, "size": 1}],
        [{"name": "model.onnx", "sha256": "0" * 64, "size": 1}],
        [{"name": "a", "sha256": "0" * 64, "size": 1}, {"name": "a", "sha256": "1" * 64, "size": 1}],
        [{"name": "a", "sha256": "0" * 64, "size": 1}, {"name": "a/b", "sha256": "1" * 64, "size": 1}],
        [{"name": "a", "sha256": "0" * 64, "size": -1}],
    ],
)
def test_a_manifest_listing_an_unsafe_or_clashing_file_is_refused(
    package: Path, files: list[dict[str, object]]
) -> None:
    manifest = package / "manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "files": files}))
    with pytest.raises(ModelLoadError, match="files"):
        read_manifest(package)


def test_a_manifest_that_names_hooks_which_are_gone_is_refused(package: Path) -> None:
    manifest = package / "manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "process_sha256": "0" * 64}))
    with pytest.raises(ModelLoadError, match=r"process\.py"):
        ServedModel.load(package, SETTINGS)


def test_packages_without_listed_files_keep_their_manifests_byte_for_byte() -> None:
    # The bundled packages were written before `files` existed: their manifests have no such key, and the
    # manifest a push writes for a model without files has none either (omitted when empty).
    from tests.conftest import ARTIFACTS

    for name in ("digits", "breast-cancer"):
        raw = (ARTIFACTS / name / "1" / "manifest.json").read_bytes()
        assert b'"files"' not in raw
        assert read_manifest(ARTIFACTS / name / "1").to_json() == raw


def test_the_archive_streams_each_file_once(package: Path) -> None:
    # The registry's archive is the same bytes whether or not a file is read whole (tar headers, no mtimes).
    from servestack.inference.registry import package_archive

    files = package_files(package, read_manifest(package))
    first = package_archive(package, files)
    with tarfile.open(fileobj=io.BytesIO(first)) as tar:
        assert sorted(tar.getnames()) == sorted(files)
    assert package_archive(package, list(reversed(files))) == first
