"""SageMaker's multi-model contract on the real container entry (two worker processes), and the local stand-in for
SageMaker's orchestration in front of it, fetching `TargetModel` archives from a moto S3 server."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from servestack.inference.registry import ModelRegistry, archive_key, package_archive
from servestack.local.hosting.http_server import Request
from servestack.local.sagemaker.multi_model import ArchiveRefused, MultiModelFront, extract_archive, not_multi_model
from tests.conftest import ARTIFACTS, RealtimeServer

pytestmark = pytest.mark.slow
DIGITS = ARTIFACTS / "digits" / "1"
CANCER = ARTIFACTS / "breast-cancer" / "1"
DIGITS_REQUEST = (DIGITS / "sample-request.json").read_bytes()
CANCER_REQUEST = (CANCER / "sample-request.json").read_bytes()
# Above what loading one of these models grows a worker's RSS by (about 19 MB for a worker's first onnxruntime
# session, under 1 MB after it): the budget then counts the estimate, and two models fit, not three.
OVERHEAD = 32 * 1024 * 1024
# Room for two models of the digits/breast-cancer size, not three.
BUDGET = 2 * (max((DIGITS / "model.onnx").stat().st_size, (CANCER / "model.onnx").stat().st_size) + OVERHEAD) + 1000


def package(source: Path, root: Path, name: str) -> Path:
    """A model as SageMaker leaves it for the container: the archive extracted into `<root>/<name>/model`."""
    target = root / name / "model"
    files = ["manifest.json", "model.onnx", "sample-request.json", "sample-response.json"]
    extract_archive(package_archive(source, [f for f in files if (source / f).exists()]), target)
    return target


@pytest.fixture(scope="module")
def models_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("opt-ml-models")


@pytest.fixture(scope="module")
def container(models_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealtimeServer]:
    env = {
        "SERVESTACK_MULTI_MODEL": "true",
        "SERVESTACK_MULTI_MODEL_ROOT": str(models_root),
        "SERVESTACK_WORKERS": "2",
        "SERVESTACK_CACHE_BUDGET_BYTES": str(BUDGET),
        "SERVESTACK_CACHE_SESSION_OVERHEAD_BYTES": str(OVERHEAD),
    }
    server = RealtimeServer.start(tmp_path_factory.mktemp("mme-logs"), env=env)
    yield server
    server.stop()


def load(client: httpx.Client, name: str, url: Path | str) -> httpx.Response:
    return client.post("/models", json={"model_name": name, "url": str(url)})


def test_load_list_get_invoke_and_unload_answer_as_the_contract_says(
    container: RealtimeServer, models_root: Path
) -> None:
    digits = package(DIGITS, models_root, "a1")
    expected = json.loads((DIGITS / "sample-response.json").read_text())["predictions"]
    with httpx.Client(base_url=container.url, timeout=30) as client:
        # GIVEN a model SageMaker extracted for the container
        # WHEN SageMaker loads it THEN 200, and loading it again is 409
        assert load(client, "a1", digits).status_code == 200
        again = load(client, "a1", digits)
        assert again.status_code == 409
        assert again.json()["error"]["type"] == "ModelAlreadyLoaded"
        # AND the list and the model describe it
        assert client.get("/models").json() == {"models": [{"modelName": "a1", "modelUrl": str(digits)}]}
        assert client.get("/models/a1").json() == {"modelName": "a1", "modelUrl": str(digits)}
        # AND every invoke answers the model's prediction, whichever of the two workers takes it
        for _ in range(8):
            answer = client.post(
                "/models/a1/invoke",
                content=DIGITS_REQUEST,
                headers={"Content-Type": "application/json", "X-Amzn-SageMaker-Target-Model": "digits/1.tar.gz"},
            )
            assert answer.status_code == 200, answer.text
            assert answer.json()["predictions"] == expected
        # WHEN SageMaker unloads it THEN 200, and from then on every route answers 404
        assert client.delete("/models/a1").status_code == 200
        for _ in range(4):
            gone = client.post(
                "/models/a1/invoke", content=DIGITS_REQUEST, headers={"Content-Type": "application/json"}
            )
            assert gone.status_code == 404
        assert client.get("/models/a1").status_code == 404
        assert client.delete("/models/a1").status_code == 404
        assert client.get("/models").json() == {"models": []}


def test_a_load_past_the_memory_budget_is_507_until_sagemaker_unloads(
    container: RealtimeServer, models_root: Path
) -> None:
    with httpx.Client(base_url=container.url, timeout=30) as client:
        # GIVEN two loaded models, all the budget holds
        assert load(client, "b1", package(DIGITS, models_root, "b1")).status_code == 200
        assert load(client, "b2", package(CANCER, models_root, "b2")).status_code == 200
        # WHEN a third is loaded THEN 507 names the budget, and it is not loaded
        third = package(DIGITS, models_root, "b3")
        refused = load(client, "b3", third)
        assert refused.status_code == 507
        assert refused.json()["error"]["type"] == "InsufficientMemory"
        assert client.get("/models/b3").status_code == 404
        # WHEN SageMaker unloads one THEN the third loads and answers
        assert client.delete("/models/b1").status_code == 200
        assert load(client, "b3", third).status_code == 200
        answer = client.post("/models/b3/invoke", content=DIGITS_REQUEST, headers={"Content-Type": "application/json"})
        assert answer.status_code == 200
        for name in ("b2", "b3"):
            assert client.delete(f"/models/{name}").status_code == 200


def test_paths_outside_the_models_directory_and_altered_files_are_refused(
    container: RealtimeServer, models_root: Path, tmp_path: Path
) -> None:
    outside = package(DIGITS, tmp_path, "elsewhere")
    escape = models_root / "escape"
    escape.mkdir()
    (escape / "model").symlink_to(outside)
    tampered = package(DIGITS, models_root, "c3")
    with (tampered / "model.onnx").open("ab") as model_file:
        model_file.write(b"\0")
    with httpx.Client(base_url=container.url, timeout=30) as client:
        # WHEN the url is outside the directory, directly or through a symlink, or relative THEN 400 names the url
        for url in (outside, escape / "model", f"{models_root}/../{outside.relative_to(tmp_path.parent)}", "c1"):
            refused = load(client, "c1", url)
            assert refused.status_code == 400, refused.text
            assert refused.json()["error"]["field"] == "url"
            assert str(tmp_path) not in refused.json()["error"]["message"]
        # WHEN the name could not be a file name THEN 400 names model_name
        bad_name = load(client, "../c2", package(DIGITS, models_root, "c2"))
        assert bad_name.status_code == 400
        assert bad_name.json()["error"]["field"] == "model_name"
        # WHEN a model file does not match its manifest's checksum THEN it is refused and nothing is loaded
        altered = load(client, "c3", tampered)
        assert altered.status_code == 500
        assert altered.json()["error"]["type"] == "ChecksumMismatch"
        assert client.get("/models/c3").status_code == 404
        # AND a request body that is not a load request is a 400 naming the body
        junk = client.post("/models", content=b"[1, 2]", headers={"Content-Type": "application/json"})
        assert junk.status_code == 400
        assert junk.json()["error"]["field"] == "body"


# ------------------------------------------------------------------------------------- SageMaker's side


@pytest.fixture(scope="module")
def registry_bucket(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, str]]:
    from servestack.local.emulator.moto_server import EmbeddedEmulator, clients
    from servestack.registry import open_registry

    emulator = EmbeddedEmulator()
    s3 = clients(emulator.url)["s3"]
    s3.create_bucket(Bucket="registry")
    registry: ModelRegistry = open_registry("s3://registry/models/", client=s3)
    registry.push_package(DIGITS)
    registry.push_package(CANCER)
    yield s3, "s3://registry/models/"
    emulator.stop()


def invoke_request(body: bytes) -> Request:
    return Request("POST", "/endpoints/e/invocations", {}, {"content-type": "application/json"}, body)


def test_the_local_front_fetches_extracts_loads_and_invokes_each_target_model(
    registry_bucket: tuple[object, str], container: RealtimeServer, models_root: Path
) -> None:
    s3, prefix = registry_bucket
    front = MultiModelFront(
        endpoint_name="e", container_url=container.url, model_data_url=prefix, cache_dir=models_root, s3=s3
    )
    try:
        # GIVEN the registry's archives on S3, the keys `servestack models push` writes
        assert archive_key("digits", "1") == "digits/1.tar.gz"
        # WHEN each TargetModel is invoked, over and over, with a budget for only two of three
        for _ in range(2):
            for target, body, model in (
                ("digits/1.tar.gz", DIGITS_REQUEST, "digits"),
                ("breast-cancer/1.tar.gz", CANCER_REQUEST, "breast-cancer"),
            ):
                reply = front.invoke(target, invoke_request(body))
                # THEN the right model answers, through the container's multi-model API
                assert reply.status == 200, reply.body
                assert json.loads(reply.body)["model"] == model
        # WHEN the archive is not there THEN SageMaker's ValidationError for a missing model
        missing = front.invoke("digits/9.tar.gz", invoke_request(DIGITS_REQUEST))
        assert missing.status == 400
        assert missing.headers["x-amzn-ErrorType"] == "ValidationError"
        assert "Failed to download model data(bucket: registry, key: models/digits/9.tar.gz)" in missing.body.decode()
        # WHEN the container refuses the body THEN ModelError carrying the container's 400
        bad = front.invoke("digits/1.tar.gz", invoke_request(b"{not json"))
        assert bad.status == 424
        assert json.loads(bad.body)["OriginalStatusCode"] == 400
    finally:
        for model in httpx.get(f"{container.url}/models").json()["models"]:
            httpx.delete(f"{container.url}/models/{model['modelName']}")
        front.close()


def test_the_local_front_unloads_the_least_recently_used_model_on_507(
    container: RealtimeServer, models_root: Path, tmp_path: Path
) -> None:
    # GIVEN a directory of archives (as `ModelDataUrl` names an S3 prefix) holding three models, two of which fit
    source = tmp_path / "prefix"
    for name, where in (("d1", DIGITS), ("d2", CANCER), ("d3", DIGITS)):
        (source / f"{name}.tar.gz").parent.mkdir(parents=True, exist_ok=True)
        (source / f"{name}.tar.gz").write_bytes(
            package_archive(where, ["manifest.json", "model.onnx", "sample-request.json", "sample-response.json"])
        )
    front = MultiModelFront(
        endpoint_name="e", container_url=container.url, model_data_url=str(source), cache_dir=models_root / "front2"
    )
    try:
        for target, body in (("d1.tar.gz", DIGITS_REQUEST), ("d2.tar.gz", CANCER_REQUEST)):
            assert front.invoke(target, invoke_request(body)).status == 200
        assert front.invoke("d1.tar.gz", invoke_request(DIGITS_REQUEST)).status == 200  # d2 is now the LRU
        # WHEN a third model is invoked
        reply = front.invoke("d3.tar.gz", invoke_request(DIGITS_REQUEST))
        # THEN it answers, and the container holds d1 and d3: d2 was unloaded for it
        assert reply.status == 200, reply.body
        loaded = {m["modelUrl"].split("/")[-2] for m in httpx.get(f"{container.url}/models").json()["models"]}
        from servestack.local.sagemaker.multi_model import model_name_of

        assert loaded == {model_name_of("d1.tar.gz"), model_name_of("d3.tar.gz")}
    finally:
        for model in httpx.get(f"{container.url}/models").json()["models"]:
            httpx.delete(f"{container.url}/models/{model['modelName']}")
        front.close()


def archive_with(member: tarfile.TarInfo, data: bytes = b"") -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        tar.addfile(member, io.BytesIO(data) if member.isfile() else None)
    return raw.getvalue()


@pytest.mark.parametrize(
    ("member", "reason"),
    [
        (tarfile.TarInfo("../../etc/cron.d/x"), "outside the model directory"),
        (tarfile.TarInfo("/etc/passwd"), "outside the model directory"),
        (tarfile.TarInfo("model.onnx"), "not a regular file"),  # made a symlink below
    ],
)
def test_archives_that_would_escape_are_refused(tmp_path: Path, member: tarfile.TarInfo, reason: str) -> None:
    # GIVEN an archive whose member escapes the directory or is a link
    if reason == "not a regular file":
        member.type, member.linkname = tarfile.SYMTYPE, "/etc/passwd"
    else:
        member.size = 1
    data = archive_with(member, b"x")
    # WHEN it is extracted THEN it is refused, naming the member, and nothing is written outside
    with pytest.raises(ArchiveRefused, match=reason):
        extract_archive(data, tmp_path / "model")
    assert not (tmp_path / "etc").exists()


def test_an_archive_over_the_size_limit_is_refused(tmp_path: Path) -> None:
    member = tarfile.TarInfo("model.onnx")
    member.size = 2048
    with pytest.raises(ArchiveRefused, match="passes 1024 bytes"):
        extract_archive(archive_with(member, b"\0" * 2048), tmp_path / "model", max_bytes=1024)


def test_a_target_model_on_a_single_model_endpoint_is_sagemakers_validation_error() -> None:
    reply = not_multi_model("digits-realtime")
    assert reply.status == 400
    assert reply.headers["x-amzn-ErrorType"] == "ValidationError"
    assert json.loads(reply.body)["Message"] == (
        "Endpoint digits-realtime is not a multi-model endpoint and does not support target model header."
    )


# ------------------------------------------------------------------------------------------ hostile requests
# Each was a 500 with an empty body (an OSError or ValueError from the file system or int()), on both servers.


@pytest.fixture(scope="module", params=["granian", "uvicorn"])
def lone_container(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RealtimeServer, Path]]:
    root = tmp_path_factory.mktemp("opt-ml-models-hostile")
    env = {
        "SERVESTACK_MULTI_MODEL": "true",
        "SERVESTACK_MULTI_MODEL_ROOT": str(root),
        "SERVESTACK_HTTP_SERVER": request.param,
    }
    server = RealtimeServer.start(tmp_path_factory.mktemp("mme-hostile-logs"), env=env)
    yield server, root
    server.stop()


def assert_refused(answer: httpx.Response, field: str) -> None:
    assert 400 <= answer.status_code < 500, (answer.status_code, answer.text)
    assert answer.json()["error"]["field"] == field, answer.text


def test_a_nul_or_an_overlong_url_is_a_400_naming_url(lone_container: tuple[RealtimeServer, Path]) -> None:
    server, root = lone_container
    with httpx.Client(base_url=server.url, timeout=30) as client:
        for url in (f"{root}/a\x00b", f"{root}/" + "x" * 4096, f"{root}/{'y' * 300}/model", "/" + "z/" * 2100):
            assert_refused(load(client, "a1", url), "url")


@pytest.mark.parametrize("length", [251, 252, 253, 254, 255, 256, 5000])
def test_an_overlong_model_name_is_a_400_naming_it_on_every_route(
    lone_container: tuple[RealtimeServer, Path], length: int
) -> None:
    server, root = lone_container
    name = "n" * length
    digits = package(DIGITS, root, f"len{length}")
    with httpx.Client(base_url=server.url, timeout=30) as client:
        assert_refused(load(client, name, digits), "model_name")
        assert_refused(client.get(f"/models/{name}"), "model_name")
        assert_refused(client.delete(f"/models/{name}"), "model_name")
        assert_refused(client.post(f"/models/{name}/invoke", content=DIGITS_REQUEST), "model_name")


def test_the_longest_model_name_loads_and_answers(lone_container: tuple[RealtimeServer, Path]) -> None:
    server, root = lone_container
    name = "m" * 250
    digits = package(DIGITS, root, "longest")
    with httpx.Client(base_url=server.url, timeout=30) as client:
        assert load(client, name, digits).status_code == 200
        assert client.post(f"/models/{name}/invoke", content=DIGITS_REQUEST).status_code == 200
        assert client.delete(f"/models/{name}").status_code == 200


@pytest.mark.parametrize("token", ["9" * 5000, "1" * 19, "\u00b2", "-1", "x"])
def test_a_page_token_that_is_not_a_short_number_is_a_400_naming_it(
    lone_container: tuple[RealtimeServer, Path], token: str
) -> None:
    server, _ = lone_container
    answer = httpx.get(f"{server.url}/models", params={"next_page_token": token})
    assert_refused(answer, "next_page_token")
    assert httpx.get(f"{server.url}/models", params={"next_page_token": "0"}).status_code == 200
