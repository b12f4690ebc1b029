"""A text classifier pushed with its Hugging Face tokenizer (`models push --tokenizer tokenizer.json`), no hook,
served in all four modes under `local up`: each deployment installs `tokenizers` because the package declares
it, and answers texts (a `text/plain` body, a JSON list, a batch job's lines of text) with the logits torch
computed for them (tests/fixtures/deep_learning/export_text.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from tests.e2e.conftest import LocalUp, start_local_up
from tests.e2e.test_docs import Block, parse_blocks

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
SERVESTACK = str(Path(sys.executable).parent / "servestack")
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "deep_learning" / "text"
EXPECTED: dict[str, Any] = json.loads((FIXTURE / "expected.json").read_text())
SENTENCES = [entry["text"] for entry in EXPECTED["sentences"]]
LOGITS = np.array([entry["logits"] for entry in EXPECTED["sentences"]], dtype=np.float32)
MODES = {"rt": "realtime", "api": "serverless", "jobs": "async", "nightly": "batch"}
TOLERANCE = 1e-4


DOCUMENT = "docs/deep-learning.md"


def doc_blocks() -> list[Block]:
    """docs/deep-learning.md's blocks this module runs as written: the push command, serving.yaml, the sends."""
    text = (Path(__file__).resolve().parents[2] / DOCUMENT).read_text(encoding="utf-8")
    tested = [b for b in parse_blocks(text, DOCUMENT) if b.marker is not None and b.marker.kind == "tested"]
    return [b for b in tested if b.marker is not None and Path(__file__).name in b.marker.text]


@dataclass
class Project:
    root: Path
    env: dict[str, str]
    sends: Block | None = None

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([SERVESTACK, *args], cwd=self.root, env=self.env, capture_output=True, text=True,
                              timeout=600, check=False)  # fmt: skip
        assert done.returncode == 0, f"servestack {' '.join(args)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done

    def shell(self, block: Block) -> str:
        """A docs block run as written by `bash -e -o pipefail`, with this environment's servestack first on PATH."""
        path = f"{Path(SERVESTACK).parent}{os.pathsep}{self.env['PATH']}"
        done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.text], cwd=self.root,
                              env={**self.env, "PATH": path}, capture_output=True, text=True, timeout=600,
                              check=False)  # fmt: skip
        assert done.returncode == 0, f"{block.where}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done.stdout


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    root = tmp_path_factory.mktemp("text-modes")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SERVESTACK_"))}
    made = Project(root, env)
    made.cli("init", ".")
    push, spec, sends = doc_blocks()
    for name in ("text_classifier.onnx", "tokenizer.json"):
        (root / name).write_bytes((FIXTURE / name).read_bytes())
    # GIVEN the classifier pushed with its tokenizer, with one command (the docs' own)
    assert f"--max-length input_ids={EXPECTED['max_length']}" in push.text
    made.shell(push)
    # AND the docs' serving.yaml: the classifier in all four modes
    (root / "serving.yaml").write_text(spec.text)
    assert set(yaml.safe_load(spec.text)["deployments"]) == {f"sentiment-{suffix}" for suffix in MODES}
    made.sends = sends
    (root / "texts.json").write_text(json.dumps({"instances": SENTENCES}))
    (root / "one.txt").write_text(SENTENCES[0])
    too_long = [2] + [5] * (EXPECTED["max_length"] + 4) + [3]
    bad = {"past-vocabulary": [2, 1_000_000, 3], "too-long": too_long}
    for name, ids in bad.items():
        (root / f"{name}.json").write_text(
            json.dumps({"instances": [{"input_ids": ids, "attention_mask": [1] * len(ids)}]})
        )
    (root / "bad.jsonl").write_text(
        "".join(json.dumps({"input_ids": ids, "attention_mask": [1] * len(ids)}) + "\n" for ids in bad.values())
    )
    ragged = [{"input_ids": entry["ids"], "attention_mask": [1] * len(entry["ids"])} for entry in EXPECTED["sentences"]]
    assert len({len(row["input_ids"]) for row in ragged}) > 1  # ragged: the sentences' token counts differ
    (root / "ragged.json").write_text(json.dumps({"instances": ragged}))
    (root / "ragged.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ragged))
    (root / "texts.jsonl").write_text("".join(json.dumps(text) + "\n" for text in SENTENCES))
    up: LocalUp = start_local_up(root, "--fresh", cwd=root, env=env, timeout_sec=600,
                                 found_state=root / ".servestack" / "local.json")  # fmt: skip
    try:
        yield made
    finally:
        assert up.stop() == 0


def close_to_torch(answer: Any, rows: slice | list[int], where: str) -> None:
    """A logits model's answer (its output named `logits`): softmax as `probabilities`, argmax as `predictions`."""
    logits = LOGITS[rows]
    softmax = np.exp(logits - logits.max(axis=1, keepdims=True))
    softmax /= softmax.sum(axis=1, keepdims=True)
    found = np.asarray(answer["probabilities"], dtype=np.float32)
    assert found.shape == logits.shape, where
    assert np.abs(found - softmax).max() < TOLERANCE, (where, found, softmax)
    assert answer["predictions"] == logits.argmax(axis=1).tolist(), where


@pytest.mark.parametrize("suffix", ["rt", "api", "jobs"])
def test_an_online_deployment_answers_texts_as_torch_does(project: Project, suffix: str) -> None:
    # WHEN a JSON list of texts is sent to the deployment
    listed = json.loads(project.cli("invoke", f"sentiment-{suffix}", "--data", "texts.json").stdout)
    # THEN it answers torch's logits (the long texts truncated to the model's maximum length)
    close_to_torch(listed, slice(None), f"sentiment-{suffix} list")
    # AND one text sent as text/plain too
    plain = project.cli("invoke", f"sentiment-{suffix}", "--data", "one.txt", "--content-type", "text/plain")
    close_to_torch(json.loads(plain.stdout), [0], f"sentiment-{suffix} text/plain")


def test_a_batch_job_answers_each_line_of_text(project: Project, tmp_path: Path) -> None:
    # WHEN a batch job reads lines, each a text
    project.cli("local", "put-input", "sentiment-nightly", "texts.jsonl")
    scores = tmp_path / "scores.jsonl"
    project.cli("local", "run-batch", "sentiment-nightly", "--download", str(scores))
    every = [json.loads(line) for line in scores.read_text().splitlines() if line.strip()]
    rows = sorted((row for row in every if row["file"].endswith("texts.jsonl")), key=lambda row: row["line"])
    # THEN a row per line, each torch's logits for its text
    close_to_torch(
        {"predictions": [row["prediction"] for row in rows], "probabilities": [row["probabilities"] for row in rows]},
        slice(None),
        "sentiment-nightly",
    )


def invoke_refused(project: Project, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SERVESTACK, "invoke", *args], cwd=project.root, env=project.env, capture_output=True,
                          text=True, timeout=600, check=False)  # fmt: skip


@pytest.mark.parametrize("suffix", ["rt", "api", "jobs"])
@pytest.mark.parametrize("case", ["past-vocabulary", "too-long"])
def test_ids_past_the_vocabulary_and_sequences_past_the_maximum_are_400s_online(
    project: Project, suffix: str, case: str
) -> None:
    # WHEN token ids past the vocabulary, or more than the model's positions, are sent directly
    done = invoke_refused(project, f"sentiment-{suffix}", "--data", f"{case}.json")
    # THEN the request's error (InvalidInput, the adapters' 400; the endpoint's error says "client error (400)")
    # naming the input, the row and the bound, never a 500
    said = done.stdout + done.stderr
    assert done.returncode != 0, said
    error = json.loads(said[said.index("{") : said.rindex("}") + 1].replace('\\"', '"'))
    error = error.get("error", error)
    assert error["type"] == "InvalidInput", said
    assert error["field"].startswith("instances.input_ids[0]"), said
    assert error["allowed"] == (
        "ids 0..91" if case == "past-vocabulary" else f"at most {EXPECTED['max_length']} values"
    )
    if suffix == "rt":
        assert "client error (400)" in said, said


def test_ids_past_the_bounds_are_error_rows_in_batch(project: Project, tmp_path: Path) -> None:
    # WHEN a batch job reads lines of such ids
    project.cli("local", "put-input", "sentiment-nightly", "bad.jsonl")
    scores = tmp_path / "bad-scores.jsonl"
    argv = [SERVESTACK, "local", "run-batch", "sentiment-nightly", "--download", str(scores)]
    done = subprocess.run(argv, cwd=project.root, env=project.env, capture_output=True, text=True, timeout=600)
    # THEN each line is an error row naming the input and its bound
    assert scores.exists(), done.stdout + done.stderr
    refused = [row for row in map(json.loads, scores.read_text().splitlines()) if row["file"].endswith("bad.jsonl")]
    assert [row["error"]["allowed"] for row in refused] == ["ids 0..91", f"at most {EXPECTED['max_length']} values"]
    assert all(row["error"]["type"] == "InvalidInput" and row["prediction"] is None for row in refused)


def test_the_docs_sends_run_as_written(project: Project) -> None:
    # WHEN the docs' invoke commands run as written
    assert project.sends is not None
    printed = project.shell(project.sends)
    # THEN each prints an answer: one text (twice, text/plain) and the list of texts
    answers, decoder, at = [], json.JSONDecoder(), printed.find("{")
    while at != -1:
        answer, end = decoder.raw_decode(printed, at)
        answers.append(answer)
        at = printed.find("{", end)
    assert [len(answer["predictions"]) for answer in answers] == [1, len(SENTENCES), 1], printed


@pytest.mark.parametrize("suffix", ["rt", "api", "jobs"])
def test_ragged_token_ids_are_padded_and_answered_as_torch_does(project: Project, suffix: str) -> None:
    # WHEN the sentences' token ids, of different lengths, are sent directly (no tokenizer on the way)
    answer = json.loads(project.cli("invoke", f"sentiment-{suffix}", "--data", "ragged.json").stdout)
    # THEN they are padded with the tokenizer's pad id, masked, and answered with torch's logits
    close_to_torch(answer, slice(None), f"sentiment-{suffix} ragged ids")


def test_a_batch_job_answers_lines_of_ragged_ids(project: Project, tmp_path: Path) -> None:
    project.cli("local", "put-input", "sentiment-nightly", "ragged.jsonl")
    scores = tmp_path / "ragged-scores.jsonl"
    project.cli("local", "run-batch", "sentiment-nightly", "--download", str(scores))
    rows = [json.loads(line) for line in scores.read_text().splitlines() if line.strip()]
    ragged = sorted((row for row in rows if row["file"].endswith("ragged.jsonl")), key=lambda row: row["line"])
    close_to_torch(
        {
            "predictions": [row["prediction"] for row in ragged],
            "probabilities": [row["probabilities"] for row in ragged],
        },
        slice(None),
        "sentiment-nightly ragged ids",
    )
