"""The handlers' AWS clients (servestack/adapters/aws/clients.py): botocore clients with the endpoint, addressing and
retry mode every handler relies on, on moto's server over HTTP."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, ParamValidationError

from servestack.adapters.aws.clients import aws_client, conditional_writes
from servestack.local.emulator.moto_server import aws_environment, clients


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture(autouse=True)
def emulator_identity(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Credentials and region as local up gives a function (AWS_ENDPOINT_URL set or not by each test)."""
    for name, value in aws_environment(moto_url).items():
        if name != "AWS_ENDPOINT_URL":
            monkeypatch.setenv(name, value)


def test_a_client_honours_aws_endpoint_url_path_style_and_retries(
    moto_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN the emulator's URL in AWS_ENDPOINT_URL (as local up and the bench set it) and a bucket there
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url)
    developer = clients(moto_url)["s3"]
    developer.create_bucket(Bucket="clients-test")
    sent: list[str] = []

    # WHEN a handler's S3 client writes an object
    s3 = aws_client("s3")
    s3.meta.events.register("before-send.s3.PutObject", lambda request, **_: sent.append(request.url))
    s3.put_object(Bucket="clients-test", Key="a/b.txt", Body=b"hello")

    # THEN it went to the emulator, the bucket in the path, and the object is there for any other client
    assert sent == [f"{moto_url}/clients-test/a/b.txt"]
    assert developer.get_object(Bucket="clients-test", Key="a/b.txt")["Body"].read() == b"hello"
    assert s3.meta.config.retries["mode"] == "standard"
    assert s3.meta.config.s3["addressing_style"] == "path"


def test_an_explicit_endpoint_wins_and_presigned_urls_still_work(
    moto_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN no AWS_ENDPOINT_URL, an endpoint passed in (as the registry's S3 store does)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)

    # WHEN a client presigns a GET (the async job store's result links: botocore's, not boto3's)
    s3: Any = aws_client("s3", endpoint_url=moto_url)
    url = s3.generate_presigned_url("get_object", Params={"Bucket": "some-bucket", "Key": "k"}, ExpiresIn=60)

    # THEN the link points at that endpoint, path-style
    assert url.startswith(f"{moto_url}/some-bucket/k?")


def runtime_s3_without_if_none_match(data_root: Path, moto_url: str) -> Any:
    """An S3 client whose botocore model predates S3 conditional writes, as an older Lambda runtime SDK's:
    this botocore's own PutObject model with the `IfNoneMatch` member taken out, loaded from a data path
    that shadows the installed one."""
    import botocore.session

    loader = botocore.session.get_session().get_component("data_loader")
    model = loader.load_service_model("s3", "service-2")
    del model["shapes"]["PutObjectRequest"]["members"]["IfNoneMatch"]
    folder = data_root / "s3" / loader.determine_latest_version("s3", "service-2")
    folder.mkdir(parents=True)
    (folder / "service-2.json").write_text(json.dumps(model), encoding="utf-8")
    session = botocore.session.get_session()
    session.get_component("data_loader").search_paths.insert(0, str(data_root))
    return session.create_client(
        "s3", endpoint_url=moto_url, config=Config(s3={"addressing_style": "path"}, retries={"mode": "standard"})
    )


def write_twice(s3: Any, bucket: str) -> tuple[str, str]:
    """Two writes of one key with `IfNoneMatch="*"`: the error code of the second, and the body that stands."""
    s3.put_object(Bucket=bucket, Key="result", Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError) as refused:
        s3.put_object(Bucket=bucket, Key="result", Body=b"second", IfNoneMatch="*")
    body = s3.get_object(Bucket=bucket, Key="result")["Body"].read().decode()
    return refused.value.response["Error"]["Code"], body


def test_write_once_holds_with_this_sdk_and_with_a_runtime_sdk_that_predates_conditional_writes(
    moto_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # GIVEN a bucket on the emulator, and two S3 clients: this botocore's (its model has IfNoneMatch) and one
    # whose model lacks it, as the Lambda runtime's may (AWS fixes no SDK version per runtime)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url)
    developer = clients(moto_url)["s3"]
    developer.create_bucket(Bucket="write-once")
    developer.create_bucket(Bucket="write-once-old-sdk")
    current = aws_client("s3")
    old = runtime_s3_without_if_none_match(tmp_path / "data", moto_url)
    # (that SDK itself refuses the parameter, as the worker would see it in such a runtime)
    with pytest.raises(ParamValidationError, match="IfNoneMatch"):
        old.put_object(Bucket="write-once-old-sdk", Key="probe", Body=b"x", IfNoneMatch="*")
    assert "IfNoneMatch" in current.meta.service_model.operation_model("PutObject").input_shape.members

    # WHEN the worker's write (`put_object(..., IfNoneMatch="*")`) runs twice on each
    # THEN on both S3 refuses the second write (412 PreconditionFailed) and the first body stands
    assert write_twice(current, "write-once") == ("PreconditionFailed", "first")
    assert write_twice(conditional_writes(old), "write-once-old-sdk") == ("PreconditionFailed", "first")


def test_the_model_loader_answers_as_botocores_own_without_walking_every_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN the handlers' loader and botocore's own, over the same data folders (AWS_DATA_PATH adds one with a
    # made-up service, as a user's own models would)
    import botocore.loaders
    import botocore.session
    from botocore.exceptions import UnknownServiceError

    from servestack.adapters.aws.clients import _ModelFiles, _ModelLoader

    extra = tmp_path / "models" / "made-up" / "2024-01-01"
    extra.mkdir(parents=True)
    (extra / "service-2.json").write_text(json.dumps({"metadata": {}, "operations": {}, "shapes": {}}))
    ours = _ModelLoader(extra_search_paths=[str(tmp_path / "models")], file_loader=_ModelFiles())
    theirs = botocore.loaders.Loader(extra_search_paths=[str(tmp_path / "models")])
    walked: list[str] = []

    def counted_walk() -> dict[str, set[str]]:
        walked.append("walk")
        return _ModelLoader._walk(ours)

    monkeypatch.setattr(ours, "_walk", counted_walk)

    # WHEN a service's model is looked for (what creating a client does)
    known = ours.list_available_services("service-2")
    found = {name: name in known for name in ("s3", "sqs", "made-up", "no-such-service", "..", "s3/../sqs", "")}

    # THEN the answers are botocore's, and no folder but the services' own was read
    expected = theirs.list_available_services("service-2")
    assert found == {name: name in expected for name in found}
    assert found["s3"]
    assert found["made-up"]
    assert not found["no-such-service"]
    assert walked == []
    # AND read whole (iterated, indexed, counted, compared) it is botocore's list, walked once
    assert list(known) == expected
    assert known == expected
    assert len(known) == len(expected)
    assert known[0] == expected[0]
    assert known[-3:] == expected[-3:]
    assert list(ours.list_available_services("paginators-1")) == theirs.list_available_services("paginators-1")
    assert walked == ["walk"]
    # AND an unknown service still fails with every known name, as botocore words it
    with pytest.raises(UnknownServiceError) as raised:
        ours.load_service_model("no-such-service", "service-2")
    assert "Valid service names are: " in str(raised.value)
    assert "s3" in str(raised.value)
    assert ours.load_service_model("s3", "service-2") == theirs.load_service_model("s3", "service-2")
