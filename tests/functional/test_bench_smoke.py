"""The benches' row code runs (no figure is judged: the benches print figures, they never pass or fail on time).

- The peers bench's requests (bench/peer_requests.py) carry the same rows as ours' bodies, and the feeds its
  MLServer runtime builds from them give the pipeline's own labels on real onnxruntime.
- The MLServer runtime class (bench/mlserver_runtime.py) answers both requests through MLServer's own codecs,
  run directly in the peers environment that `make bench-peers` builds; skipped where that environment has not
  been built, since the suite never installs MLServer.
- Interleaved pairs (bench/pairs.py) alternate their order and take each pair's own ratio; the tables print.
- One realtime row against its own ceiling (bench/ceilings.py) runs end to end on real servers and wrk, one
  pair of one-second slices; skipped without wrk, which the bench needs and the suite does not.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from bench.ceilings import CEILING, JSON1, OURS, RAW, ceilings_table, measure_rows
from bench.pairs import WRK_SCRIPT, Samples, Side, Slice, interleave
from bench.peer_requests import column_feeds, v2_first_output
from bench.peers import PANDAS32, PEER, peer_payloads, peers_table
from bench.subjects import ARTIFACT, SPLIT_ROWS, payloads, split_payload
from tests.conftest import REPO_ROOT
from tests.pipeline_model import pipeline_model

PEERS_PYTHON = REPO_ROOT / ".bench" / "peers" / "bin" / "python"


def test_peer_requests_carry_ours_rows(tmp_path: Path) -> None:
    # GIVEN ours' bodies and MLServer's, built by the benches from the same rows
    ours_single = json.loads(payloads(tmp_path)["single"].body_file.read_text())
    ours_split = json.loads(split_payload(tmp_path)[0].body_file.read_text())["dataframe_split"]
    theirs = {name: json.loads(p.body_file.read_text()) for name, p in peer_payloads(tmp_path).items()}

    # THEN the V2 tensor is ours' one row, as FP32 of shape [1, 64]
    (tensor,) = theirs["1-row JSON"]["inputs"]
    assert (tensor["shape"], tensor["datatype"]) == ([1, 64], "FP32")
    assert tensor["data"] == pytest.approx(ours_single["instances"][0])
    # AND the pandas request is ours' 32 rows by column, under the pandas codec, strings as BYTES
    frame = theirs[PANDAS32]
    assert frame["parameters"] == {"content_type": "pd"}
    assert [i["name"] for i in frame["inputs"]] == ours_split["columns"]
    for index, column in enumerate(frame["inputs"]):
        assert column["shape"] == [SPLIT_ROWS, 1]
        assert column["data"] == [row[index] for row in ours_split["data"]]
    assert {i["name"]: i["datatype"] for i in frame["inputs"]}["site"] == "BYTES"


def test_runtime_feeds_give_the_pipelines_labels(tmp_path: Path) -> None:
    # GIVEN the pandas request's columns and the pipeline's ONNX file on real onnxruntime
    model = pipeline_model()
    frame = json.loads(peer_payloads(tmp_path)[PANDAS32].body_file.read_text())
    columns = {column["name"]: column["data"] for column in frame["inputs"]}
    session = ort.InferenceSession(str(model.onnx_file), providers=["CPUExecutionProvider"])

    # WHEN the runtime's feeds are built and run
    feeds = column_feeds([(i.name, i.type) for i in session.get_inputs()], columns)
    labels = session.run(["label"], feeds)[0]

    # THEN every input is a [32, 1] column and the labels are the estimator's for those rows
    assert {name: array.shape for name, array in feeds.items()} == dict.fromkeys(columns, (SPLIT_ROWS, 1))
    assert labels.tolist() == (model.expected * 3)[:SPLIT_ROWS]


@pytest.mark.skipif(not PEERS_PYTHON.exists(), reason="no .bench/peers (MLServer): `make bench-peers` builds it")
def test_mlserver_runtime_answers_both_requests(tmp_path: Path) -> None:
    # GIVEN MLServer's two requests and the runtime class, in the peers environment
    bodies = {name: str(p.body_file) for name, p in peer_payloads(tmp_path).items()}
    models = {"1-row JSON": str(ARTIFACT / "model.onnx"), PANDAS32: str(pipeline_model().onnx_file)}
    code = f"""
import asyncio, json
from mlserver.settings import ModelSettings, ModelParameters
from mlserver.types import InferenceRequest
from bench.mlserver_runtime import OnnxModel
async def main():
    answers = {{}}
    for name, onnx_file in {models!r}.items():
        model = OnnxModel(ModelSettings(name="m", implementation=OnnxModel, parameters=ModelParameters(uri=onnx_file)))
        await model.load()
        request = InferenceRequest.model_validate_json(open({bodies!r}[name]).read())
        answers[name] = json.loads((await model.predict(request)).model_dump_json())
    print(json.dumps(answers))
asyncio.run(main())
"""
    # WHEN each request is answered
    out = subprocess.run(
        [str(PEERS_PYTHON), "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True, timeout=120
    )
    answers = json.loads(out.stdout.strip().splitlines()[-1])

    # THEN the digits model labels its row, and the pipeline its 32 rows with the estimator's labels
    sample = json.loads((ARTIFACT / "sample-response.json").read_text())
    assert v2_first_output(answers["1-row JSON"]) == sample["predictions"][:1]
    assert v2_first_output(answers[PANDAS32]) == (pipeline_model().expected * 3)[:SPLIT_ROWS]


def test_interleaved_pairs_alternate_and_take_each_pairs_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN two sides that record when they are loaded, one twice as fast as the other
    calls: list[str] = []

    def side(label: str, rate: float) -> Side:
        def measure(seconds: float) -> Slice:
            calls.append(label)
            return Slice(rate * seconds * len(calls), non_2xx=1 if label == PEER else 0)

        return Side(label, measure)

    # WHEN three pairs are measured
    found = interleave({PANDAS32: [side(OURS, 2.0), side(PEER, 1.0)]}, pairs=3, slice_sec=1.0)

    # THEN the order alternates, each ratio is its own pair's, and the table prints them
    assert calls == [OURS, PEER, PEER, OURS, OURS, PEER]
    samples = found[PANDAS32]
    assert samples.ratios(OURS, PEER) == pytest.approx([2 / 2, 8 / 3, 10 / 6])
    assert samples.non_2xx == {OURS: 0, PEER: 3}
    table = peers_table(found)
    assert table[-1] == f"ours / MLServer, {PANDAS32}: 1.7x"
    assert "| 1.67x (1.00-2.67) |" in table[2]
    assert "pair 3" in capsys.readouterr().out


def test_ceilings_table_names_every_row() -> None:
    # GIVEN one measured row and one that ours refused
    measured = Samples({OURS: [6.0, 8.0], CEILING: [10.0, 10.0], RAW: [20.0, 10.0]}, {OURS: 0, CEILING: 0, RAW: 0})
    table = ceilings_table({JSON1: measured, "32-row .npy": "400 {}"}, "granian")

    # THEN each row has its own ratios (medians of the pairs' own), and a refused row says what it answered
    assert "| 1-row JSON, 64 connections | 7 | 0.70 (0.60-0.80) | 0.55 (0.30-0.80) | 0.75 (0.50-1.00) |" in table
    assert any("not measured: ours answers 400 {}" in line for line in table)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("wrk") is None, reason="the bench loads servers with wrk, which is not installed")
def test_one_realtime_row_runs_against_its_ceiling(tmp_path: Path) -> None:
    # GIVEN the wrk script, as the bench writes it
    script = tmp_path / "post.lua"
    script.write_text(WRK_SCRIPT)

    # WHEN the 1-row JSON row is measured in one pair of one-second slices on real servers
    found = measure_rows(tmp_path, script, "granian", pairs=1, names=(JSON1,), slice_sec=1.0)

    # THEN ours, its ceiling and raw onnxruntime each have a figure, and ours answered every request
    samples = found[JSON1]
    assert isinstance(samples, Samples)
    assert all(len(rates) == 1 and rates[0] > 0 for rates in samples.rows_per_sec.values())
    assert samples.non_2xx[OURS] == 0
    assert np.isfinite(samples.ratio(OURS, CEILING))
