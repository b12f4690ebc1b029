"""The model zoo (tests/zoo.py) as users bring it: each model pushed with one `servestack models push` command
from a scratch project, served under one `local up` with IAM enforced, and its answers compared with the
estimator's own (labels exactly, numbers within float32 tolerance).

One serving.yaml keeps the module to one `local up`:
- realtime: one multi-model endpoint holding all six models (`TargetModel`), since SageMaker's multi-model
  mode is the one way to serve six models from one endpoint, and each endpoint is a process of its own;
- serverless: one function per model, all six (a function serves its own model only);
- async: the pipeline, the one-target regressor and the HistGradientBoosting NaN model: async runs the same
  handler as serverless behind a queue, so three models, one of each input kind (named [N, 1] columns with a
  string, a named [N, k] input, NaN), cover its decode paths at a third of the processes;
- batch: the same three: the pipeline on Fargate with an id column (the one runner that reads and writes
  Parquet), over Parquet with a string column (typed Parquet out, joined by id), then over Parquet, JSON Lines
  of records and CSV with a header together; the regressor on Lambda over JSON Lines of records with an id
  column; the NaN model on Lambda over CSV with a header and empty cells for NaN.

The pipeline gets every request form (dataframe_split, dataframe_records, instances of row objects, inputs by
column, CSV with a header) in every online mode, each giving the same answer. The newcomer's two models (the
diabetes GradientBoostingRegressor and the ColumnTransformer pipeline) run in all four modes, no hook."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from servestack.client import AsyncJobsClient, SigV4
from servestack.conversion import worst_row
from servestack.local.batch.data import batch_location
from servestack.local.emulator.callers import developer, signed
from tests.e2e.conftest import LocalUp, start_local_up
from tests.zoo import ZooModel

pytestmark = pytest.mark.slow
SERVESTACK = str(Path(sys.executable).parent / "servestack")
REGION = "us-east-1"
ROWS = 8  # rows per request: enough to hold every class, NaN rows and rows without
PIPELINE, REGRESSOR = "wine-pipeline", "diabetes-gbr"
ALL = [PIPELINE, REGRESSOR, "linnerud-multi", "news-tfidf", "cancer-hgb-nan", "diabetes-int"]
QUEUED = [PIPELINE, REGRESSOR, "cancer-hgb-nan"]  # the models of the async and batch deployments
SINGLE_INPUT = {REGRESSOR, "linnerud-multi", "cancer-hgb-nan"}  # one [N, k] input: named by --sample
ENDPOINT = "zoo-realtime"
FORMS = ["dataframe_split", "dataframe_records", "instances", "inputs", "csv"]
ID = "row_id"
# A few rows of the training frame as the push's sample: the serverless pre-traffic hook carries the sample
# request and response in its environment (at most 3,500 bytes), so the whole frame would not deploy.
SAMPLE_ROWS = 3


@dataclass
class Served:
    up: LocalUp
    root: Path
    zoo: dict[str, ZooModel]
    index: dict[str, np.ndarray]  # the sample rows each model is asked about

    def runtime(self) -> Any:
        return self.up.client("sagemaker-runtime")

    def keys(self) -> Any:
        return developer(self.up.state)


def request_rows(model: ZooModel) -> np.ndarray:
    """ROWS rows spread over the sample; for a model with NaN, half with a missing value and half without."""
    if model.name == "cancer-hgb-nan":
        missing = np.isnan(model.feed()["input"]).any(axis=1)
        return np.concatenate([np.flatnonzero(missing)[: ROWS // 2], np.flatnonzero(~missing)[: ROWS // 2]])
    return np.linspace(0, model.rows - 1, ROWS).astype(np.int64)


def columns_of(model: ZooModel, index: np.ndarray) -> dict[str, list[Any]]:
    """The rows at `index` by column name, as a user's DataFrame holds them (NaN as None, JSON's null)."""
    rows = model.sample_rows(index)
    if not hasattr(rows, "column_names"):
        return {"text": [str(text) for text in rows]}
    return {
        name: [None if isinstance(v, float) and np.isnan(v) else v for v in rows.column(name).to_pylist()]
        for name in rows.column_names
    }


def body(form: str, columns: dict[str, list[Any]]) -> tuple[bytes, str]:
    """A request in `form`, its columns in reverse order (columns are matched by name)."""
    names = list(reversed(columns))
    count = len(columns[names[0]])
    records = [{name: columns[name][row] for name in names} for row in range(count)]
    if form == "csv":
        text = io.StringIO()
        writer = csv.writer(text, lineterminator="\n")
        writer.writerow(names)
        writer.writerows([["" if value is None else value for value in record.values()] for record in records])
        return text.getvalue().encode(), "text/csv; header=present"
    documents: dict[str, dict[str, Any]] = {
        "dataframe_split": {"dataframe_split": {"columns": names, "data": [list(r.values()) for r in records]}},
        "dataframe_records": {"dataframe_records": records},
        "instances": {"instances": records},
        "inputs": {"inputs": {name: columns[name] for name in names}},
    }
    return json.dumps(documents[form]).encode(), "application/json"


def assert_answers_as_the_estimator(model: ZooModel, index: np.ndarray, answer: dict[str, Any], how: str = "") -> None:
    """Labels exactly (strings or ints, as trained), probabilities and regression values within float32
    tolerance; `how` names the request in a failure."""
    expected = model.expected(index)
    where = f"{model.name} {how}"
    if model.classifier:
        labels = expected["label"].tolist()
        assert answer["predictions"] == labels, where
        assert answer["labels"] == labels, where
        mismatch = worst_row("probabilities", expected["probabilities"], np.array(answer["probabilities"]))
        assert mismatch is None, f"{where}: {mismatch}"
        return
    predictions = np.array(answer["predictions"], dtype=np.float64)
    assert predictions.shape == expected["variable"].shape, where  # flat for one target, [N, 2] for two
    mismatch = worst_row("variable", expected["variable"], predictions)
    assert mismatch is None, f"{where}: {mismatch}"


# ------------------------------------------------------------------------------------------ the project


def push_commands(zoo: dict[str, ZooModel], folder: Path) -> list[list[str]]:
    """One `models push` per model, as a user types it in the project folder (its ONNX file there); a single
    [N, k] input takes its column names from a Parquet sample (the training frame's first rows), and the NaN
    model says it handles missing values."""
    commands = []
    for name in ALL:
        model = zoo[name]
        shutil.copy(model.onnx_path, folder / f"{name}.onnx")
        command = ["models", "push", f"{name}.onnx", "--name", name]
        if name in SINGLE_INPUT:
            pq.write_table(model.sample.slice(0, SAMPLE_ROWS), folder / f"{name}.parquet")
            command += ["--sample", f"{name}.parquet"]
        if name == "cancer-hgb-nan":
            command += ["--allow-nan"]
        commands.append(command)
    return commands


def serving_yaml() -> dict[str, Any]:
    deployments: dict[str, Any] = {
        ENDPOINT: {"mode": "realtime", "model": PIPELINE, "multi_model": True, "instance_type": "ml.c5.large"},
    }
    deployments |= {f"{name}-api": {"mode": "serverless", "model": name} for name in ALL}
    deployments |= {f"{name}-async": {"mode": "async", "model": name} for name in QUEUED}
    deployments[f"{PIPELINE}-batch"] = {
        "mode": "batch",
        "model": PIPELINE,
        "runner": "fargate",
        "output_format": "parquet",
        "id_column": ID,
    }
    deployments[f"{REGRESSOR}-batch"] = {"mode": "batch", "model": REGRESSOR, "input_format": "jsonl", "id_column": ID}
    deployments["cancer-hgb-nan-batch"] = {"mode": "batch", "model": "cancer-hgb-nan", "input_format": "csv"}
    return {"models": [{"name": name, "version": 1} for name in ALL], "deployments": deployments}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, zoo: dict[str, ZooModel]) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("zoo-project")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SERVESTACK_", "AWS_"))}
    env["PYTHONUNBUFFERED"] = "1"
    # a new project: an empty serving.yaml of its own, and what `servestack init` writes around it
    (root / "serving.yaml").touch()
    init = subprocess.run([SERVESTACK, "init", str(root)], env=env, capture_output=True, text=True, check=False)
    assert init.returncode == 0, init.stderr
    # GIVEN each zoo model pushed with one command (the six at once: each writes its own package)
    pushes = [
        subprocess.Popen([SERVESTACK, *command], cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for command in push_commands(zoo, root)
    ]
    for push in pushes:
        output, _ = push.communicate(timeout=300)
        assert push.returncode == 0, output.decode(errors="replace")[-3000:]
    (root / "serving.yaml").write_text(yaml.safe_dump(serving_yaml(), sort_keys=False))
    # WHEN local up serves them in all four modes
    up = start_local_up(root, cwd=root, env=env, found_state=root / ".servestack" / "local.json", timeout_sec=240)
    try:
        assert up.state["iam_enforced"] is True
        yield Served(up, root, zoo, {name: request_rows(zoo[name]) for name in ALL})
    finally:
        assert up.stop() == 0, up.log_text()[-4000:]


# ------------------------------------------------------------------------------------------ the modes


def realtime(served: Served, name: str, data: bytes, content_type: str) -> dict[str, Any]:
    """InvokeEndpoint on the multi-model endpoint, the model named by its TargetModel (as boto3 is called)."""
    endpoint = served.up.deployment(ENDPOINT)["endpoint_name"]
    response = served.runtime().invoke_endpoint(
        EndpointName=endpoint, TargetModel=f"{name}/1.tar.gz", ContentType=content_type, Body=data
    )
    answer: dict[str, Any] = json.loads(response["Body"].read())
    return answer


def serverless(served: Served, name: str, data: bytes, content_type: str) -> dict[str, Any]:
    """The HTTP API, signed with SigV4 by the developer's keys."""
    url = served.up.deployment(f"{name}-api")["url"]
    status, answer = signed("POST", f"{url}/invocations", served.keys(), REGION, body=data,
                            headers={"Content-Type": content_type})  # fmt: skip
    assert status == 200, answer[:2000]
    found: dict[str, Any] = json.loads(answer)
    return found


def asynchronous(served: Served, name: str, data: bytes, content_type: str) -> dict[str, Any]:
    """A job through the async deployment's API (signed), waited for, its result read."""
    keys = served.keys()
    session = boto3.session.Session(
        aws_access_key_id=keys.access_key_id,
        aws_secret_access_key=keys.secret_access_key,
        aws_session_token=keys.session_token,
    )
    url = served.up.deployment(f"{name}-async")["url"]
    with AsyncJobsClient(url, auth=SigV4(REGION, "execute-api", session=session)) as jobs:
        final = jobs.wait(jobs.submit(data, content_type), timeout_sec=120)
        assert final["status"] == "succeeded", final
        found: dict[str, Any] = json.loads(jobs.result(final))
        return found


MODES: dict[str, Callable[[Served, str, bytes, str], dict[str, Any]]] = {
    "realtime": realtime,
    "serverless": serverless,
    "async": asynchronous,
}


def ask(served: Served, mode: str, name: str, form: str) -> dict[str, Any]:
    model = served.zoo[name]
    data, content_type = body(form, columns_of(model, served.index[name]))
    return MODES[mode](served, name, data, content_type)


@pytest.mark.parametrize("mode", ["realtime", "serverless"])
@pytest.mark.parametrize("name", ALL)
def test_every_zoo_model_answers_as_its_estimator_online(served: Served, mode: str, name: str) -> None:
    # WHEN the model is asked about its rows by column name (MLflow's dataframe_split)
    answer = ask(served, mode, name, "dataframe_split")
    # THEN its answers are the estimator's
    assert (answer["model"], answer["version"]) == (name, "1")
    assert_answers_as_the_estimator(served.zoo[name], served.index[name], answer)


@pytest.mark.parametrize("name", QUEUED)
def test_async_jobs_answer_as_the_estimator(served: Served, name: str) -> None:
    answer = ask(served, "async", name, "dataframe_records")
    assert_answers_as_the_estimator(served.zoo[name], served.index[name], answer)


@pytest.mark.parametrize("mode", list(MODES))
def test_every_request_form_gives_the_pipeline_the_same_answer(served: Served, mode: str) -> None:
    # GIVEN the pipeline's rows in each request form (a string column, columns in another order than trained)
    answers = {form: ask(served, mode, PIPELINE, form) for form in FORMS}
    # THEN every form answers as the estimator, and all say the same
    for form, answer in answers.items():
        assert_answers_as_the_estimator(served.zoo[PIPELINE], served.index[PIPELINE], answer, f"{mode} {form}")
    first = answers["dataframe_split"]
    assert all(answer == first for answer in answers.values()), {f: a["labels"] for f, a in answers.items()}


# ------------------------------------------------------------------------------------------ batch


def run_batch(served: Served, name: str) -> dict[str, Any]:
    """`servestack local run-batch`, as the user runs it; the run's manifest."""
    done = subprocess.run(
        [SERVESTACK, "local", "run-batch", name, "--state", str(served.up.state_path)],
        cwd=served.root, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    bucket, _, output = batch_location(served.up.state, name)
    manifest: dict[str, Any] = json.loads(read(served, bucket, f"{output}manifest.json"))
    return manifest


def read(served: Served, bucket: str, key: str) -> bytes:
    return bytes(served.up.emulator("s3").get_object(Bucket=bucket, Key=key)["Body"].read())


def put_input(served: Served, name: str, files: dict[str, bytes]) -> None:
    bucket, prefix, _ = batch_location(served.up.state, name)
    for key, data in files.items():
        served.up.emulator("s3").put_object(Bucket=bucket, Key=f"{prefix}{key}", Body=data)


def output_rows(served: Served, name: str, manifest: dict[str, Any]) -> list[dict[str, Any]]:
    bucket, _, output = batch_location(served.up.state, name)
    rows: list[dict[str, Any]] = []
    for part in manifest["parts"]:
        data = read(served, bucket, f"{output}{part['key']}")
        if part["key"].endswith(".parquet"):
            rows += pq.read_table(pa.BufferReader(data)).to_pylist()
        else:
            rows += [json.loads(line) for line in data.splitlines()]
    return rows


def ids_for(index: np.ndarray) -> list[int]:
    """Ids that are not the row positions, so predictions must be joined by id."""
    return [5000 - 3 * int(row) for row in index]


def expected_by_id(model: ZooModel, index: np.ndarray) -> dict[Any, tuple[Any, np.ndarray | None]]:
    expected = model.expected(index)
    if model.classifier:
        return {
            i: (label, p)
            for i, label, p in zip(ids_for(index), expected["label"], expected["probabilities"], strict=True)
        }
    return {i: (value, None) for i, value in zip(ids_for(index), expected["variable"], strict=True)}


def pipeline_batch_files(served: Served) -> dict[str, bytes]:
    """The pipeline's rows with an id column first (ids not in row order), as Parquet (a string column), JSON
    Lines of records and CSV with a header."""
    model, index = served.zoo[PIPELINE], served.index[PIPELINE]
    columns = {ID: ids_for(index), **columns_of(model, index)}
    table = pa.table({ID: pa.array(columns[ID], pa.int64()), **{k: v for k, v in columns.items() if k != ID}})
    sink = io.BytesIO()
    pq.write_table(table, sink)
    csv_body, _ = body("csv", {k: [str(v) for v in values] for k, values in columns.items()})
    return {
        "rows.parquet": sink.getvalue(),
        "rows.jsonl": "\n".join(json.dumps(record) for record in table.to_pylist()).encode(),
        "rows.csv": csv_body,
    }


def row_id(row: dict[str, Any]) -> int:
    """A row's id: an int, CSV's text, or, in a Parquet part that mixes the two, each id's JSON text (the
    encoder's rule for a column of mixed kinds)."""
    value = row[ID]
    return int(json.loads(value)) if isinstance(value, str) else int(value)


def assert_pipeline_rows_joined_by_id(served: Served, found: list[dict[str, Any]], copies: int) -> None:
    """Joined by id, every row's prediction is the estimator's label and its `proba_<label>` columns its
    probabilities (within float32 tolerance)."""
    model, index = served.zoo[PIPELINE], served.index[PIPELINE]
    expected = expected_by_id(model, index)
    assert sorted(map(row_id, found)) == sorted(list(expected) * copies)
    classes = model.estimator.classes_.tolist()
    for row in found:
        label, probabilities = expected[row_id(row)]
        assert row["prediction"] == label
        got = np.array([[row[f"proba_{name}"] for name in classes]])
        assert worst_row("probabilities", np.array([probabilities]), got) is None, row


def test_newcomers_pipeline_batch_parquet_with_strings_and_an_id_gives_typed_parquet_joined_by_id(
    served: Served,
) -> None:
    # GIVEN the pipeline's rows as Parquet with a string column and an id column, under the Fargate deployment's
    # input prefix
    put_input(served, f"{PIPELINE}-batch", {"rows.parquet": pipeline_batch_files(served)["rows.parquet"]})
    # WHEN the deployment runs
    manifest = run_batch(served, f"{PIPELINE}-batch")
    # THEN every row is scored (none of local up's seeded sample) into typed Parquet: the id as in the input, the
    # prediction a string, a float32 column per class label
    assert manifest["rows"] == {"total": ROWS, "succeeded": ROWS, "failed": 0}
    bucket, _, output = batch_location(served.up.state, f"{PIPELINE}-batch")
    labels = served.zoo[PIPELINE].estimator.classes_.tolist()
    for part in manifest["parts"]:
        schema = pq.read_schema(pa.BufferReader(read(served, bucket, f"{output}{part['key']}")))
        assert schema.field(ID).type == pa.int64()
        assert schema.field("prediction").type == pa.string()
        assert all(schema.field(f"proba_{label}").type == pa.float32() for label in labels)
    # AND joined by id, the predictions are the estimator's
    assert_pipeline_rows_joined_by_id(served, output_rows(served, f"{PIPELINE}-batch", manifest), 1)


def test_pipeline_batch_json_lines_of_records_and_csv_with_a_header_map_columns_the_same_way(served: Served) -> None:
    # GIVEN the same rows as Parquet, as JSON Lines of records and as CSV with a header, in one input prefix
    put_input(served, f"{PIPELINE}-batch", pipeline_batch_files(served))
    # WHEN the deployment runs / THEN each file's rows, joined by id, are the estimator's
    manifest = run_batch(served, f"{PIPELINE}-batch")
    assert manifest["rows"] == {"total": 3 * ROWS, "succeeded": 3 * ROWS, "failed": 0}
    found = output_rows(served, f"{PIPELINE}-batch", manifest)
    assert {str(row["file"]).rsplit(".", 1)[1] for row in found} == {"parquet", "jsonl", "csv"}
    assert_pipeline_rows_joined_by_id(served, found, 3)


def test_newcomers_regressor_batch_over_json_lines_of_records_joined_by_id(served: Served) -> None:
    model, index = served.zoo[REGRESSOR], served.index[REGRESSOR]
    records = [{ID: i, **row} for i, row in zip(ids_for(index), model.sample_rows(index).to_pylist(), strict=True)]
    put_input(served, f"{REGRESSOR}-batch", {"rows.jsonl": "\n".join(map(json.dumps, records)).encode()})
    manifest = run_batch(served, f"{REGRESSOR}-batch")
    assert manifest["rows"] == {"total": ROWS, "succeeded": ROWS, "failed": 0}
    expected = expected_by_id(model, index)
    found = {row[ID]: row["prediction"] for row in output_rows(served, f"{REGRESSOR}-batch", manifest)}
    assert sorted(found) == sorted(expected)
    want = np.array([expected[i][0] for i in sorted(found)])
    assert worst_row("variable", want, np.array([found[i] for i in sorted(found)], dtype=np.float64)) is None


def test_batch_nan_model_over_csv_with_empty_cells(served: Served) -> None:
    model, index = served.zoo["cancer-hgb-nan"], served.index["cancer-hgb-nan"]
    csv_body, _ = body("csv", columns_of(model, index))
    assert any("" in cells for cells in csv.reader(io.StringIO(csv_body.decode())))  # NaN as empty cells
    put_input(served, "cancer-hgb-nan-batch", {"rows.csv": csv_body})
    manifest = run_batch(served, "cancer-hgb-nan-batch")
    assert manifest["rows"] == {"total": ROWS, "succeeded": ROWS, "failed": 0}
    found = sorted(output_rows(served, "cancer-hgb-nan-batch", manifest), key=lambda row: row["line"])
    assert [row["prediction"] for row in found] == model.expected(index)["label"].tolist()


# ------------------------------------------------------------------------------------------ the newcomer


@pytest.mark.parametrize("name", [REGRESSOR, PIPELINE])
def test_the_newcomers_two_models_answer_online_with_no_hook(served: Served, name: str) -> None:
    """The newcomer's models online; their batch runs are the two `test_newcomers_*_batch_*` tests above."""
    # GIVEN the newcomer's models as pushed: no process.py hook
    package = served.root / "models/artifacts" / name / "1"
    assert not (package / "process.py").exists()
    assert json.loads((package / "manifest.json").read_text()).get("process_sha256") is None
    # WHEN each online mode is asked / THEN each answers as the estimator
    for mode in MODES:
        answer = ask(served, mode, name, "dataframe_split")
        assert_answers_as_the_estimator(served.zoo[name], served.index[name], answer)
