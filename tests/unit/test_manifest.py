"""Model packages: manifests are validated and checksums verified before anything is loaded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from servestack.inference.errors import ChecksumMismatch, ModelLoadError
from servestack.inference.manifest import read_manifest, sha256_of, verify_checksums
from servestack.inference.service import ModelRepository, ServedModel
from servestack.inference.settings import ServingSettings
from tests.conftest import ARTIFACTS


@pytest.fixture
def digits_copy(tmp_path: Path) -> Path:
    package = tmp_path / "digits" / "1"
    shutil.copytree(ARTIFACTS / "digits" / "1", package)
    return package


@pytest.mark.parametrize("name", ["digits", "breast-cancer"])
def test_committed_manifests_match_their_model_files(name: str) -> None:
    package = ARTIFACTS / name / "1"
    manifest = read_manifest(package)
    assert manifest.sha256 == sha256_of(package / "model.onnx")
    verify_checksums(package, manifest)


def test_wrong_sha256_is_refused_with_file_expected_and_actual(digits_copy: Path) -> None:
    # GIVEN a manifest whose sha256 does not match the model file
    manifest_path = digits_copy / "manifest.json"
    document = json.loads(manifest_path.read_text())
    actual = document["sha256"]
    document["sha256"] = "0" * 64
    manifest_path.write_text(json.dumps(document))
    # WHEN the package is loaded THEN it is refused, naming the file and both digests
    with pytest.raises(ChecksumMismatch) as caught:
        ServedModel.load(digits_copy, ServingSettings(model_dir=digits_copy.parent.parent))
    message = str(caught.value)
    assert str(digits_copy / "model.onnx") in message
    assert "0" * 64 in message
    assert actual in message


def test_altered_model_bytes_are_refused(digits_copy: Path) -> None:
    with (digits_copy / "model.onnx").open("ab") as stream:
        stream.write(b"\0")
    with pytest.raises(ChecksumMismatch, match="sha256 mismatch"):
        ServedModel.load(digits_copy, ServingSettings())


def test_repository_reports_a_checksum_failure_as_its_state(digits_copy: Path) -> None:
    (digits_copy / "model.onnx").write_bytes(b"not onnx")
    repository = ModelRepository(ServingSettings(model_dir=digits_copy.parent.parent))
    with pytest.raises(ChecksumMismatch):
        repository.load_all()
    assert repository.state == "failed"
    assert repository.error is not None
    assert "sha256 mismatch" in repository.error


def test_hooks_without_a_checksum_are_refused(digits_copy: Path) -> None:
    (digits_copy / "process.py").write_text("def preprocess(payload, content_type):\n    return payload\n")
    with pytest.raises(ChecksumMismatch, match="process_sha256"):
        verify_checksums(digits_copy, read_manifest(digits_copy))


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"sha256": "short"}, "sha256"),
        ({"inputs": []}, "inputs"),
        ({"prediction_output": "nope"}, "prediction_output"),
        ({"surprise": 1}, "surprise"),
        # a hand-edited image or class role is refused at load as at push
        ({"image": {"input": "input", "layout": "NCHW", "crop": [8, 8]}}, r"image: input 'input' is \[None, 64\]"),
        ({"image": {"input": "pixels", "layout": "NCHW", "crop": [8, 8]}}, "image.input: 'pixels' is not one of"),
        ({"logits_output": "nope"}, "logits_output"),
        ({"logits_output": "label"}, r"logits_output: 'label' is int64 \[None\], not float"),
        ({"top_k": 11}, "top_k: 11, but 'probabilities' has 10 classes"),
    ],
)
def test_invalid_manifest_names_the_field(digits_copy: Path, change: dict[str, object], expected: str) -> None:
    manifest_path = digits_copy / "manifest.json"
    manifest_path.write_text(json.dumps({**json.loads(manifest_path.read_text()), **change}))
    with pytest.raises(ModelLoadError, match=expected):
        read_manifest(digits_copy)


def test_missing_manifest_says_what_a_package_needs(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"manifest\.json"):
        read_manifest(tmp_path)
