"""Tensor models by name (issue 36, item 3): a BERT-like model's named inputs in row objects, ragged rows padded
where the manifest says so, bounds on length and ids, and onnxruntime's refusals of a request as 400s."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servestack.inference import media_types
from servestack.inference.errors import InferenceError, InvalidInput
from servestack.inference.input_checks import padded_rows
from servestack.inference.manifest import Manifest, SequenceInput, TensorSpec
from servestack.inference.packaging import build_package
from servestack.inference.push_sequences import SequenceOptions, sequence_options
from servestack.inference.runtime import caused_by_request
from servestack.inference.service import ServedModel
from servestack.inference.settings import ServingSettings
from tests.conftest import ARTIFACTS
from tests.token_model import POSITIONS, VOCAB, write_token_model


def _served(folder: Path, sequences: SequenceOptions | None = None) -> ServedModel:
    model = write_token_model(folder / "source.onnx")
    built = build_package(model, folder / "package", name="tokens", version="1", sequences=sequences)
    settings = ServingSettings(model_dir=built.directory, default_model="tokens", providers="CPUExecutionProvider")
    return ServedModel.load(built.directory, settings)


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory) -> ServedModel:
    return _served(
        tmp_path_factory.mktemp("bounded"),
        sequence_options(pad=["input_ids=0", "attention_mask=0"], max_length=["input_ids=6"], id_range=[]),
    )


@pytest.fixture(scope="module")
def unbounded(tmp_path_factory: pytest.TempPathFactory) -> ServedModel:
    return _served(tmp_path_factory.mktemp("unbounded"))


def _predict(model: ServedModel, body: dict[str, Any]) -> Any:
    answer = model.infer(json.dumps(body).encode(), media_types.JSON, media_types.JSON)
    return json.loads(answer.body)["predictions"]


def _refusal(model: ServedModel, body: dict[str, Any]) -> InvalidInput:
    with pytest.raises(InvalidInput) as caught:
        _predict(model, body)
    return caught.value


def test_the_id_range_is_read_from_the_gather_on_the_word_embedding(unbounded: ServedModel) -> None:
    # GIVEN a model whose input_ids index a Gather on a constant of VOCAB rows, pushed with no flags
    # THEN the manifest bounds input_ids to [0, VOCAB), and attention_mask (no Gather) is not bounded
    assert unbounded.manifest.sequences == (SequenceInput(input="input_ids", ids=(0, VOCAB)),)


def test_an_id_past_the_vocabulary_is_a_400_naming_input_row_and_bound(unbounded: ServedModel) -> None:
    # GIVEN a request whose second row holds an id past the vocabulary
    body = {"inputs": {"input_ids": [[1, 2, 3], [4, VOCAB, 6]], "attention_mask": [[1, 1, 1], [1, 1, 1]]}}
    # WHEN it is decoded THEN it is refused before onnxruntime, naming the input, the row and the bound
    error = _refusal(unbounded, body)
    assert error.status_code == 400
    assert error.field == "inputs.input_ids[1][1]"
    assert error.value == VOCAB
    assert "row 1 of input 'input_ids'" in error.message
    assert error.allowed == f"ids 0..{VOCAB - 1}"


def test_a_row_past_the_maximum_length_is_a_400_naming_it(bounded: ServedModel) -> None:
    # GIVEN a model pushed with --max-length input_ids=6 and a request whose row 1 holds 7 ids
    body = {"inputs": {"input_ids": [[1, 2], [1] * 7], "attention_mask": [[1, 1], [1] * 7]}}
    # THEN the refusal names the row and the bound
    error = _refusal(bounded, body)
    assert error.field == "inputs.input_ids[1]"
    assert error.value == 7
    assert error.allowed == "at most 6 values"


def test_onnxruntime_refusing_a_request_is_a_400_not_a_500(unbounded: ServedModel) -> None:
    # GIVEN rows longer than the graph's position table (no --max-length: only onnxruntime knows the bound)
    body = {"inputs": {"input_ids": [[1] * (POSITIONS + 1)], "attention_mask": [[1] * (POSITIONS + 1)]}}
    # THEN onnxruntime's refusal (the position embedding no longer adds up with the words: a broadcasting
    # FAIL) comes back as InvalidInput, without its C++ source location
    error = _refusal(unbounded, body)
    assert "broadcast" in error.message
    assert "onnxruntime_src" not in error.message
    assert "BroadcastIterator" not in error.message
    # AND so does its broadcasting FAIL for a mask of another length than the ids
    mismatched = {"inputs": {"input_ids": [[1, 2, 3]], "attention_mask": [[1, 1, 1, 1]]}}
    assert "broadcast" in _refusal(unbounded, mismatched).message


def test_an_id_past_the_vocabulary_that_skips_decoding_is_still_a_400(unbounded: ServedModel) -> None:
    # GIVEN arrays handed straight to predict (a hook's output, or a batch that skipped the bounds)
    arrays = {"input_ids": np.array([[1, VOCAB + 5]]), "attention_mask": np.ones((1, 2), np.int64)}
    # THEN onnxruntime's INVALID_ARGUMENT from the Gather is the request's fault
    with pytest.raises(InvalidInput) as caught:
        unbounded.predict(arrays)
    assert "indices element out of data bounds" in caught.value.message


def test_only_request_caused_onnxruntime_errors_count_as_the_callers() -> None:
    import onnxruntime.capi.onnxruntime_pybind11_state as states

    assert caused_by_request(states.InvalidArgument("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : bad"))
    assert caused_by_request(states.Fail("Attempting to broadcast an axis by a dimension other than 1. 3 by 4"))
    assert not caused_by_request(states.Fail("[ONNXRuntimeError] : 1 : FAIL : bad_alloc"))
    assert not caused_by_request(states.RuntimeException("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : CUDA"))
    assert not caused_by_request(states.EPFail("[ONNXRuntimeError] : 11 : EP_FAIL : provider"))
    assert issubclass(InferenceError, Exception)


def test_row_objects_of_several_inputs_answer_as_the_inputs_form(unbounded: ServedModel) -> None:
    # GIVEN the same two rows as TF-Serving row objects and as named inputs
    rows = [
        {"input_ids": [1, 2, 3], "attention_mask": [1, 1, 0]},
        {"input_ids": [4, 5, 6], "attention_mask": [1, 1, 1]},
    ]
    by_input = {name: [row[name] for row in rows] for name in ("input_ids", "attention_mask")}
    # THEN both answer the same
    assert _predict(unbounded, {"instances": rows}) == _predict(unbounded, {"inputs": by_input})


def test_a_row_object_missing_an_input_names_the_row(unbounded: ServedModel) -> None:
    error = _refusal(unbounded, {"instances": [{"input_ids": [1], "attention_mask": [1]}, {"input_ids": [1]}]})
    assert error.field == "instances[1]"


def test_ragged_rows_are_padded_where_the_manifest_declares_a_pad_value(bounded: ServedModel) -> None:
    # GIVEN ragged row objects, and the same rows padded by hand with the declared pad value 0
    ragged = [{"input_ids": [1, 2, 3, 4], "attention_mask": [1, 1, 1, 1]}, {"input_ids": [5], "attention_mask": [1]}]
    padded = [
        {"input_ids": [1, 2, 3, 4], "attention_mask": [1, 1, 1, 1]},
        {"input_ids": [5, 0, 0, 0], "attention_mask": [1, 0, 0, 0]},
    ]
    # THEN the ragged request answers as the padded one
    assert _predict(bounded, {"instances": ragged}) == _predict(bounded, {"instances": padded})


def test_ragged_rows_without_a_pad_value_are_refused(unbounded: ServedModel) -> None:
    error = _refusal(unbounded, {"inputs": {"input_ids": [[1, 2], [1]], "attention_mask": [[1, 1], [1]]}})
    assert "different lengths" in error.message


def test_manifests_without_sequences_are_read_and_written_byte_for_byte() -> None:
    for path in ARTIFACTS.glob("*/*/manifest.json"):
        written = path.read_bytes()
        manifest = msgspec.json.decode(written, type=Manifest)
        assert manifest.sequences == ()
        assert manifest.to_json() == written


def test_a_sequence_entry_must_name_an_integer_sequence_input() -> None:
    spec = TensorSpec(name="x", dtype="float32", shape=(None, 4))
    with pytest.raises(ValueError, match="integer input"):
        Manifest(
            name="m", version="1", sha256="0" * 64, inputs=(spec,), outputs=(spec,),
            sequences=(SequenceInput(input="x", ids=(0, 5)),),
        )  # fmt: skip


_SEQUENCE = TensorSpec(name="input_ids", dtype="int64", shape=(None, None))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 99), max_size=12), min_size=1, max_size=8), st.integers(-5, 5))
def test_padding_keeps_every_row_and_fills_only_its_end(rows: list[list[int]], pad: int) -> None:
    # GIVEN any ragged rows and a declared pad value
    padded = padded_rows("inputs.input_ids", rows, _SEQUENCE, SequenceInput(input="input_ids", pad=pad))
    # THEN every row is as long as the longest, starts with itself and continues with the pad value only
    longest = max(len(row) for row in rows)
    for original, row in zip(rows, padded, strict=True):
        assert len(row) == longest
        assert row[: len(original)] == original
        assert row[len(original) :] == [pad] * (longest - len(original))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 9), max_size=10), min_size=1, max_size=8), st.integers(1, 10))
def test_a_row_past_the_maximum_length_is_always_named(rows: list[list[int]], max_length: int) -> None:
    sequence = SequenceInput(input="input_ids", pad=0, max_length=max_length)
    too_long = [index for index, row in enumerate(rows) if len(row) > max_length]
    if not too_long:
        assert len(padded_rows("f", rows, _SEQUENCE, sequence)) == len(rows)
        return
    with pytest.raises(InvalidInput) as caught:
        padded_rows("f", rows, _SEQUENCE, sequence)
    assert caught.value.field in {f"f[{index}]" for index in too_long}
