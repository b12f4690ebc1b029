"""Clients for servestack deployments, sync and async, with pooled connections and retries.

    client = ServingClient("http://127.0.0.1:8080")
    client.predict([[0.0] * 64])                         # {"predictions": [...], "probabilities": ...}
    client.predict_many(rows, batch_size=256)            # split, sent in batches, merged in order

Targets: a realtime URL, a Lambda Function URL or HTTP API (SigV4-signed when IAM auth is on), a
SageMaker endpoint through boto3's `sagemaker-runtime`, and an async deployment's job API (`AsyncJobsClient`:
a payload over the inline limit goes through a presigned S3 upload by itself). 429, 503 and connection errors
are retried with exponential backoff and full jitter, honouring `Retry-After`; every call has a timeout.
Through SageMaker, a container's 429/503 arrives as `ModelError` carrying `OriginalStatusCode`:
`SageMakerClient` retries those too, within a total deadline.
"""

from __future__ import annotations

import asyncio
import email.utils
import io
import random
import sys
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import httpx
import numpy as np
import orjson

JSON = "application/json"
NPY = "application/x-npy"
RETRY_STATUSES = frozenset({429, 503})


class ServingClientError(Exception):
    """A request failed for good: a non-retryable status, or retries exhausted. Carries the error body."""

    def __init__(self, status_code: int, body: Any, attempts: int) -> None:
        detail = body.get("error", body) if isinstance(body, dict) else body
        super().__init__(f"HTTP {status_code} after {attempts} attempt(s): {detail}")
        self.status_code = status_code
        self.body = body
        self.attempts = attempts


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter (sleep uniformly in [0, min(cap, base * 2**attempt)])."""

    max_attempts: int = 5
    base_delay_sec: float = 0.05
    max_delay_sec: float = 5.0
    statuses: frozenset[int] = RETRY_STATUSES
    rng: random.Random = field(default_factory=random.Random, compare=False)

    def delay_sec(self, attempt: int, retry_after: str | None) -> float:
        backoff = self.rng.uniform(0, min(self.max_delay_sec, self.base_delay_sec * 2**attempt))
        honoured = parse_retry_after(retry_after)
        return max(backoff, honoured) if honoured is not None else backoff


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After is either delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class SigV4(httpx.Auth):
    """Signs requests for IAM-authenticated Function URLs (`lambda`) and HTTP APIs (`execute-api`)."""

    requires_request_body = True

    def __init__(self, region: str, service: str = "lambda", session: Any = None) -> None:
        import boto3

        self.region, self.service = region, service
        self.session = session or boto3.Session()

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        from servestack.signing import sigv4_headers

        credentials = self.session.get_credentials()
        if credentials is None:
            raise ServingClientError(0, "no AWS credentials found for SigV4 signing", 0)
        keys = credentials.get_frozen_credentials()
        signed = sigv4_headers(
            request.method, str(request.url), request.content,
            {"content-type": request.headers.get("content-type", JSON)},
            access_key_id=keys.access_key, secret_access_key=keys.secret_key, session_token=keys.token,
            service=self.service, region=self.region,
        )  # fmt: skip
        for name, value in signed.items():
            request.headers[name] = value
        yield request


def encode_rows(rows: Any, content_type: str) -> bytes:
    if content_type == NPY:
        buffer = io.BytesIO()
        np.save(buffer, np.asarray(rows), allow_pickle=False)
        return buffer.getvalue()
    if isinstance(rows, np.ndarray):
        return orjson.dumps({"instances": rows}, option=orjson.OPT_SERIALIZE_NUMPY)
    return orjson.dumps({"instances": rows})


def decode_answer(content: bytes, content_type: str) -> dict[str, Any]:
    if content_type.startswith(NPY):
        return {"predictions": np.load(io.BytesIO(content), allow_pickle=False).tolist()}
    answer: dict[str, Any] = orjson.loads(content)
    return answer


def merge_answers(answers: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Concatenate the per-row fields of several answers, in order; keep the rest from the first."""
    if not answers:
        return {"predictions": []}
    merged = dict(answers[0])
    for name, value in answers[0].items():
        if isinstance(value, list):
            merged[name] = [item for answer in answers for item in answer.get(name, [])]
    return merged


def batches(rows: Any, batch_size: int) -> list[Any]:
    if batch_size < 1:
        raise ValueError(f"batch_size: {batch_size} is not >= 1")
    return [rows[start : start + batch_size] for start in range(0, len(rows), batch_size)]


@dataclass
class _Request:
    path: str
    body: bytes
    headers: dict[str, str]


class _Base:
    def __init__(
        self,
        url: str,
        *,
        model: str | None = None,
        timeout_sec: float = 10.0,
        retry: RetryPolicy | None = None,
        auth: httpx.Auth | None = None,
        headers: dict[str, str] | None = None,
        content_type: str = JSON,
    ) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.timeout = httpx.Timeout(timeout_sec)
        self.retry = retry or RetryPolicy()
        self.auth = auth
        self.headers = headers or {}
        self.content_type = content_type
        self.limits = httpx.Limits(max_connections=100, max_keepalive_connections=20)

    def _request(self, rows: Any, model: str | None, accept: str | None) -> _Request:
        chosen = model or self.model
        path = f"/v1/models/{chosen}/predict" if chosen else "/invocations"
        headers = {"content-type": self.content_type, "accept": accept or JSON, **self.headers}
        return _Request(path, encode_rows(rows, self.content_type), headers)

    def _outcome(self, response: httpx.Response, attempt: int) -> tuple[dict[str, Any] | None, float | None]:
        """The answer, or how long to wait before the next attempt; raises when it is final."""
        if response.is_success:
            return decode_answer(response.content, response.headers.get("content-type", JSON)), None
        try:
            body: Any = response.json()
        except ValueError:
            body = response.text
        if response.status_code in self.retry.statuses and attempt + 1 < self.retry.max_attempts:
            return None, self.retry.delay_sec(attempt, response.headers.get("retry-after"))
        raise ServingClientError(response.status_code, body, attempt + 1)


class ServingClient(_Base):
    """Synchronous client over one pooled `httpx.Client`."""

    def __init__(self, url: str, **options: Any) -> None:
        transport: httpx.BaseTransport | None = options.pop("transport", None)
        super().__init__(url, **options)
        self.http = httpx.Client(
            base_url=self.url, timeout=self.timeout, limits=self.limits, auth=self.auth, transport=transport
        )
        self.sleep: Callable[[float], None] = time.sleep

    def predict(self, rows: Any, *, model: str | None = None, accept: str | None = None) -> dict[str, Any]:
        request = self._request(rows, model, accept)
        for attempt in range(self.retry.max_attempts):
            try:
                response = self.http.post(request.path, content=request.body, headers=request.headers)
            except httpx.TransportError:
                if attempt + 1 == self.retry.max_attempts:
                    raise
                self.sleep(self.retry.delay_sec(attempt, None))
                continue
            answer, wait = self._outcome(response, attempt)
            if answer is not None:
                return answer
            assert wait is not None
            self.sleep(wait)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def predict_many(self, rows: Any, *, batch_size: int = 256, model: str | None = None) -> dict[str, Any]:
        return merge_answers([self.predict(chunk, model=model) for chunk in batches(rows, batch_size)])

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> ServingClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class AsyncServingClient(_Base):
    """Asynchronous client over one pooled `httpx.AsyncClient`; `predict_many` sends batches concurrently."""

    def __init__(self, url: str, **options: Any) -> None:
        transport: httpx.AsyncBaseTransport | None = options.pop("transport", None)
        super().__init__(url, **options)
        self.http = httpx.AsyncClient(
            base_url=self.url, timeout=self.timeout, limits=self.limits, auth=self.auth, transport=transport
        )

    async def predict(self, rows: Any, *, model: str | None = None, accept: str | None = None) -> dict[str, Any]:
        request = self._request(rows, model, accept)
        for attempt in range(self.retry.max_attempts):
            try:
                response = await self.http.post(request.path, content=request.body, headers=request.headers)
            except httpx.TransportError:
                if attempt + 1 == self.retry.max_attempts:
                    raise
                await asyncio.sleep(self.retry.delay_sec(attempt, None))
                continue
            answer, wait = self._outcome(response, attempt)
            if answer is not None:
                return answer
            assert wait is not None
            await asyncio.sleep(wait)
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def predict_many(
        self, rows: Any, *, batch_size: int = 256, model: str | None = None, concurrency: int = 8
    ) -> dict[str, Any]:
        gate = asyncio.Semaphore(concurrency)

        async def one(chunk: Any) -> dict[str, Any]:
            async with gate:
                return await self.predict(chunk, model=model)

        return merge_answers(await asyncio.gather(*(one(chunk) for chunk in batches(rows, batch_size))))

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncServingClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()


# SageMaker Runtime errors worth another attempt (botocore's `Error.Code`). A container's own overload answer
# (429, or 503 while it loads) reaches the caller wrapped as `ModelError` (HTTP 424) with `OriginalStatusCode`,
# which no botocore retry mode retries; those are checked separately below.
SAGEMAKER_RETRY_CODES = frozenset(
    {
        "ThrottlingException",  # SageMaker's own rate limit on InvokeEndpoint
        "ServiceUnavailable",  # 503: SageMaker (not the container) could not take the request
        "ModelNotReadyException",  # multi-model: the target model is still loading; AWS says to retry
    }
)
MODEL_ERROR_RETRY_STATUSES = frozenset({429, 503})


def retryable_sagemaker_error(error: Exception) -> bool:
    """Whether a botocore `ClientError` from InvokeEndpoint may succeed if sent again."""
    response = getattr(error, "response", None)
    if not isinstance(response, dict):
        return False
    code = response.get("Error", {}).get("Code")
    if code == "ModelError":
        return response.get("OriginalStatusCode") in MODEL_ERROR_RETRY_STATUSES
    return code in SAGEMAKER_RETRY_CODES


class SageMakerClient:
    """`sagemaker-runtime.invoke_endpoint` with the same predict interface (set `endpoint_url` to reach
    `servestack local up`).

    Overload is retried here rather than by botocore (whose own retries are off, so one deadline bounds the
    whole call): `ModelError` whose `OriginalStatusCode` is 429 or 503 (the container refused or was not ready),
    `ThrottlingException`, `ServiceUnavailable` and `ModelNotReadyException`. Each retry waits a full-jitter
    backoff (uniform in [0, min(max_delay, base * 2**attempt)]); a retry whose wait would end past
    `deadline_sec` after the call started is not made, and the last error is raised. Every other error is
    raised at once."""

    def __init__(
        self,
        endpoint_name: str,
        *,
        region: str | None = None,
        endpoint_url: str | None = None,
        timeout_sec: float = 60.0,
        max_attempts: int = 5,
        deadline_sec: float = 30.0,
        base_delay_sec: float = 0.05,
        max_delay_sec: float = 5.0,
        target_model: str | None = None,
        session: Any = None,
        runtime: Any = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        if runtime is None:
            import boto3
            from botocore.config import Config

            config = Config(
                read_timeout=timeout_sec,
                connect_timeout=min(timeout_sec, 10),
                retries={"mode": "standard", "total_max_attempts": 1},
            )
            runtime = (session or boto3.Session()).client(
                "sagemaker-runtime", region_name=region, endpoint_url=endpoint_url, config=config
            )
        self.runtime = runtime
        self.endpoint_name = endpoint_name
        self.target_model = target_model
        self.deadline_sec = deadline_sec
        self.retry = RetryPolicy(
            max_attempts=max_attempts,
            base_delay_sec=base_delay_sec,
            max_delay_sec=max_delay_sec,
            rng=rng or random.Random(),  # noqa: S311 - backoff jitter, not cryptography
        )
        self.sleep = sleep
        self.clock = clock

    def invoke(self, **request: Any) -> dict[str, Any]:
        """`invoke_endpoint(**request)` with the retries above; returns botocore's response."""
        deadline = self.clock() + self.deadline_sec
        for attempt in range(self.retry.max_attempts):
            try:
                response: dict[str, Any] = self.runtime.invoke_endpoint(EndpointName=self.endpoint_name, **request)
                return response
            except Exception as error:
                if not retryable_sagemaker_error(error) or attempt + 1 == self.retry.max_attempts:
                    raise
                wait = self.retry.delay_sec(attempt, None)
                if self.clock() + wait > deadline:
                    raise
                self.sleep(wait)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def predict(self, rows: Any, *, custom_attributes: str | None = None) -> dict[str, Any]:
        options: dict[str, str] = {}
        if self.target_model:
            options["TargetModel"] = self.target_model
        if custom_attributes:
            options["CustomAttributes"] = custom_attributes
        response = self.invoke(Body=encode_rows(rows, JSON), ContentType=JSON, Accept=JSON, **options)
        return decode_answer(response["Body"].read(), response.get("ContentType", JSON))

    def predict_many(self, rows: Iterable[Any] | Any, *, batch_size: int = 256) -> dict[str, Any]:
        return merge_answers([self.predict(chunk) for chunk in batches(rows, batch_size)])


# ------------------------------------------------------------------------------------------ async jobs

# The job API takes a payload inline up to its presign threshold (256 KiB unless the deployment sets another);
# past it the payload goes to S3 through a presigned PUT, up to its max_upload_bytes (1 GiB).
INLINE_LIMIT_BYTES = 262_144
MAX_UPLOAD_BYTES = 1024**3
UPLOAD_PIECE_BYTES = 1024 * 1024
FINAL_STATUSES = frozenset({"succeeded", "failed"})

UploadProgress = Callable[[int, int], None]  # (bytes sent, bytes in all)


class AsyncJobsClient:
    """An async deployment's job API (`POST /jobs`, `POST /jobs/uploads`, `GET /jobs/{id}`): submit a payload,
    wait for its job, read the result. A payload over the inline limit takes the upload route by itself: an
    upload URL, a PUT of the payload to S3 (reported to `on_upload`), then `confirm` so the job starts at once
    (S3's notification starts it too; the API takes both). A 413 from the inline route (a deployment with a
    lower threshold) takes the upload route as well.

        jobs = AsyncJobsClient(url, auth=SigV4("eu-west-1", "execute-api"))
        job = jobs.submit(payload, "application/json", on_upload=upload_progress())
        answer = jobs.result(jobs.wait(job, timeout_sec=600))
    """

    def __init__(
        self,
        url: str,
        *,
        auth: httpx.Auth | None = None,
        timeout_sec: float = 60.0,
        inline_limit_bytes: int = INLINE_LIMIT_BYTES,
        poll_sec: float = 0.2,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.inline_limit_bytes = inline_limit_bytes
        self.poll_sec = poll_sec
        self.http = httpx.Client(base_url=self.url, timeout=timeout_sec, auth=auth, transport=transport)

    def submit(
        self,
        body: bytes,
        content_type: str,
        *,
        accept: str | None = None,
        idempotency_key: str | None = None,
        on_upload: UploadProgress | None = None,
    ) -> dict[str, Any]:
        """Queue a job for `body`; returns the API's answer (`job_id`, `status`, `status_url`)."""
        if len(body) > MAX_UPLOAD_BYTES:
            raise ServingClientError(
                413, f"payload of {len(body)} bytes is over the {MAX_UPLOAD_BYTES} bytes an async job takes", 0
            )
        headers = {"content-type": content_type, **({"accept": accept} if accept else {})}
        if idempotency_key:
            headers["idempotency-key"] = idempotency_key
        if len(body) <= self.inline_limit_bytes:
            response = self.http.post("/jobs", content=body, headers=headers)
            if response.status_code != 413:
                return self._answer(response, 202)
        return self._upload(body, content_type, accept, idempotency_key, on_upload)

    def _upload(
        self,
        body: bytes,
        content_type: str,
        accept: str | None,
        idempotency_key: str | None,
        on_upload: UploadProgress | None,
    ) -> dict[str, Any]:
        request = {"content_type": content_type, **({"accept": accept} if accept else {})}
        headers = {"content-type": JSON, **({"idempotency-key": idempotency_key} if idempotency_key else {})}
        upload = self._answer(self.http.post("/jobs/uploads", content=orjson.dumps(request), headers=headers), 201)
        if len(body) > int(upload.get("max_bytes", MAX_UPLOAD_BYTES)):
            raise ServingClientError(413, f"payload of {len(body)} bytes is over {upload['max_bytes']}", 1)
        target = upload["upload"]

        def pieces() -> Iterator[bytes]:
            view = memoryview(body)
            for start in range(0, len(body), UPLOAD_PIECE_BYTES):
                yield bytes(view[start : start + UPLOAD_PIECE_BYTES])
                if on_upload is not None:
                    on_upload(min(start + UPLOAD_PIECE_BYTES, len(body)), len(body))

        # The URL is presigned: no auth of ours. S3 takes no chunked PUT, so the length is given.
        put_headers = {**target.get("headers", {}), "content-length": str(len(body))}
        put = self.http.request(target["method"], target["url"], content=pieces(), headers=put_headers, auth=None)
        if not put.is_success:
            raise ServingClientError(put.status_code, put.text[:500], 1)
        confirmed = self._answer(self.http.post(upload["confirm_url"]), 202)
        return {**confirmed, "status_url": upload["status_url"]}

    def status(self, job: dict[str, Any]) -> dict[str, Any]:
        return self._answer(self.http.get(job["status_url"]), 200)

    def wait(
        self, job: dict[str, Any], *, timeout_sec: float, sleep: Callable[[float], None] = time.sleep
    ) -> dict[str, Any]:
        """The job's status once it has succeeded or failed; TimeoutError if it has not within `timeout_sec`."""
        deadline = time.monotonic() + timeout_sec
        while True:
            current = self.status(job)
            if current.get("status") in FINAL_STATUSES:
                return current
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job['job_id']}: not done after {timeout_sec:g}s")
            sleep(self.poll_sec)

    def result(self, status: dict[str, Any]) -> bytes:
        """A succeeded job's result, through its presigned GET URL."""
        response = self.http.get(status["result"]["url"], auth=None)  # presigned: signed already
        if not response.is_success:
            raise ServingClientError(response.status_code, response.text[:500], 1)
        return response.content

    def _answer(self, response: httpx.Response, expected: int) -> dict[str, Any]:
        try:
            body: Any = response.json()
        except ValueError:
            body = response.text[:500]
        if response.status_code != expected or not isinstance(body, dict):
            raise ServingClientError(response.status_code, body, 1)
        return body

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> AsyncJobsClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def upload_progress(stream: TextIO | None = None) -> UploadProgress:
    """Upload progress for people: on a terminal, one line redrawn as the bytes go; otherwise (a log, CI) a line
    when the upload starts and one when it ends, so logs stay readable."""
    out = stream or sys.stderr
    on_terminal = out.isatty()
    started = False

    def report(sent: int, total: int) -> None:
        nonlocal started
        mib = f"{sent / 2**20:.1f}/{total / 2**20:.1f} MiB"
        if on_terminal:
            out.write(f"\ruploading {mib} ({100 * sent // max(total, 1)}%)" + ("\n" if sent >= total else ""))
        elif not started:
            out.write(f"uploading {total / 2**20:.1f} MiB through a presigned S3 URL\n")
        if not on_terminal and sent >= total:
            out.write(f"uploaded {mib}\n")
        started = True
        out.flush()

    return report
