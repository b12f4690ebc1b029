"""Batch inputs beyond rows of one tensor (issue 36), on a real S3 endpoint:

- binary files (images, raw bytes, text, audio) under the input prefix, one record each, handed to the model's
  `preprocess` hook with the media type their name suggests; each output row names its file; a file the hook
  refuses is an error row with the reason, so every file is accounted for;
- JSON Lines whose lines are row objects of several tensor inputs (`input_ids`, `attention_mask`), scored
  without a hook, ragged sequences padded per the manifest's pad value, across lines, blocks and files alike;
- `servestack local put-input` takes any file, and `--download` keys a file's row by the file.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from servestack.adapters.batch import BatchSettings, run_batch
from servestack.inference import media_types
from servestack.inference.packaging import build_package
from servestack.inference.push_sequences import sequence_options
from servestack.inference.service import ServedModel
from servestack.inference.settings import ServingSettings
from servestack.local.batch.data import merged_rows
from tests.conftest import raw_digits_models
from tests.functional.test_raw_bodies import PIXEL_SCALE, jpeg, png, wav
from tests.integration.conftest import Aws
from tests.integration.resources import ensure_bucket
from tests.token_model import write_token_model

pytestmark = pytest.mark.localstack
SERVESTACK = str(Path(sys.executable).parent / "servestack")


def settings(bucket: str, model: str, **extra: Any) -> BatchSettings:
    return BatchSettings(deployment="t", bucket=bucket, input_prefix="in/", output_prefix="out/", model=model, **extra)


def read(aws: Aws, bucket: str, key: str) -> bytes:
    return bytes(aws.s3.get_object(Bucket=bucket, Key=key)["Body"].read())


def scored(aws: Aws, bucket: str, manifest: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        json.loads(line) for part in manifest["parts"] for line in read(aws, bucket, f"out/{part['key']}").splitlines()
    ]


def errors(aws: Aws, bucket: str, manifest: dict[str, Any]) -> list[dict[str, Any]]:
    if not manifest["errors"]:
        return []
    return [json.loads(line) for line in read(aws, bucket, "out/errors.jsonl").splitlines()]


# ------------------------------------------------------------------------------------------ binary files


@pytest.fixture(scope="module")
def digit_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return raw_digits_models(tmp_path_factory.mktemp("batch-files"))


@pytest.fixture
def models(monkeypatch: pytest.MonkeyPatch, digit_models: Path) -> Path:
    monkeypatch.setenv("SERVESTACK_MODEL_DIR", str(digit_models))
    monkeypatch.setenv("SERVESTACK_DEFAULT_MODEL", "raw-digits")
    return digit_models


def digits_answers(model_dir: Path, rows: np.ndarray) -> list[Any]:
    """What the plain digits model predicts for these rows sent as JSON."""
    model = ServedModel.load(model_dir / "digits" / "1", ServingSettings(model_dir=model_dir, warmup=False))
    body = json.dumps({"instances": rows.tolist()}).encode()
    predictions: list[Any] = json.loads(model.infer(body, media_types.JSON, media_types.JSON).body)["predictions"]
    return predictions


def test_each_binary_file_is_one_record_for_the_hook(
    aws: Aws, unique: str, models: Path, digits: tuple[np.ndarray, np.ndarray]
) -> None:
    features, _ = digits
    # GIVEN images, raw pixels and text under the input prefix (one digit each), beside a file the hook refuses
    # (audio/x-wav: the hook reads audio/wav only), a file that is no image, and a folder marker
    ensure_bucket(aws.s3, unique)
    files = {
        "in/digits/0.png": png(features[0]),
        "in/digits/1.png": png(features[1]),
        "in/digits/2.bin": (features[2] * PIXEL_SCALE).astype(np.uint8).tobytes(),
        "in/digits/3.txt": " ".join(str(int(value)) for value in features[3]).encode(),
        "in/digits/4.jpg": jpeg(features[4]),
        "in/digits/5.wav": wav(features[5:6]),
        "in/digits/6.png": b"not an image",
    }
    for key, body in files.items():
        aws.s3.put_object(Bucket=unique, Key=key, Body=body)
    aws.s3.put_object(Bucket=unique, Key="in/digits/", Body=b"")
    # WHEN a batch job runs over the prefix, in chunks of 2 files
    manifest = run_batch(settings(unique, "raw-digits", chunk_rows=2))
    # THEN every file is accounted for: five scored, two error rows
    assert manifest["rows"] == {"total": 7, "succeeded": 5, "failed": 2}
    assert [entry["key"] for entry in manifest["inputs"]] == sorted(files)
    rows = scored(aws, unique, manifest)
    # AND each output row names its file (the object key is its id), one line each
    assert [(row["file"], row["line"]) for row in rows] == [(key, 1) for key in sorted(files)[:5]]
    # AND the hook read each file as its type says: the lossless ones answer as the digits model does for the rows
    lossless = digits_answers(models, features[:4])
    assert [row["prediction"] for row in rows[:4]] == lossless
    # AND the refused files carry the hook's reason
    refused = {error["file"]: error["error"]["message"] for error in errors(aws, unique, manifest)}
    assert set(refused) == {"in/digits/5.wav", "in/digits/6.png"}
    assert "not audio/x-wav" in refused["in/digits/5.wav"]
    assert "not an image" in refused["in/digits/6.png"]


def test_a_file_the_hook_reads_as_several_rows_is_an_error_row(aws: Aws, unique: str, models: Path) -> None:
    # GIVEN raw pixels of three digits in one file
    ensure_bucket(aws.s3, unique)
    aws.s3.put_object(Bucket=unique, Key="in/three.bin", Body=np.zeros(3 * 64, np.uint8).tobytes())
    aws.s3.put_object(Bucket=unique, Key="in/one.bin", Body=np.zeros(64, np.uint8).tobytes())
    # WHEN the job runs THEN the file is one record, refused: its prediction would be three rows
    manifest = run_batch(settings(unique, "raw-digits"))
    assert manifest["rows"] == {"total": 2, "succeeded": 1, "failed": 1}
    (error,) = errors(aws, unique, manifest)
    assert error["file"] == "in/three.bin"
    assert "preprocess made [3] rows of one file" in error["error"]["message"]


def test_a_model_without_a_hook_reads_only_its_row_formats(
    aws: Aws, unique: str, models: Path, digits: tuple[np.ndarray, np.ndarray]
) -> None:
    features, _ = digits
    # GIVEN a PNG beside a JSON Lines file, for the plain digits model (no hook reads images)
    ensure_bucket(aws.s3, unique)
    aws.s3.put_object(Bucket=unique, Key="in/a.png", Body=png(features[0]))
    aws.s3.put_object(Bucket=unique, Key="in/b.jsonl", Body=json.dumps(features[0].tolist()) + "\n")
    # WHEN the job runs THEN it reads the rows only, as it always did
    manifest = run_batch(settings(unique, "digits"))
    assert [entry["key"] for entry in manifest["inputs"]] == ["in/b.jsonl"]
    assert manifest["rows"] == {"total": 1, "succeeded": 1, "failed": 0}


# ------------------------------------------------------------------------------------------ several tensor inputs


@pytest.fixture(scope="module")
def token_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`tokens` (pad values declared for both inputs) and `tokens-unpadded` (none), the same graph."""
    root = tmp_path_factory.mktemp("batch-tokens")
    source = write_token_model(root / "source.onnx")
    padded = sequence_options(pad=["input_ids=0", "attention_mask=0"], max_length=[], id_range=[])
    build_package(source, root / "tokens" / "1", name="tokens", version="1", sequences=padded)
    build_package(source, root / "tokens-unpadded" / "1", name="tokens-unpadded", version="1")
    return root


@pytest.fixture
def tokens(monkeypatch: pytest.MonkeyPatch, token_models: Path) -> Path:
    monkeypatch.setenv("SERVESTACK_MODEL_DIR", str(token_models))
    monkeypatch.setenv("SERVESTACK_DEFAULT_MODEL", "tokens")
    return token_models


SEQUENCES = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10], [11], [12, 13, 14, 15, 16, 17]]


def token_line(ids: list[int]) -> str:
    return json.dumps({"input_ids": ids, "attention_mask": [1] * len(ids)}) + "\n"


def online_answer(model_dir: Path, ids: list[int]) -> Any:
    """What the realtime path answers for one row object of the sequence."""
    model = ServedModel.load(model_dir / "tokens" / "1", ServingSettings(model_dir=model_dir, warmup=False))
    body = json.dumps({"instances": [{"input_ids": ids, "attention_mask": [1] * len(ids)}]}).encode()
    return json.loads(model.infer(body, media_types.JSON, media_types.JSON).body)["predictions"][0]


def test_lines_of_several_inputs_are_scored_padded_across_files(aws: Aws, unique: str, tokens: Path) -> None:
    # GIVEN JSON Lines of row objects of input_ids and attention_mask, ragged within and across files
    ensure_bucket(aws.s3, unique)
    aws.s3.put_object(Bucket=unique, Key="in/a.jsonl", Body="".join(token_line(ids) for ids in SEQUENCES[:2]))
    aws.s3.put_object(Bucket=unique, Key="in/b.jsonl", Body="".join(token_line(ids) for ids in SEQUENCES[2:]))
    # WHEN a job runs over them without a hook (chunks spanning both files)
    manifest = run_batch(settings(unique, "tokens", chunk_rows=4))
    # THEN every line is scored, each as the realtime path scores it alone (padding changes no answer)
    assert manifest["rows"] == {"total": 5, "succeeded": 5, "failed": 0}
    rows = scored(aws, unique, manifest)
    assert [(row["file"], row["line"]) for row in rows] == [("in/a.jsonl", 1), ("in/a.jsonl", 2)] + [
        ("in/b.jsonl", line) for line in (1, 2, 3)
    ]
    for row, ids in zip(rows, SEQUENCES, strict=True):
        assert row["prediction"] == pytest.approx(online_answer(tokens, ids), rel=1e-5)


def test_without_a_pad_value_rows_of_another_length_are_error_rows(
    aws: Aws, unique: str, tokens: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN the same lines for a model whose manifest declares no pad value
    monkeypatch.setenv("SERVESTACK_DEFAULT_MODEL", "tokens-unpadded")
    ensure_bucket(aws.s3, unique)
    body = "".join(token_line(ids) for ids in [[1, 2, 3], [4, 5, 6], [7, 8]])
    aws.s3.put_object(Bucket=unique, Key="in/a.jsonl", Body=body)
    aws.s3.put_object(Bucket=unique, Key="in/b.jsonl", Body=token_line([9, 10, 11, 12]))
    # WHEN the job runs THEN the rows of the first row's length are scored, the others refused naming the flag
    manifest = run_batch(settings(unique, "tokens-unpadded"))
    assert manifest["rows"] == {"total": 4, "succeeded": 2, "failed": 2}
    found = errors(aws, unique, manifest)
    assert [(error["file"], error["line"]) for error in found] == [("in/a.jsonl", 3), ("in/b.jsonl", 1)]
    assert all("--pad input_ids=<value>" in error["error"]["message"] for error in found)


# ------------------------------------------------------------------------------------------ put-input, download


def test_put_input_takes_any_file_and_the_download_keys_each_by_its_file(
    aws: Aws, unique: str, models: Path, digits: tuple[np.ndarray, np.ndarray], tmp_path: Path
) -> None:
    features, _ = digits
    # GIVEN a state file naming a batch deployment whose input is on this endpoint, and two images
    ensure_bucket(aws.s3, unique)
    state = tmp_path / "local.json"
    where = {"bucket": unique, "input_prefix": "in/", "output_prefix": "out/"}
    state.write_text(json.dumps({"endpoint_url": aws.url, "region": "us-east-1",
                                 "deployments": {"nightly": {"mode": "batch", "input": where}}}))  # fmt: skip
    (tmp_path / "seven.jpg").write_bytes(jpeg(features[7]))
    (tmp_path / "eight.png").write_bytes(png(features[8]))
    # WHEN `servestack local put-input` uploads them
    done = subprocess.run(
        [SERVESTACK, "local", "put-input", "nightly", str(tmp_path / "seven.jpg"), str(tmp_path / "eight.png"),
         "--state", str(state)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    # THEN both went in, typed as their names say
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split() == [f"s3://{unique}/in/seven.jpg", f"s3://{unique}/in/eight.png"]
    assert aws.s3.head_object(Bucket=unique, Key="in/seven.jpg")["ContentType"] == "image/jpeg"
    # AND a run scores them, and its download names each row by its file: the object key is the id
    run_batch(settings(unique, "raw-digits"))
    rows = merged_rows(aws.s3, f"s3://{unique}/out/manifest.json")
    assert [(row["id"], row["file"], row["line"], row["error"]) for row in rows] == [
        ("in/eight.png", "in/eight.png", 1, None),
        ("in/seven.jpg", "in/seven.jpg", 1, None),
    ]
    assert rows[0]["prediction"] == digits_answers(models, features[8:9])[0]


def test_with_an_id_column_a_files_id_is_its_key(
    aws: Aws, unique: str, models: Path, digits: tuple[np.ndarray, np.ndarray]
) -> None:
    features, _ = digits
    # GIVEN two images, WHEN a job with an id column runs over them
    ensure_bucket(aws.s3, unique)
    for index in range(2):
        aws.s3.put_object(Bucket=unique, Key=f"in/{index}.png", Body=png(features[index]))
    manifest = run_batch(settings(unique, "raw-digits", id_column="image"))
    # THEN each row carries its file's key in that column
    assert [(row["image"], row["file"]) for row in scored(aws, unique, manifest)] == [
        ("in/0.png", "in/0.png"),
        ("in/1.png", "in/1.png"),
    ]
