"""The local stand-in for what SageMaker does in front of a multi-model container (`Mode: MultiModel`).

For `InvokeEndpoint(TargetModel=X)` SageMaker
1. downloads `<ModelDataUrl>X` (an S3 key below the model's prefix; here also a directory) and extracts the
   `.tar.gz` for the container, unless the container already holds it;
2. loads it: `POST /models {"model_name", "url"}` (409: already loaded, fine); on 507 it unloads the least
   recently used model (`DELETE /models/{name}`) and loads again;
3. invokes it: `POST /models/{name}/invoke`, with the caller's Content-Type, Accept, custom attributes and
   `X-Amzn-SageMaker-Target-Model: X`.
Failures come back as SageMaker reports them: an archive that is not there is `ValidationError` "Failed to
download model data(bucket: B, key: K). Please ensure that there is an object located at the URL and that the
role passed to CreateModel has permissions to download the model." (the wording public reports quote); a container
4xx/5xx is `ModelError` (424) carrying `OriginalStatusCode`, `OriginalMessage` and `LogStreamArn`.

Archives are untrusted input: members must be regular files or directories that stay inside the extraction
directory (no absolute paths, `..`, links or devices), within a member-count limit. The archive is inflated as a
stream and counted as it goes: past `MAX_EXTRACTED_BYTES` uncompressed, or past `MAX_RATIO` times its compressed
size (once it passes `RATIO_FLOOR_BYTES`, so a small package of mostly tar padding is not refused), extraction
stops at once, what it wrote is removed, and the call is a 413 naming the limit. The container then verifies the
package's checksums before loading it; a model the container refuses (507: no room even after unloading every
other model; or a broken package) is removed from the disk too.

Each model has its own lock: one model's download, extraction and load never holds up calls to another model
(nor another model's load); concurrent first calls to the same model share its one load.

`MultiModelFront(...).invoke(target_model, request)` returns the `Reply` for `local up`'s SageMaker front; the
container must run with `SERVESTACK_MULTI_MODEL=true` and `SERVESTACK_MULTI_MODEL_ROOT=<cache_dir>`.
`not_multi_model(endpoint)` is the refusal of a TargetModel on a single-model endpoint.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
import tempfile
import threading
import zlib
from collections import OrderedDict
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from servestack.local.cloudformation import ACCOUNT
from servestack.local.cloudformation import DEFAULT_REGION as REGION
from servestack.local.hosting import Reply, Request, request_id

TARGET_MODEL = "x-amzn-sagemaker-target-model"
FORWARDED = ("content-type", "accept", "x-amzn-sagemaker-custom-attributes", TARGET_MODEL)
MAX_ARCHIVE_BYTES = 1 << 30  # 1 GiB compressed
MAX_EXTRACTED_BYTES = 4 << 30  # uncompressed, tar headers included
MAX_RATIO = 100  # uncompressed / compressed: model weights compress 1-3x; a decompression bomb, 1,000x and more
RATIO_FLOOR_BYTES = 16 << 20  # the ratio applies past this much uncompressed
MAX_MEMBERS = 10_000
INVOKE_TIMEOUT_SEC = 60.0  # SageMaker gives a container 60 s to answer


class ArchiveRefused(ValueError):
    """A model archive that cannot be extracted safely; the message says which member and why."""


class ArchiveTooLarge(ArchiveRefused):
    """An archive that inflates past the size or ratio limit (413); `value` is how far it got, `allowed` the limit."""

    def __init__(self, message: str, value: int, allowed: str) -> None:
        super().__init__(message)
        self.value, self.allowed = value, allowed


class _Inflating:
    """A gzip stream's uncompressed bytes as a file to read, refused (`ArchiveTooLarge`) the moment they pass
    `most_bytes`: nothing past the limit is ever inflated, let alone written."""

    CHUNK = 64 * 1024

    def __init__(self, data: bytes, most_bytes: int, allowed: str) -> None:
        self._data, self._offset = data, 0
        self._inflater = zlib.decompressobj(wbits=zlib.MAX_WBITS | 16)
        self._most, self._allowed = most_bytes, allowed
        self.inflated = 0

    def read(self, size: int = -1) -> bytes:
        want = self.CHUNK if size is None or size < 0 else max(1, size)
        while True:
            inflater = self._inflater
            if inflater.unconsumed_tail:
                pending = inflater.unconsumed_tail
            elif inflater.eof:
                if not inflater.unused_data and self._offset >= len(self._data):
                    return b""
                # another gzip member follows (gzip allows several, one after the other)
                pending = inflater.unused_data
                self._inflater = inflater = zlib.decompressobj(wbits=zlib.MAX_WBITS | 16)
            else:
                pending = self._data[self._offset : self._offset + self.CHUNK]
                self._offset += len(pending)
                if not pending:
                    raise EOFError("the gzip stream ends early")
            out = inflater.decompress(pending, want)
            self.inflated += len(out)
            if self.inflated > self._most:
                raise ArchiveTooLarge(
                    f"extracted size passes {self._most} bytes ({self._allowed})", self.inflated, self._allowed
                )
            if out:
                return out


def sagemaker_error(status: int, code: str, message: str, **members: Any) -> Reply:
    headers = {"Content-Type": "application/json", "x-amzn-ErrorType": code, "x-amzn-RequestId": request_id()}
    return Reply(status, headers, json.dumps({"Message": message, **members}).encode())


def not_multi_model(endpoint_name: str) -> Reply:
    """SageMaker's answer to a TargetModel sent to a single-model endpoint."""
    return sagemaker_error(
        400,
        "ValidationError",
        f"Endpoint {endpoint_name} is not a multi-model endpoint and does not support target model header.",
    )


def model_error(endpoint_name: str, variant: str, status: int, text: str) -> Reply:
    """A container's 4xx/5xx as SageMaker reports it: 424 ModelError with the original status and body."""
    group = f"/aws/sagemaker/Endpoints/{endpoint_name}"
    kind = "client" if 400 <= status < 500 else "server"
    message = (
        f'Received {kind} error ({status}) from {variant} with message "{text}". See '
        f"https://{REGION}.console.aws.amazon.com/cloudwatch/home?region={REGION}#logEventViewer:group={group} "
        f"in account {ACCOUNT} for more information."
    )
    return sagemaker_error(
        424,
        "ModelError",
        message,
        OriginalStatusCode=status,
        OriginalMessage=text,
        LogStreamArn=f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{group}",
    )


def model_name_of(target_model: str) -> str:
    """The opaque name the container knows a TargetModel by (SageMaker's is opaque too)."""
    return hashlib.sha256(target_model.encode()).hexdigest()[:40]


def extraction_limit(compressed_bytes: int, max_bytes: int = MAX_EXTRACTED_BYTES) -> tuple[int, str]:
    """How many uncompressed bytes an archive of `compressed_bytes` may inflate to, and the limit in words."""
    by_ratio = max(RATIO_FLOOR_BYTES, MAX_RATIO * compressed_bytes)
    allowed = f"<= {max_bytes} bytes uncompressed, and <= {MAX_RATIO}x the archive's size past {RATIO_FLOOR_BYTES}"
    return min(max_bytes, by_ratio), allowed


def extract_archive(data: bytes, destination: Path, *, max_bytes: int = MAX_EXTRACTED_BYTES) -> None:
    """Extract a `.tar.gz` into `destination`, refusing anything that could land outside it or exhaust the disk.

    Python's `data` extraction filter (PEP 706) already refuses absolute paths, `..` and links out of the
    directory; the checks before each member also refuse every link, device and fifo, and bound the member count;
    the stream itself bounds the uncompressed size and ratio (`_Inflating`). On refusal the caller removes
    `destination` (what was written before the limit was reached)."""
    most, allowed = extraction_limit(len(data), max_bytes)
    try:
        with tarfile.open(fileobj=_Inflating(data, most, allowed), mode="r|") as tar:  # type: ignore[call-overload]
            _check_and_extract(tar, destination, max_bytes)
    except (tarfile.TarError, OSError, EOFError, zlib.error) as error:
        raise ArchiveRefused(f"not a readable gzipped tar archive ({error})") from None


def _check_and_extract(tar: tarfile.TarFile, destination: Path, max_bytes: int) -> None:
    destination.mkdir(parents=True, exist_ok=True)
    total = 0
    for count, member in enumerate(tar, start=1):
        if count > MAX_MEMBERS:
            raise ArchiveRefused(f"more than {MAX_MEMBERS} members")
        name = member.name
        if not (member.isfile() or member.isdir()):
            raise ArchiveRefused(f"member {name!r} is not a regular file or directory")
        parts = Path(name).parts
        if name.startswith("/") or ".." in parts:
            raise ArchiveRefused(f"member {name!r} would be written outside the model directory")
        total += member.size
        if total > max_bytes:
            raise ArchiveTooLarge(f"extracted size passes {max_bytes} bytes", total, f"<= {max_bytes} bytes")
        tar.extract(member, destination, filter="data")


class MultiModelFront:
    """SageMaker's multi-model orchestration for one endpoint variant in front of one container."""

    def __init__(
        self,
        *,
        endpoint_name: str,
        container_url: str,
        model_data_url: str,
        cache_dir: Path,
        s3: Any = None,
        variant: str = "AllTraffic",
        max_archive_bytes: int = MAX_ARCHIVE_BYTES,
        http: httpx.Client | None = None,
    ) -> None:
        self.endpoint_name = endpoint_name
        self.container_url = container_url.rstrip("/")
        self.model_data_url = model_data_url
        self.cache_dir = cache_dir
        self.s3 = s3
        self.variant = variant
        self.max_archive_bytes = max_archive_bytes
        self.http = http or httpx.Client(timeout=httpx.Timeout(INVOKE_TIMEOUT_SEC, connect=5.0))
        self._loaded: OrderedDict[str, str] = OrderedDict()  # model_name -> target, least recently used first
        self._lock = threading.Lock()  # guards `_loaded` and `_model_locks` only, never held across I/O
        self._model_locks: dict[str, threading.Lock] = {}  # one per model: its fetch, extraction and load
        parsed = urlsplit(model_data_url)
        if parsed.scheme == "s3" and s3 is None:
            raise ValueError(f"MultiModelFront: model_data_url={model_data_url!r} is on S3, but s3=None")

    def close(self) -> None:
        self.http.close()

    def invoke(self, target_model: str | None, request: Request) -> Reply:
        """`InvokeEndpoint` on the multi-model endpoint, for the request botocore sent."""
        if not target_model:
            return sagemaker_error(400, "ValidationError", f"Request {request_id()} is missing a target model header.")
        if not 1 <= len(target_model) <= 1024 or not target_model.isprintable() or target_model[0].isspace():
            return sagemaker_error(
                400,
                "ValidationError",
                f"1 validation error detected: Value '{target_model[:100]}' at 'targetModel' failed to satisfy "
                "constraint: Member must have length between 1 and 1024 and be printable",
            )
        name = model_name_of(target_model)
        headers = {key: value for key in FORWARDED if (value := request.header(key)) is not None}
        headers[TARGET_MODEL] = target_model
        for _ in range(2):  # a second time only when the container forgot a model it had loaded (a restart)
            failed = self._ensure_loaded(name, target_model)
            if failed is not None:
                return failed
            try:
                response = self.http.post(
                    f"{self.container_url}/models/{name}/invoke", content=request.body, headers=headers
                )
            except httpx.TimeoutException:
                message = f"Your invocation timed out while waiting for a response from container {self.variant}."
                return model_error(self.endpoint_name, self.variant, 0, message)
            except httpx.HTTPError as error:
                return self._unavailable(error)
            if response.status_code == 404 and self._forget(name):
                continue
            if response.status_code >= 400:
                return model_error(self.endpoint_name, self.variant, response.status_code, response.text)
            return Reply(
                200,
                {
                    "Content-Type": response.headers.get("content-type", "application/octet-stream"),
                    "x-Amzn-Invoked-Production-Variant": self.variant,
                    "x-amzn-RequestId": request_id(),
                },
                response.content,
            )
        return model_error(self.endpoint_name, self.variant, 404, "the container lost the model twice")

    # ---------------------------------------------------------------------------------------------- loading
    def _ensure_loaded(self, name: str, target_model: str) -> Reply | None:
        with self._lock:
            if name in self._loaded:
                self._loaded.move_to_end(name)
                return None
            model_lock = self._model_locks.setdefault(name, threading.Lock())
        with model_lock:
            with self._lock:
                if name in self._loaded:  # another caller loaded it while this one waited
                    return None
            model_dir = self.cache_dir / name / "model"
            if not (model_dir / "manifest.json").is_file():
                fetched = self._fetch(target_model)
                if isinstance(fetched, Reply):
                    return fetched
                refused = self._extract(fetched, model_dir, target_model)
                if refused is not None:
                    return refused
            failed = self._load(name, model_dir)
            if failed is not None:  # nothing of a refused model stays on the disk
                shutil.rmtree(model_dir.parent, ignore_errors=True)
            return failed

    def _extract(self, archive: bytes, model_dir: Path, target_model: str) -> Reply | None:
        """The archive extracted into `model_dir` through a staging folder; the refusal (and nothing on the disk)
        when it cannot be extracted safely."""
        staging = Path(tempfile.mkdtemp(prefix=".extract-", dir=self._ensure_cache_dir()))
        try:
            extract_archive(archive, staging / "model")
        except ArchiveTooLarge as refused:
            return sagemaker_error(
                413, "ValidationError", f"Model data for {target_model} is too large once extracted: {refused}",
                field="TargetModel", value=target_model, inflated_bytes=refused.value, allowed=refused.allowed,
            )  # fmt: skip
        except ArchiveRefused as refused:
            return sagemaker_error(
                400, "ValidationError", f"Failed to extract model data for {target_model}: {refused}",
                field="TargetModel", value=target_model, allowed="a gzipped tar of a model package",
            )  # fmt: skip
        else:
            model_dir.parent.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(model_dir, ignore_errors=True)
            (staging / "model").rename(model_dir)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return None

    def _load(self, name: str, model_dir: Path) -> Reply | None:
        """POST /models, unloading least recently used models while the container answers 507."""
        while True:
            try:
                response = self.http.post(
                    f"{self.container_url}/models", json={"model_name": name, "url": str(model_dir)}
                )
            except httpx.HTTPError as error:
                return self._unavailable(error)
            if response.status_code in (200, 409):
                with self._lock:
                    self._loaded[name] = str(model_dir)
                return None
            with self._lock:
                victim = self._loaded.popitem(last=False)[0] if response.status_code == 507 and self._loaded else None
            if victim is not None:
                try:
                    self.http.delete(f"{self.container_url}/models/{victim}")
                except httpx.HTTPError as error:
                    return self._unavailable(error)
                continue
            return model_error(self.endpoint_name, self.variant, response.status_code, response.text)

    def _forget(self, name: str) -> bool:
        with self._lock:
            return self._loaded.pop(name, None) is not None

    def _fetch(self, target_model: str) -> bytes | Reply:
        parsed = urlsplit(self.model_data_url)
        if parsed.scheme == "s3":
            bucket, key = parsed.netloc, parsed.path.lstrip("/") + target_model
            try:
                response = self.s3.get_object(Bucket=bucket, Key=key)
            except Exception:  # botocore's NoSuchKey / NoSuchBucket / AccessDenied all mean "not downloadable"
                return self._download_failed(bucket, key)
            if int(response["ContentLength"]) > self.max_archive_bytes:
                response["Body"].close()
                return sagemaker_error(
                    400, "ValidationError", f"Model data {key} is over {self.max_archive_bytes} bytes."
                )
            return bytes(response["Body"].read())
        root = Path(parsed.path if parsed.scheme == "file" else self.model_data_url).resolve()
        path = (root / target_model).resolve()
        if root not in path.parents or not path.is_file():
            return self._download_failed(str(root), target_model)
        if path.stat().st_size > self.max_archive_bytes:
            return sagemaker_error(400, "ValidationError", f"Model data {target_model} is over the limit.")
        return path.read_bytes()

    @staticmethod
    def _download_failed(bucket: str, key: str) -> Reply:
        return sagemaker_error(
            400,
            "ValidationError",
            f"Failed to download model data(bucket: {bucket}, key: {key}). Please ensure that there is an object "
            "located at the URL and that the role passed to CreateModel has permissions to download the model.",
        )

    def _unavailable(self, error: Exception) -> Reply:
        return sagemaker_error(
            503,
            "ServiceUnavailable",
            f"Endpoint {self.endpoint_name}: its container at {self.container_url} is not answering ({error})",
        )

    def _ensure_cache_dir(self) -> Path:
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        return self.cache_dir
