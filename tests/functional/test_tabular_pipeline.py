"""A user's own tabular model end to end: a scikit-learn Pipeline with a ColumnTransformer (scaled numeric
columns, a one-hot string column) and string class labels, converted with skl2onnx and packaged as `models push`
does (tests/pipeline_model.py), served by the real container entry (a server process) and by the real Lambda
module on a real API Gateway event. Every request form's answer is compared with the estimator's own."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from servestack.inference.packaging import build_package, create_package
from servestack.inference.service import ServedModel
from servestack.inference.settings import ServingSettings
from tests.conftest import REPO_ROOT, RealtimeServer, lambda_event
from tests.pipeline_model import COLUMNS, SPECIES, PipelineModel, pipeline_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def built() -> PipelineModel:
    return pipeline_model()


@pytest.fixture(scope="module")
def server(built: PipelineModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealtimeServer]:
    env = {"SERVESTACK_MODEL_DIR": str(built.root), "SERVESTACK_DEFAULT_MODEL": "flowers"}
    started = RealtimeServer.start(tmp_path_factory.mktemp("pipeline-server"), env=env)
    yield started
    started.stop()


def rows_of(built: PipelineModel) -> list[list[Any]]:
    return [[built.rows[name][i] for name in COLUMNS] for i in range(len(built.expected))]


# The request forms `request_forms` writes (named here so that collecting the module builds no model).
FORMS = (
    "csv whose first row is the names",
    "csv, header=present",
    "dataframe_records",
    "dataframe_split",
    "inputs by column",
    "instances of objects",
)


def request_forms(built: PipelineModel) -> dict[str, tuple[bytes, str]]:
    rows = rows_of(built)
    records = [{name: row[COLUMNS.index(name)] for name in reversed(COLUMNS)} for row in rows]
    header = "site,petal_width,petal_length,sepal_width,sepal_length"  # another order than the model's
    order = [COLUMNS.index(name) for name in header.split(",")]
    csv_rows = "\n".join(",".join(str(row[i]) for i in order) for row in rows)
    return {
        "dataframe_split": (
            orjson.dumps(
                {"dataframe_split": {"columns": list(COLUMNS), "data": rows, "index": list(range(len(rows)))}}
            ),
            "application/json",
        ),
        "dataframe_records": (orjson.dumps({"dataframe_records": records}), "application/json"),
        "instances of objects": (orjson.dumps({"instances": records}), "application/json"),
        "inputs by column": (orjson.dumps({"inputs": built.rows}), "application/json"),
        "csv, header=present": (f"{header}\n{csv_rows}\n".encode(), "text/csv; header=present"),
        "csv whose first row is the names": (f"{header}\n{csv_rows}\n".encode(), "text/csv"),
    }


@pytest.mark.parametrize("form", FORMS)
def test_every_form_answers_what_the_estimator_predicts(
    server: RealtimeServer, built: PipelineModel, form: str
) -> None:
    # GIVEN the pipeline served by the container entry
    forms = request_forms(built)
    assert sorted(forms) == list(FORMS)  # every form it writes is one of the parameters
    body, content_type = forms[form]
    # WHEN the rows are sent in this form
    answer = httpx.post(f"{server.url}/invocations", content=body, headers={"content-type": content_type})
    # THEN the predictions are the estimator's class names, and the probabilities its own
    assert answer.status_code == 200, answer.text
    got = answer.json()
    assert got["predictions"] == built.expected
    assert got["labels"] == built.expected
    np.testing.assert_allclose(got["probabilities"], built.probabilities, atol=1e-5)


def test_probabilities_by_label_and_csv_with_a_header(server: RealtimeServer, built: PipelineModel) -> None:
    body, content_type = request_forms(built)["dataframe_split"]
    keyed = httpx.post(
        f"{server.url}/invocations",
        content=body,
        headers={"content-type": content_type, "accept": "application/json; probabilities=by-label"},
    )
    assert keyed.status_code == 200, keyed.text
    for row, scores in zip(keyed.json()["probabilities"], built.probabilities, strict=True):
        assert list(row) == list(SPECIES)
        np.testing.assert_allclose(list(row.values()), scores, atol=1e-5)
    table = httpx.post(
        f"{server.url}/invocations",
        content=body,
        headers={"content-type": content_type, "accept": "text/csv; header=present"},
    )
    assert table.headers["content-type"] == "text/csv; header=present"
    lines = table.text.splitlines()
    assert lines[0] == "prediction,proba_setosa,proba_versicolor,proba_virginica"
    assert [line.split(",")[0] for line in lines[1:]] == built.expected
    # AND each float32 is written at its shortest text, the same as in the JSON answer
    plain = httpx.post(f"{server.url}/invocations", content=body, headers={"content-type": content_type}).json()
    assert lines[1].split(",")[1] == repr(plain["probabilities"][0][0])


@pytest.mark.parametrize(
    ("body", "field", "said"),
    [
        (
            {"dataframe_records": [{"sepal_length": 5.1, "sepal_width": 3.5, "petal_length": 1.4, "site": "north"}]},
            "dataframe_records",
            "missing column 'petal_width'; the model takes the columns "
            "['sepal_length', 'sepal_width', 'petal_length', 'petal_width', 'site']",
        ),
        (
            {"dataframe_split": {"columns": [*COLUMNS, "colour"], "data": [[5.1, 3.5, 1.4, 0.2, "north", "red"]]}},
            "dataframe_split.colour",
            "unknown column 'colour'",
        ),
        (
            {"dataframe_split": {"columns": list(COLUMNS), "data": [[5.1, None, 1.4, 0.2, "north"]]}},
            "dataframe_split.sepal_width[0]",
            "a missing value is not allowed; column 'sepal_width'",
        ),
        (
            {"dataframe_split": {"columns": list(COLUMNS), "data": [[5.1, 3.5, 1.4, 0.2, 7]]}},
            "dataframe_split.site[0]",
            "7 (int) is not allowed; column 'site' takes strings",
        ),
        (
            {"dataframe_split": {"columns": list(COLUMNS), "data": [[5.1, 3.5, 1.4, 0.2, "atlantis"]]}},
            "site",
            "column 'site' holds 'atlantis', a category the model was not trained on",
        ),
    ],
)
def test_bad_rows_are_a_400_naming_the_column(
    server: RealtimeServer, body: dict[str, Any], field: str, said: str
) -> None:
    answer = httpx.post(f"{server.url}/invocations", content=orjson.dumps(body))
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["field"] == field
    assert said in error["message"]


def test_the_lambda_module_answers_a_records_request_on_a_real_http_api_event(built: PipelineModel) -> None:
    # GIVEN an API Gateway HTTP API event carrying dataframe_records, and the Lambda module loading the package
    body, _ = request_forms(built)["dataframe_records"]
    event = lambda_event("http-api-v2", body, headers={"content-type": "application/json"})
    script = (
        "import json, sys\n"
        "from servestack.adapters import serverless\n"
        "from tests.conftest import LambdaContext\n"
        "print(json.dumps(serverless.handler(json.load(sys.stdin), LambdaContext())))\n"
    )
    env = {"SERVESTACK_MODEL_DIR": str(built.root), "SERVESTACK_DEFAULT_MODEL": "flowers", "PATH": "/usr/bin:/bin"}
    # WHEN the function is invoked, as the Lambda runtime does, in a fresh process
    done = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps(event),
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=120,
        check=False,
    )
    # THEN it answers 200 with the estimator's predictions
    assert done.returncode == 0, done.stderr
    response = json.loads(done.stdout.splitlines()[-1])
    assert response["statusCode"] == 200, response
    assert json.loads(response["body"])["predictions"] == built.expected


HOOKS = '''
import numpy as np

COLUMNS = ("sepal_length", "sepal_width", "petal_length", "petal_width")


def preprocess(payload, content_type):
    """{"flowers": [{"size": [4 numbers], "site": "north"}, ...]} -> one array per input."""
    flowers = payload["flowers"]
    sizes = np.array([flower["size"] for flower in flowers], dtype=np.float32)
    arrays = {name: sizes[:, [i]] for i, name in enumerate(COLUMNS)}
    arrays["site"] = np.array([[flower["site"]] for flower in flowers])  # a numpy array of str ('<U5')
    return arrays


def postprocess(outputs):
    """The class name and its probability, per row."""
    best = outputs["probabilities"].max(axis=1)
    return {"species": outputs["label"].tolist(), "confidence": np.round(best, 3).tolist()}
'''


def test_a_hook_may_return_numpy_strings_for_a_string_input(built: PipelineModel, tmp_path: Path) -> None:
    # GIVEN the pipeline pushed with a process.py whose preprocess builds a '<U' array for `site`, and a sample
    # in the hook's own form
    (tmp_path / "process.py").write_text(HOOKS)
    rows = rows_of(built)
    body = {"flowers": [{"size": row[:4], "site": row[4]} for row in rows]}
    (tmp_path / "flowers.json").write_text(json.dumps(body))
    package = tmp_path / "flowers" / "2"
    build_package(
        built.onnx_file,
        package,
        name="flowers",
        version="2",
        process_file=tmp_path / "process.py",
        sample=tmp_path / "flowers.json",
    )
    # WHEN it loads as every mode loads it (warmed up: on its sample, through the hook, since the runtime's
    # zero batch of empty strings is a category the encoder never saw) and answers a request
    model = ServedModel.load(package, ServingSettings(model_dir=package, default_model="flowers"))
    assert model.runtime.warmed_up
    answer = orjson.loads(model.infer(orjson.dumps(body), "application/json", None).body)
    # THEN the strings reach the model, and the postprocess shapes the answer
    assert answer["species"] == built.expected
    np.testing.assert_allclose(answer["confidence"], built.probabilities.max(axis=1), atol=1e-3)


def test_a_package_fetched_without_its_sample_still_loads_and_serves(built: PipelineModel, tmp_path: Path) -> None:
    # GIVEN the pipeline as a registry holds it: model and manifest, no sample request to warm up on
    package = tmp_path / "flowers" / "3"
    create_package(built.onnx_file, package, name="flowers", version="3")
    assert not (package / "sample-request.json").exists()
    # WHEN it loads with warm-up (whose zero batch of empty strings its encoder refuses)
    model = ServedModel.load(package, ServingSettings(model_dir=package, default_model="flowers"))
    # THEN it is ready and answers
    assert model.runtime.warmed_up
    body, _ = request_forms(built)["dataframe_split"]
    assert orjson.loads(model.infer(body, "application/json", None).body)["predictions"] == built.expected


def test_concurrent_requests_batched_with_one_of_an_unknown_category_are_answered(
    server: RealtimeServer, built: PipelineModel
) -> None:
    # GIVEN bursts of 48 concurrent one-row requests, every twelfth of a site the encoder never saw. Requests that
    # arrive while a batch runs share the next one; whether a given burst does is up to the scheduler, but with
    # today's bursts most share a batch with a bad request (before the split, 9 of 10 bursts gave an innocent
    # request a 400). The in-process test (tests/unit/test_batch_blame.py) forces one batch deterministically.
    def body(row: int) -> bytes:
        record = {name: built.rows[name][row % 12] for name in COLUMNS} | (
            {"site": "atlantis"} if row % 12 == 5 else {}
        )
        return orjson.dumps({"dataframe_records": [record]})

    async def bursts() -> list[list[httpx.Response]]:
        async with httpx.AsyncClient(base_url=server.url, limits=httpx.Limits(max_connections=48)) as client:
            await asyncio.gather(*(client.get("/ping") for _ in range(48)))  # connections open before the bursts
            return [
                await asyncio.gather(*(client.post("/invocations", content=body(row)) for row in range(48)))
                for _ in range(10)
            ]

    # WHEN they are sent / THEN each bad request alone is a 400 naming the column and value, and every other
    # request is answered with its own row's prediction
    for answers in asyncio.run(bursts()):
        for row, answer in enumerate(answers):
            if row % 12 == 5:
                assert answer.status_code == 400, answer.text
                assert (answer.json()["error"]["field"], answer.json()["error"]["value"]) == ("site", "atlantis")
            else:
                assert answer.status_code == 200, (row, answer.text)
                assert answer.json()["predictions"] == [built.expected[row % 12]]
