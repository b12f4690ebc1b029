"""A model pushed with a Hugging Face tokenizer (`models push --tokenizer tokenizer.json`) takes texts with no
hook, through the realtime container's HTTP server and the Lambda handler alike: a `text/plain` body, or JSON
lists of texts, answered with the logits torch computed for the same texts (the fixture's export script,
tests/fixtures/deep_learning/export_text.py). Ids sent directly keep the tensor forms and their checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
from tokenizers import Tokenizer

from servestack.inference.manifest import read_manifest
from servestack.inference.packaging import create_package
from servestack.inference.push_sequences import sequence_options
from tests.conftest import ARTIFACTS, LambdaHandler, RealtimeServer, fresh_lambda_handler, lambda_event, response_body
from tests.token_model import write_token_model

SERVESTACK = str(Path(sys.executable).parent / "servestack")
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "deep_learning" / "text"
EXPECTED: dict[str, Any] = json.loads((FIXTURE / "expected.json").read_text())
SENTENCES = [entry["text"] for entry in EXPECTED["sentences"]]
LOGITS = np.array([entry["logits"] for entry in EXPECTED["sentences"]], dtype=np.float32)
MAX_LENGTH = EXPECTED["max_length"]
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`sentiment`: the fixture's classifier, its tokenizer carried in the package."""
    root = tmp_path_factory.mktemp("text-inputs")
    create_package(
        FIXTURE / "text_classifier.onnx", root / "sentiment" / "1", name="sentiment", version="1",
        tokenizer=FIXTURE / "tokenizer.json", sequences=sequence_options([], [f"input_ids={MAX_LENGTH}"], []),
    )  # fmt: skip
    return root


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealtimeServer]:
    env = {"SERVESTACK_MODEL_DIR": str(model_dir), "SERVESTACK_DEFAULT_MODEL": "sentiment"}
    running = RealtimeServer.start(tmp_path_factory.mktemp("text-inputs-server"), env=env)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def handler(model_dir: Path) -> Iterator[LambdaHandler]:
    """The Lambda entry module, initialised as a Lambda process does (models load at import), on this model."""
    yield from fresh_lambda_handler(model_dir, "sentiment", "serverless_text_inputs")


def post(server: RealtimeServer, body: bytes, content_type: str) -> httpx.Response:
    return httpx.post(f"{server.url}/invocations", content=body, headers={"content-type": content_type}, timeout=30)


def close_to_torch(answer: Any, rows: slice | list[int]) -> None:
    """A logits model's answer (its output named `logits`): softmax as `probabilities`, argmax as `predictions`."""
    logits = LOGITS[rows]
    softmax = np.exp(logits - logits.max(axis=1, keepdims=True))
    softmax /= softmax.sum(axis=1, keepdims=True)
    found = np.asarray(answer["probabilities"], dtype=np.float32)
    assert found.shape == logits.shape
    assert np.abs(found - softmax).max() < TOLERANCE, (found, softmax)
    assert answer["predictions"] == logits.argmax(axis=1).tolist()


def test_the_package_records_its_tokenizer_pad_and_requirement(model_dir: Path) -> None:
    manifest = read_manifest(model_dir / "sentiment" / "1")
    assert manifest.tokenizer == "tokenizer.json"
    assert "tokenizer.json" in [entry.name for entry in manifest.files]
    assert [r for r in manifest.requirements if r.startswith("tokenizers")]
    ids = manifest.sequence_of("input_ids")
    assert ids is not None
    # the pad id is the tokenizer's own, the id range the graph's embedding, the maximum length --max-length
    assert ids.pad == Tokenizer.from_file(str(FIXTURE / "tokenizer.json")).token_to_id("[PAD]")
    assert (ids.max_length, ids.ids) == (
        MAX_LENGTH,
        (0, Tokenizer.from_file(str(FIXTURE / "tokenizer.json")).get_vocab_size()),
    )
    mask = manifest.sequence_of("attention_mask")
    assert mask is not None
    assert mask.pad == 0


@pytest.mark.parametrize("row", range(len(SENTENCES)))
def test_the_container_answers_a_plain_text_body_as_torch_does(server: RealtimeServer, row: int) -> None:
    # WHEN one text is posted as text/plain
    answer = post(server, SENTENCES[row].encode(), "text/plain; charset=utf-8")
    # THEN the model answers torch's logits for it (the longest text truncated to the model's maximum length)
    assert answer.status_code == 200, answer.text
    close_to_torch(answer.json(), [row])


@pytest.mark.parametrize("form", ["instances", "inputs"])
def test_the_container_answers_a_json_list_of_texts_padded_to_the_longest(server: RealtimeServer, form: str) -> None:
    # WHEN every text goes in one request, texts of different lengths
    answer = post(server, orjson.dumps({form: SENTENCES}), "application/json")
    # THEN each row is torch's logits for its text alone: padding with the tokenizer's pad id, masked, changes none
    assert answer.status_code == 200, answer.text
    close_to_torch(answer.json(), slice(None))


def test_the_models_description_names_its_tokenizer(server: RealtimeServer) -> None:
    described = httpx.get(f"{server.url}/v1/models/sentiment", timeout=30).json()
    assert described["tokenizer"] == "tokenizer.json"
    assert described["has_hooks"] is False


def test_the_rest_route_takes_one_text_as_inputs(server: RealtimeServer) -> None:
    answer = httpx.post(f"{server.url}/v1/models/sentiment/predict", json={"inputs": SENTENCES[2]}, timeout=30)
    assert answer.status_code == 200, answer.text
    close_to_torch(answer.json(), [2])


def test_a_text_past_the_maximum_length_is_truncated_not_refused(server: RealtimeServer) -> None:
    longest = SENTENCES[-1]
    untruncated = Tokenizer.from_file(str(FIXTURE / "tokenizer.json")).encode(longest)
    assert len(untruncated.ids) > MAX_LENGTH
    answer = post(server, longest.encode(), "text/plain")
    assert answer.status_code == 200, answer.text
    close_to_torch(answer.json(), [len(SENTENCES) - 1])


def test_ragged_ids_sent_directly_are_padded_with_the_manifests_pad(server: RealtimeServer) -> None:
    rows = [{"input_ids": e["ids"], "attention_mask": [1] * len(e["ids"])} for e in EXPECTED["sentences"]]
    assert len({len(row["input_ids"]) for row in rows}) > 1
    answer = post(server, orjson.dumps({"instances": rows}), "application/json")
    assert answer.status_code == 200, answer.text
    close_to_torch(answer.json(), slice(None))


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"inputs": {"input_ids": [[2] * (MAX_LENGTH + 1)], "attention_mask": [[1] * (MAX_LENGTH + 1)]}},
         "inputs.input_ids[0]"),
        ({"inputs": {"input_ids": [[2, 5, 3], [2, 10_000, 3]], "attention_mask": [[1, 1, 1]] * 2}},
         "inputs.input_ids[1][1]"),
        ({"instances": ["the service", ""]}, "instances[1]"),
        ({"instances": ["the service", "   "]}, "instances[1]"),
        ({"inputs": ["the service", 7]}, "inputs[1]"),
    ],
)  # fmt: skip
def test_bad_ids_and_texts_are_a_400_naming_the_item(server: RealtimeServer, body: dict[str, Any], field: str) -> None:
    answer = post(server, orjson.dumps(body), "application/json")
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["field"] == field


@pytest.mark.parametrize(
    ("body", "content_type", "field"),
    [
        (b"", "text/plain", "body"),
        (b"\xff\xfe text", "text/plain", "body"),
        (b"x", "text/plain; charset=nope", "Content-Type"),
    ],
)
def test_a_bad_plain_text_body_is_a_400(server: RealtimeServer, body: bytes, content_type: str, field: str) -> None:
    answer = post(server, body, content_type)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["field"] == field


def test_the_lambda_handler_answers_texts_as_torch_does(handler: LambdaHandler) -> None:
    # GIVEN the Lambda entry module serving the model (an HTTP API event)
    # WHEN one text arrives as text/plain and all of them as a JSON list
    plain = handler(lambda_event("http-api-v2", SENTENCES[0], headers={"content-type": "text/plain"}))
    listed = handler(
        lambda_event(
            "http-api-v2", orjson.dumps({"instances": SENTENCES}), headers={"content-type": "application/json"}
        )
    )
    # THEN both answer torch's logits
    assert plain["statusCode"] == 200, response_body(plain)
    close_to_torch(orjson.loads(response_body(plain)), [0])
    assert listed["statusCode"] == 200, response_body(listed)
    close_to_torch(orjson.loads(response_body(listed)), slice(None))
    # AND an empty text is its 400, naming the item
    empty = handler(
        lambda_event(
            "http-api-v2", orjson.dumps({"instances": ["ok", ""]}), headers={"content-type": "application/json"}
        )
    )
    assert empty["statusCode"] == 400
    assert orjson.loads(response_body(empty))["error"]["field"] == "instances[1]"


# ------------------------------------------------------------------------------------------ push


def push(tmp_path: Path, model: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SERVESTACK_", "AWS_"))}
    return subprocess.run(
        [SERVESTACK, "models", "push", str(model), "--name", "sentiment", "--artifacts", str(tmp_path / "artifacts"),
         *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_models_push_carries_the_tokenizer_and_says_so(tmp_path: Path) -> None:
    done = push(tmp_path, FIXTURE / "text_classifier.onnx", "--tokenizer", str(FIXTURE / "tokenizer.json"),
                "--max-length", f"input_ids={MAX_LENGTH}")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "tokenizer.json" in done.stdout
    assert "--tokenizer" in done.stdout
    package = tmp_path / "artifacts" / "sentiment" / "1"
    assert read_manifest(package).tokenizer == "tokenizer.json"
    # the sample request is texts, answered through the tokenizer
    assert json.loads((package / "sample-request.json").read_text())["instances"][0].startswith("sample")


def test_models_push_refuses_a_tokenizer_the_model_cannot_take(tmp_path: Path) -> None:
    tokenizer = str(FIXTURE / "tokenizer.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "a tokenizer"}')
    hooks = tmp_path / "process.py"
    hooks.write_text("def preprocess(payload, content_type):\n    return payload\n")
    small = write_token_model(tmp_path / "small.onnx")  # an embedding of 50 rows, fewer than the tokenizer's ids
    ids = Tokenizer.from_file(tokenizer).get_vocab_size()
    classifier = FIXTURE / "text_classifier.onnx"
    cases = {
        "digits": (ARTIFACTS / "digits" / "1" / "model.onnx", ["--tokenizer", tokenizer], "input_ids"),
        "not a tokenizer": (classifier, ["--tokenizer", str(bad)], "not a Hugging Face"),
        "with a hook": (classifier, ["--tokenizer", tokenizer, "--process", str(hooks)], "--process"),
        "another pad": (classifier, ["--tokenizer", tokenizer, "--pad", "input_ids=7"], "pads with id 0"),
        "vocabulary": (small, ["--tokenizer", tokenizer], f"{ids} ids"),
    }  # fmt: skip
    for case, (model, args, said) in cases.items():
        done = push(tmp_path, model, *args)
        assert done.returncode != 0, case
        assert said in done.stderr, (case, done.stderr)
    assert not (tmp_path / "artifacts" / "sentiment").exists()
