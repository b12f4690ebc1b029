"""Texts turned into a model's inputs by its package's tokenizer (servestack/inference/text_inputs.py), on models
that echo their inputs: the three inputs by name, padding to the batch's longest or to the graph's fixed L,
truncation to the maximum length, the pad id the manifest records."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from servestack.inference.errors import InvalidInput
from servestack.inference.packaging import create_package
from servestack.inference.push_sequences import sequence_options
from servestack.inference.service import ServedModel
from servestack.inference.settings import ServingSettings

TOKENIZER = Path(__file__).resolve().parents[1] / "fixtures" / "deep_learning" / "text" / "tokenizer.json"
NAMES = ("input_ids", "attention_mask", "token_type_ids")


def echo_model(path: Path, names: tuple[str, ...], length: int | None) -> Path:
    """A graph whose outputs are its int64 `[batch, length]` inputs, each plus zero."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Add", [name, "zero"], [f"{name}_out"]) for name in names],
        "echo",
        [helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", length or "sequence"]) for name in names],
        [
            helper.make_tensor_value_info(f"{name}_out", TensorProto.INT64, ["batch", length or "sequence"])
            for name in names
        ],
        [numpy_helper.from_array(np.array(0, np.int64), "zero")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save_model(model, str(path))
    return path


def served(tmp_path: Path, names: tuple[str, ...], length: int | None, *max_length: str) -> ServedModel:
    package = tmp_path / "echo" / "1"
    create_package(
        echo_model(tmp_path / "echo.onnx", names, length), package, name="echo", version="1", tokenizer=TOKENIZER,
        sequences=sequence_options([], list(max_length), []),
    )  # fmt: skip
    return ServedModel.load(package, ServingSettings(model_dir=package, providers="CPUExecutionProvider"))


def ids_of(text: str) -> list[int]:
    ids: list[int] = Tokenizer.from_file(str(TOKENIZER)).encode(text).ids
    return ids


def test_three_inputs_filled_by_name_and_padded_to_the_longest(tmp_path: Path) -> None:
    model = served(tmp_path, NAMES, None)
    arrays = model.decode(
        json.dumps({"instances": ["the service", "the service was wonderful"]}).encode(), "application/json"
    )
    short, long = ids_of("the service"), ids_of("the service was wonderful")
    assert arrays["input_ids"].tolist() == [short + [0] * (len(long) - len(short)), long]
    assert arrays["attention_mask"].tolist() == [[1] * len(short) + [0] * (len(long) - len(short)), [1] * len(long)]
    assert arrays["token_type_ids"].tolist() == [[0] * len(long)] * 2
    assert {name: array.dtype for name, array in arrays.items()} == dict.fromkeys(NAMES, np.dtype(np.int64))


def test_a_fixed_length_graph_takes_texts_padded_and_truncated_to_it(tmp_path: Path) -> None:
    model = served(tmp_path, NAMES[:1], 8)
    long = "the service was wonderful and the staff were kind and the food was great"
    arrays = model.decode(json.dumps({"inputs": ["the service", long]}).encode(), "application/json")
    short = ids_of("the service")
    assert arrays["input_ids"].shape == (2, 8)
    assert arrays["input_ids"][0].tolist() == short + [0] * (8 - len(short))
    assert arrays["input_ids"][1, -1] == Tokenizer.from_file(str(TOKENIZER)).token_to_id("[SEP]")  # truncated, closed


def test_max_length_truncates_and_a_plain_text_is_one_row(tmp_path: Path) -> None:
    model = served(tmp_path, NAMES[:2], None, "input_ids=5")
    arrays = model.decode(b"the service was wonderful and kind", "text/plain; charset=utf-8")
    assert arrays["input_ids"].shape == (1, 5)
    assert arrays["attention_mask"].tolist() == [[1] * 5]


def test_too_many_texts_is_a_400_naming_the_limit(tmp_path: Path) -> None:
    model = served(tmp_path, NAMES[:2], None)
    with pytest.raises(InvalidInput) as refused:
        model.decode(json.dumps({"instances": ["a"] * (model.max_batch_rows + 1)}).encode(), "application/json")
    assert refused.value.field == "instances"
