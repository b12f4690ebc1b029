"""`AsyncJobsClient` picks the job API's route by itself: inline up to the limit, the presigned upload past it
(or when the API answers 413), refused past the upload's maximum; and its upload progress is a redrawn line on
a terminal (a pty here) and plain lines elsewhere. The API is a fake with the real one's routes and answers
(servestack/adapters/asynchronous.py); the real one is driven end to end in tests/e2e/test_local_up_enforced.py."""

from __future__ import annotations

import io
import json
import os
import pty
from dataclasses import dataclass, field

import httpx
import pytest

from servestack.client import INLINE_LIMIT_BYTES, AsyncJobsClient, ServingClientError, upload_progress


@dataclass
class FakeJobApi:
    """POST /jobs (413 past `threshold`), POST /jobs/uploads, the presigned PUT, confirm, and GET /jobs/{id}."""

    threshold: int
    max_upload_bytes: int = 1024**3
    uploaded: dict[str, bytes] = field(default_factory=dict)
    routes: list[str] = field(default_factory=list)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        route = f"{request.method} {request.url.path}"
        self.routes.append(route)
        base = "http://api.local/jobs"
        if route == "POST /jobs":
            body = request.read()
            if len(body) > self.threshold:
                return httpx.Response(413, json={"error": {"type": "PayloadTooLarge", "field": "body"}})
            self.uploaded["inline"] = body
            return httpx.Response(202, json={"job_id": "inline", "status": "queued", "status_url": f"{base}/inline"})
        if route == "POST /jobs/uploads":
            assert json.loads(request.read()) == {"content_type": "application/json"}
            return httpx.Response(201, json={
                "job_id": "up", "status": "queued", "max_bytes": self.max_upload_bytes,
                "upload": {"url": "http://s3.local/bucket/uploads/up?X-Amz-Signature=abc", "method": "PUT",
                           "headers": {"Content-Type": "application/json"}},
                "confirm_url": f"{base}/up/confirm", "status_url": f"{base}/up",
            })  # fmt: skip
        if route == "PUT /bucket/uploads/up":
            # S3 takes no chunked PUT, and a presigned URL needs no other signature
            assert request.headers["content-length"] == str(len(request.read()))
            assert "transfer-encoding" not in request.headers
            assert "authorization" not in request.headers
            self.uploaded["up"] = request.read()
            return httpx.Response(200)
        if route == "POST /jobs/up/confirm":
            assert "up" in self.uploaded
            return httpx.Response(202, json={"job_id": "up", "status": "queued", "status_url": f"{base}/up"})
        if request.method == "GET" and request.url.path.startswith("/jobs/"):
            job = request.url.path.rsplit("/", 1)[1]
            result = {"url": f"http://s3.local/bucket/results/{job}", "content_type": "application/json"}
            return httpx.Response(200, json={"job_id": job, "status": "succeeded", "result": result})
        if request.method == "GET" and request.url.path.startswith("/bucket/results/"):
            return httpx.Response(200, json={"predictions": [len(self.uploaded[request.url.path.rsplit("/", 1)[1]])]})
        return httpx.Response(404, json={"error": {"type": "NotFound"}})


def jobs_client(api: FakeJobApi, inline_limit_bytes: int = INLINE_LIMIT_BYTES) -> AsyncJobsClient:
    transport = httpx.MockTransport(api)
    return AsyncJobsClient("http://api.local", transport=transport, inline_limit_bytes=inline_limit_bytes)


def test_a_payload_within_the_limit_goes_inline() -> None:
    api = FakeJobApi(threshold=1000)
    with jobs_client(api, inline_limit_bytes=1000) as jobs:
        job = jobs.submit(b"x" * 1000, "application/json")
        assert json.loads(jobs.result(jobs.wait(job, timeout_sec=5))) == {"predictions": [1000]}
    assert api.routes[0] == "POST /jobs"
    assert "POST /jobs/uploads" not in api.routes


def test_a_payload_over_the_limit_takes_the_upload_route_with_its_progress() -> None:
    api = FakeJobApi(threshold=1000)
    progress: list[tuple[int, int]] = []
    payload = b"y" * (3 * 1024 * 1024 + 5)
    with jobs_client(api, inline_limit_bytes=1000) as jobs:
        job = jobs.submit(payload, "application/json", on_upload=lambda sent, total: progress.append((sent, total)))
        assert json.loads(jobs.result(jobs.wait(job, timeout_sec=5))) == {"predictions": [len(payload)]}
    assert api.routes[:3] == ["POST /jobs/uploads", "PUT /bucket/uploads/up", "POST /jobs/up/confirm"]
    assert api.uploaded["up"] == payload
    assert [sent for sent, _ in progress] == [2**20, 2 * 2**20, 3 * 2**20, len(payload)]
    assert {total for _, total in progress} == {len(payload)}


def test_a_413_from_the_inline_route_takes_the_upload_route() -> None:
    # GIVEN an API whose threshold is below the client's limit (a deployment that set a lower one)
    api = FakeJobApi(threshold=100)
    with jobs_client(api) as jobs:
        job = jobs.submit(b"z" * 500, "application/json")
    assert api.routes[:2] == ["POST /jobs", "POST /jobs/uploads"]
    assert job["job_id"] == "up"


def test_a_payload_over_the_uploads_maximum_is_refused_before_any_byte_is_sent() -> None:
    api = FakeJobApi(threshold=100, max_upload_bytes=1000)
    with jobs_client(api, inline_limit_bytes=100) as jobs, pytest.raises(ServingClientError, match="over 1000"):
        jobs.submit(b"w" * 1001, "application/json")
    assert "PUT /bucket/uploads/up" not in api.routes


def test_upload_progress_is_a_redrawn_line_on_a_terminal_and_plain_lines_elsewhere() -> None:
    # GIVEN a terminal (a pty) and a plain stream
    leader, follower = pty.openpty()
    with os.fdopen(follower, "w", encoding="utf-8") as terminal:
        report = upload_progress(terminal)
        for sent in (2**20, 2 * 2**20):
            report(sent, 2 * 2**20)
    drawn = ""
    while True:  # what the terminal got, until its other end is closed (EIO)
        try:
            piece = os.read(leader, 4096)
        except OSError:
            break
        if not piece:
            break
        drawn += piece.decode()
    os.close(leader)
    plain = io.StringIO()
    report = upload_progress(plain)
    for sent in (2**20, 2 * 2**20):
        report(sent, 2 * 2**20)
    # THEN the terminal's line is redrawn in place; the plain stream gets a line at the start and at the end
    assert "\ruploading 1.0/2.0 MiB (50%)" in drawn
    assert "\ruploading 2.0/2.0 MiB (100%)" in drawn
    assert plain.getvalue() == "uploading 2.0 MiB through a presigned S3 URL\nuploaded 2.0/2.0 MiB\n"
