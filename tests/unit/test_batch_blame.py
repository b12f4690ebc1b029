"""A request the model refuses (a category its one-hot encoder never saw) fails alone: the requests batched with
it get the answers they get alone. onnxruntime fails a whole batch for one bad row, so the micro-batcher splits
a batch that fails with `InvalidInput` until each request has its own outcome; a server fault still reaches all.
Real onnxruntime on the scikit-learn pipeline of tests/pipeline_model.py, through `ServedModel.predict` as the
realtime server and the Lambda app call it."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from servestack.inference import media_types
from servestack.inference.batching import BatchingConfig, MicroBatcher
from servestack.inference.errors import InferenceError, InvalidInput, ModelLoadError
from servestack.inference.packaging import create_package
from servestack.inference.service import ServedModel
from servestack.inference.settings import ServingSettings
from servestack.inference.tabular.transform import score_lines
from tests.pipeline_model import COLUMNS, STRING, PipelineModel, pipeline_model

Arrays = dict[str, np.ndarray]


@pytest.fixture(scope="module")
def built() -> PipelineModel:
    return pipeline_model()


@pytest.fixture(scope="module")
def model(built: PipelineModel) -> ServedModel:
    return ServedModel.load(built.package, ServingSettings())


class CountingModel:
    """The served model's own `predict`, counting the rows of each call: how the batcher grouped its work."""

    def __init__(self, model: ServedModel) -> None:
        self.model = model
        self.calls: list[int] = []

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> Arrays:
        self.calls.append(len(next(iter(inputs.values()))))
        return self.model.predict(inputs)


def request(built: PipelineModel, first: int, count: int, site: str | None = None) -> Arrays:
    """Rows first..first+count of the test rows as the model's input arrays; `site` replaces the last row's."""
    arrays: Arrays = {}
    for name in COLUMNS:
        values: list[Any] = built.rows[name][first : first + count]
        if name == STRING:
            if site is not None:
                values = [*values[:-1], site]
            arrays[name] = np.array(values, dtype=object).reshape(-1, 1)
        else:
            arrays[name] = np.array(values, dtype=np.float32).reshape(-1, 1)
    return arrays


def submit_together(batcher: MicroBatcher, requests: list[Arrays]) -> list[Arrays | BaseException]:
    """Submit every request before the loop runs once: in CPU mode the first drain runs after all of them are
    queued, so they form one batch (each call's row count shows it)."""

    async def main() -> list[Arrays | BaseException]:
        waiting = [batcher.submit(arrays, len(arrays[STRING]), 10.0) for arrays in requests]
        return await asyncio.gather(*waiting, return_exceptions=True)

    return asyncio.run(main())


@pytest.mark.parametrize("poisoned", [0, 2, 5])
def test_an_unknown_category_fails_only_its_own_request(
    built: PipelineModel, model: ServedModel, poisoned: int
) -> None:
    # GIVEN six requests of one to three rows, one of which holds a site the encoder never saw
    requests = [request(built, i * 2 % 10, i % 3 + 1) for i in range(6)]
    requests[poisoned] = request(built, 0, 2, site="atlantis")
    alone = [model.predict(arrays) if i != poisoned else None for i, arrays in enumerate(requests)]
    counting = CountingModel(model)
    batcher = MicroBatcher(counting, BatchingConfig())
    # WHEN they are submitted together, so they share one batch
    outcomes = submit_together(batcher, requests)
    # THEN the first call held every row of the six (they were batched)
    assert counting.calls[0] == sum(len(arrays[STRING]) for arrays in requests)
    # AND the poisoned request alone gets a 400 naming the string column and what was wrong
    error = outcomes[poisoned]
    assert isinstance(error, InvalidInput), error
    assert error.status_code == 400
    assert error.to_dict() == {
        "type": "InvalidInput",
        "message": "model flowers@1: column 'site' holds 'atlantis', a category the model was not trained on",
        "field": "site",
        "value": "atlantis",
        "allowed": "the categories seen in training (or fit the encoder with handle_unknown='ignore')",
    }
    # AND every other request gets what it gets alone: the same labels, the same probabilities (to float32's
    # last bits, which onnxruntime's kernels round differently for batches of other sizes, failure or not)
    for i, outcome in enumerate(outcomes):
        if i == poisoned:
            continue
        assert isinstance(outcome, dict), (i, outcome)
        expected = alone[i]
        assert expected is not None
        assert sorted(outcome) == sorted(expected) == ["label", "probabilities"]
        assert outcome["label"].tolist() == expected["label"].tolist()
        np.testing.assert_allclose(outcome["probabilities"], expected["probabilities"], rtol=1e-6, atol=1e-7)
    # AND the split bisected: far fewer calls than a retry of each request alone after every failure
    assert len(counting.calls) <= 1 + 2 * 3  # one batch, then at most two halves per level of a 6-request batch


def test_two_poisoned_requests_each_fail_and_the_rest_are_answered(built: PipelineModel, model: ServedModel) -> None:
    requests = [request(built, i, 2) for i in range(8)]
    requests[1] = request(built, 1, 2, site="atlantis")
    requests[6] = request(built, 6, 1, site="")
    outcomes = submit_together(MicroBatcher(model.predict, BatchingConfig()), requests)
    assert [isinstance(outcome, InvalidInput) for outcome in outcomes] == [i in (1, 6) for i in range(8)]
    assert [(error.field, error.value) for error in outcomes if isinstance(error, InvalidInput)] == [
        ("site", "atlantis"),
        ("site", ""),
    ]
    for i in (0, 2, 3, 4, 5, 7):
        outcome = outcomes[i]
        assert isinstance(outcome, dict)
        assert outcome["label"].tolist() == built.expected[i : i + 2]


def test_the_split_also_runs_when_inference_runs_in_a_thread(built: PipelineModel, model: ServedModel) -> None:
    requests = [request(built, 0, 3), request(built, 3, 2, site="atlantis"), request(built, 5, 3)]
    batcher = MicroBatcher(model.predict, BatchingConfig(use_thread=True))
    try:
        outcomes = submit_together(batcher, requests)
    finally:
        batcher.close()
    first, poisoned, last = outcomes
    assert isinstance(poisoned, InvalidInput)
    assert isinstance(first, dict)
    assert first["label"].tolist() == built.expected[0:3]
    assert isinstance(last, dict)
    assert last["label"].tolist() == built.expected[5:8]


@pytest.mark.parametrize("fault", [InferenceError("onnxruntime ran out of memory"), ModelLoadError("model gone")])
def test_a_server_fault_still_reaches_every_request_of_the_batch(built: PipelineModel, fault: Exception) -> None:
    calls: list[int] = []

    def failing(inputs: Mapping[str, np.ndarray]) -> Arrays:
        calls.append(len(inputs[STRING]))
        raise fault

    outcomes = submit_together(MicroBatcher(failing, BatchingConfig()), [request(built, i, 1) for i in range(4)])
    assert all(outcome is fault for outcome in outcomes)
    assert calls == [4]  # not split: retrying the halves of a server fault would only repeat it


def test_a_transform_mini_batch_answers_a_refused_line_with_its_own_error(
    built: PipelineModel, model: ServedModel
) -> None:
    # GIVEN a Batch Transform mini-batch of five JSON records, the fourth of a site the encoder never saw
    records = [{name: built.rows[name][i] for name in COLUMNS} for i in range(5)]
    records[3][STRING] = "atlantis"
    body = b"\n".join(orjson.dumps(record) for record in records) + b"\n"
    # WHEN the container scores it
    answers = [orjson.loads(line) for line in score_lines(model, body, media_types.JSON).splitlines()]
    # THEN that line's answer is its error, and every other line has the prediction it has alone
    assert len(answers) == 5
    assert answers[3]["error"]["type"] == "InvalidInput"
    assert (answers[3]["error"]["field"], answers[3]["error"]["value"]) == ("site", "atlantis")
    assert [answer.get("prediction") for i, answer in enumerate(answers) if i != 3] == [
        label for i, label in enumerate(built.expected[:5]) if i != 3
    ]


def test_without_a_sample_request_the_error_names_the_string_columns(built: PipelineModel, tmp_path: Path) -> None:
    # GIVEN the pipeline as a registry holds it: no sample request, so no row known to pass to try values in
    package = tmp_path / "flowers" / "3"
    create_package(built.onnx_file, package, name="flowers", version="3")
    bare = ServedModel.load(package, ServingSettings())
    # WHEN a batch holds one request of an unknown site
    requests = [request(built, 0, 2), request(built, 2, 2, site="atlantis"), request(built, 4, 2)]
    outcomes = submit_together(MicroBatcher(bare.predict, BatchingConfig()), requests)
    # THEN that request's 400 names the string columns, and the others are answered
    error = outcomes[1]
    assert isinstance(error, InvalidInput)
    assert (error.field, error.value) == ("body", "unknown category")
    assert "(string columns: ['site'])" in error.message
    assert [outcome["label"].tolist() for outcome in outcomes if isinstance(outcome, dict)] == [
        built.expected[0:2],
        built.expected[4:6],
    ]
