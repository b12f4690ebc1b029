"""The handlers' AWS clients (handlers/aws/clients.py): botocore clients with the endpoint, addressing and
retry mode every handler relies on, on moto's server over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from handlers.aws.clients import aws_client
from servestack.local.emulator import aws_environment, clients


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
