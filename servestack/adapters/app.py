"""The ASGI app shared by the SageMaker container (realtime.py) and Lambda (serverless.py).

A thin dispatcher answers the hot routes itself: `POST /invocations`, `POST /v1/models/{name}/predict`
and `GET /ping`. FastAPI's per-request machinery would halve the throughput of a small model, and importing
it would double a Lambda cold start. Every other route (`/v1/models`, `/docs`, `/openapi.json`) goes to a
FastAPI app built on first use, which also documents the hot routes. Errors are JSON
`{"error": {"type", "message", "field", "value", "allowed"}}` with the status their `ServingError` carries.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

import orjson

from servestack.adapters.body import (
    DRAIN_BYTES,
    ASGIBody,
    BodySource,
    ClientDisconnected,
    ReadDeadlines,
    RequestHeaders,
    SpooledBody,
)
from servestack.adapters.reject_pause import RejectPause
from servestack.adapters.transform import PREFIX as TRANSFORM_PREFIX
from servestack.adapters.transform import TransformRoutes, TransformSettings
from servestack.inference import media_types
from servestack.inference.batching import BatchingConfig, MicroBatcher
from servestack.inference.cache import ModelCache
from servestack.inference.capture import Capturer, capturer_from
from servestack.inference.errors import InternalError, Overloaded, ServingError, redact
from servestack.inference.multi_model import MultiModelStore
from servestack.inference.runtime import Arrays
from servestack.inference.service import ModelRepository, ServedModel
from servestack.inference.settings import ServingSettings

if TYPE_CHECKING:
    from fastapi import FastAPI

    from servestack.adapters.multi_model import MultiModelRoutes

logger = logging.getLogger("servestack.handlers")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
# How a prediction route answers, whichever interface carries the request: (status, body, content type, extra
# headers). ASGI sends two messages (`_respond`: an awaitable); granian's RSGI makes one call at once and returns
# None (servestack/adapters/rsgi.py), so the usual answer costs no coroutine.
Respond = Callable[[int, bytes, bytes, list[tuple[bytes, bytes]] | None], Awaitable[None] | None]
# Single-model serving, the registry-backed LRU cache, or SageMaker's multi-model contract.
Repository = ModelRepository | ModelCache | MultiModelStore

# The request headers a prediction reads, by their lower-case names. RSGI hands the app a mapping of them as
# str (servestack/adapters/rsgi.py passes it on as it is); ASGI's byte pairs are turned into one (`_predict`).
TARGET_MODEL = "x-amzn-sagemaker-target-model"
CUSTOM_ATTRIBUTES = "x-amzn-sagemaker-custom-attributes"
CONTENT_ENCODING = "content-encoding"
EXPECT = "expect"
WANTED_HEADERS = ("content-type", "accept", "content-length", TARGET_MODEL, CUSTOM_ATTRIBUTES, CONTENT_ENCODING, EXPECT)
_WANTED_ASGI = {name.encode("latin-1"): name for name in WANTED_HEADERS}
_CUSTOM_ATTRIBUTES_BYTES = CUSTOM_ATTRIBUTES.encode("latin-1")
PREDICT_PREFIX, PREDICT_SUFFIX = "/v1/models/", "/predict"
# A body up to this size is decoded on the event loop, where a small request is answered fastest; a larger one
# (or an encoded one, whatever it expands to) on the worker's decode thread, so that no request holds the loop
# for long. Decoding costs 5 to 150 microseconds per KiB, by form (bench: orjson rows of floats the least, CSV
# by column name the most), so a body on the loop holds it at most ~10 ms; handing one to the thread and back
# costs ~50 microseconds, at most a fifth of decoding even the cheapest 64 KiB body (docs/http-contract.md).
# A model that decodes pictures (`models push --image`) decodes every body on the thread, however small: a JPEG
# costs milliseconds (bench/images.py), and Pillow's decoder lets go of the GIL meanwhile.
DECODE_INLINE_BYTES = 64 * 1024


def error_body(error: ServingError) -> bytes:
    return orjson.dumps({"error": error.to_dict()})


class ServingApp:
    """The ASGI callable. With `load_in_background`, models load after start-up so `/ping` answers 503
    while they load (the container contract); otherwise the caller has loaded them (Lambda init)."""

    def __init__(
        self, repository: Repository, *, load_in_background: bool = False, freeze_after_load: bool = False
    ) -> None:
        self.repository = repository
        self.settings = repository.settings
        self.load_in_background = load_in_background
        self.freeze_after_load = freeze_after_load  # a serving worker's own process (`_load_quietly`)
        self._batchers: dict[str, MicroBatcher] = {}
        # The batcher each target (None: the default model) last resolved to, so a full worker can refuse a
        # request before resolving its model or reading its body (`_refuse`); emptied when a model is evicted.
        self._target_batchers: dict[str | None, MicroBatcher] = {}
        # With a fixed repository, the model and batcher each target resolved to (`_resolve`).
        self._routes: dict[str | None, tuple[ServedModel, MicroBatcher]] = {}
        self._refusals: dict[int, tuple[tuple[bytes, bytes], bytes]] = {}
        self._reject_pause = RejectPause(self.settings.reject_pause_ms / 1000)
        self._fastapi: FastAPI | None = None
        self._metrics_task: asyncio.Task[None] | None = None
        self._decoder: ThreadPoolExecutor | None = None  # started by the first large body (`_decode_aside`)
        self.read_deadlines = ReadDeadlines(self.settings.body_read_timeout_sec)
        # Data capture: a record per sampled request, written once its answer is sent (None: off, one test).
        self.capturer: Capturer | None = capturer_from(self.settings.capture, variant=self.settings.variant_name)
        if isinstance(repository, ModelCache | MultiModelStore):
            repository.on_evict = self._drop_batcher
        # SageMaker Batch Transform's routes (servestack/adapters/transform.py), kept apart from the realtime ones.
        self.transform = TransformRoutes(
            TransformSettings.from_environment(prefix=TRANSFORM_PREFIX),
            lambda: self.repository.resolve(None),
            self.read_deadlines,
        )
        self.multi_model: MultiModelRoutes | None = None
        if isinstance(repository, MultiModelStore):
            from servestack.adapters.multi_model import MultiModelRoutes

            self.multi_model = MultiModelRoutes(repository, self._predict)

    # ------------------------------------------------------------------------------------------ dispatch
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path, method = scope["path"], scope["method"]
            if method == "POST":
                target = self.prediction_route(path)
                if target is not False:
                    return await self._predict(scope, receive, send, target)
                if path == "/invocations":  # a SageMaker Batch Transform job's mini-batches
                    return await self.transform.invocations(scope, receive, send)
            elif method == "GET" and path == "/ping":
                status, body = self.ping()
                return await _respond(send, status, body, b"application/json")
            elif method == "GET" and path == "/execution-parameters":
                return await self.transform.execution_parameters(send)
            elif method == "GET" and path == "/v1/cache":
                return await _respond(send, 200, orjson.dumps(self.cache_metrics()), b"application/json")
            if self.multi_model is not None and (path == "/models" or path.startswith("/models/")):
                return await self.multi_model(scope, receive, send)
        elif scope["type"] == "lifespan":
            return await self._lifespan(receive, send)
        return await self.fastapi(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.startup(asyncio.get_running_loop())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._metrics_task is not None:
                    self._metrics_task.cancel()
                    await asyncio.gather(self._metrics_task, return_exceptions=True)
                self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def startup(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start-up, whichever interface runs a container's app (not Lambda's): models load in the background if
        asked, the overload metrics start on `loop`, capture lines go out in bursts (`Capturer.coalesce`)."""
        if self.load_in_background:
            threading.Thread(target=self._load_quietly, name="model-loader", daemon=True).start()
        self._start_metrics(loop)
        if self.capturer is not None:
            self.capturer.coalesce(loop)

    def shutdown(self) -> None:
        """Shut-down: the metrics stop, batchers and model caches close."""
        if self._metrics_task is not None:
            self._metrics_task.cancel()
        if self._decoder is not None:
            self._decoder.shutdown(wait=False, cancel_futures=True)
        for batcher in self._batchers.values():
            batcher.close()
        if isinstance(self.repository, ModelCache | MultiModelStore):
            self.repository.close()
        if self.capturer is not None:  # the lines still waiting
            self.capturer.flush()

    def _start_metrics(self, loop: asyncio.AbstractEventLoop) -> None:
        """With `metrics_interval_sec` set, write overload metrics (EMF) to stdout (servestack/adapters/metrics.py)."""
        if self.settings.metrics_interval_sec <= 0:
            return
        from servestack.adapters.metrics import OverloadMetrics

        metrics = OverloadMetrics(
            lambda: list(self._batchers.values()),
            endpoint_name=self.settings.endpoint_name,
            variant_name=self.settings.variant_name,
            interval_sec=self.settings.metrics_interval_sec,
        )
        self._metrics_task = loop.create_task(metrics.run())

    def _load_quietly(self) -> None:
        try:
            self.repository.load_all()
        except ServingError:
            return  # the state and the error stay on the repository: /ping reports them, the log has them
        # What start-up built (modules, sessions, manifests) lives as long as the worker: moved out of the
        # collector's reach, a full collection no longer walks it (see `servestack.adapters.realtime.tune_collector`).
        if self.freeze_after_load:
            gc.collect()
            gc.freeze()

    # ------------------------------------------------------------------------------------------ routes
    def ping(self) -> tuple[int, bytes]:
        body: dict[str, Any] = {"status": self.repository.state}
        if self.repository.error:
            body["error"] = redact(self.repository.error)
        return (200 if self.repository.ready else 503), orjson.dumps(body)

    def cache_metrics(self) -> dict[str, Any]:
        if isinstance(self.repository, ModelCache):
            return {"mode": "multi-model", **self.repository.metrics()}
        return {"mode": "single-model", "resident": [model.manifest.key for model in self.repository.models()]}

    def _drop_batcher(self, key: str) -> None:
        """An evicted model's batcher goes too; requests already holding it finish on it."""
        self._batchers.pop(key, None)
        self._target_batchers.clear()
        self._routes.clear()

    def batcher(self, model: ServedModel) -> MicroBatcher:
        key = model.key
        batcher = self._batchers.get(key)
        if batcher is None:
            config = BatchingConfig(
                max_batch_size=self.settings.max_batch_size,
                max_delay_ms=self.settings.max_delay_ms,
                max_queue_rows=self.settings.max_queue_rows,
                max_queue_requests=self.settings.max_queue_requests,
                use_thread="CUDAExecutionProvider" in model.runtime.providers,
            )
            batcher = self._batchers[key] = MicroBatcher(model.predict, config)
        return batcher

    def prediction_route(self, path: str) -> str | Literal[False] | None:
        """For a POST to `path`: the model name a prediction route names (None: the default or target model),
        or False for no prediction route. In a Batch Transform job `/invocations` takes mini-batches instead."""
        if path == "/invocations":
            return False if self.transform.settings.batch else None
        if path.startswith(PREDICT_PREFIX) and path.endswith(PREDICT_SUFFIX):
            name = path[len(PREDICT_PREFIX) : -len(PREDICT_SUFFIX)]
            if name and "/" not in name:
                return name
        return False

    async def _predict(self, scope: Scope, receive: Receive, send: Send, name: str | None) -> None:
        headers = {_WANTED_ASGI[key]: value.decode("latin-1") for key, value in scope["headers"] if key in _WANTED_ASGI}
        await self.answer_prediction(headers, ASGIBody(receive), partial(_respond, send), name)

    async def answer_prediction(
        self, headers: RequestHeaders, source: BodySource, respond: Respond, name: str | None
    ) -> None:
        """One prediction request, answered: `headers` holds those of WANTED_HEADERS the request carries; the
        body comes from `source` (ASGI's `receive`, or servestack/adapters/rsgi.py's RSGI protocol), the answer goes to
        `respond`. Read, decode, batch, predict, encode, in one coroutine (each frame less is one less to
        resume twice per request: once the body is in, once the batch has run).

        The body is read before the request takes an admission slot, so a slot is never held by bytes that
        have not arrived; a worker already full answers 429 without reading it. Like every refusal made
        before the body is read, that answer first drains the body (a bounded amount), so that a caller
        still sending it sees the answer (servestack/adapters/body.py)."""
        target = name if name is not None else headers.get(TARGET_MODEL)
        route = self._routes.get(target)  # a model of a fixed repository, served before: no lookup
        known = route[1] if route is not None else self._target_batchers.get(target)
        if known is not None and known.full():
            await self._refuse(known, headers, source, respond)
            return
        extra = _custom_attributes(headers) if CUSTOM_ATTRIBUTES in headers else None
        try:
            try:
                if route is None:
                    model, batcher = await self._resolve(target)
                    batcher.check_admission()
                else:  # `known` was not full just above, with no await since
                    model, batcher = route
                accept = headers.get("accept")
                media_type = _ACCEPTED.get(accept) or _memo(_ACCEPTED, accept, media_types.answer_type_of)
            except ServingError:
                if EXPECT not in headers:
                    await source.drain(DRAIN_BYTES, self.read_deadlines)
                raise
            limit = self.settings.max_payload_bytes
            body = await source.read(
                limit, headers.get("content-length"), self.read_deadlines, expect_continue=EXPECT in headers
            )
            content_type = headers.get("content-type")
            request_type = _CONTENT_TYPES.get(content_type) or _memo(
                _CONTENT_TYPES, content_type, media_types.request_type_of
            )
            if type(body) is not bytes:  # spooled to disk (SageMaker async's large bodies)
                arrays = await self._decode_aside(model, body, request_type, headers.get(CONTENT_ENCODING), limit)
            elif len(body) <= DECODE_INLINE_BYTES and CONTENT_ENCODING not in headers and model.image is None:
                arrays = model.decode(body, request_type)
            else:  # on the decode thread: the loop goes on answering (/ping, other requests) meanwhile
                arrays = await self._decode_aside(model, body, request_type, headers.get(CONTENT_ENCODING), limit)
            batcher.acquire()
            try:
                outputs = await batcher.submit(
                    arrays, next(iter(arrays.values())).shape[0], self.settings.request_timeout_sec
                )
            finally:
                batcher.release()
            encoded = model.answer(outputs, media_type)
        except Overloaded as error:
            retry_after, refusal_body = self._refusal(error.retry_after_sec)
            await self._reject_pause.wait()
            await _sent(respond(429, refusal_body, b"application/json", [retry_after, *(extra or ())]))
            return
        except ServingError as error:
            if error.status_code >= 500 and not error.retryable:
                logger.error("%s: %s", error.error_type, error.message)
            await _sent(respond(error.status_code, error_body(error), b"application/json", extra))
            return
        except ClientDisconnected:
            return
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except Exception:
            # Never let a bug escape as an exception: under Mangum it would fail the whole invocation.
            logger.exception("unexpected failure serving %s", target or self.settings.default_model)
            internal = InternalError("internal error; see the server log")
            await _sent(respond(500, error_body(internal), b"application/json", extra))
            return
        sent = respond(200, encoded.body, _MEDIA_TYPE_BYTES[encoded.media_type], extra)
        if sent is not None:
            await sent
        capturer = self.capturer
        if capturer is not None and (capturer.always or capturer.sampled()):
            # The body as it came, with the media type it was read as (a spooled one is not kept: its inputs are).
            if capturer.raw_online and type(body) is bytes:
                capturer.answered_raw(model, arrays, encoded, body, request_type)
            else:
                capturer.answered(model, arrays, encoded, body if type(body) is bytes else None, None, request_type)

    def _decode_aside(
        self, model: ServedModel, body: bytes | SpooledBody, content_type: str, encoding: str | None, limit: int
    ) -> asyncio.Future[Arrays]:
        """Decode a large or encoded body on this worker's decode thread (one, so large bodies queue rather than
        pile up threads that would only take turns on the GIL); see `DECODE_INLINE_BYTES`."""
        if self._decoder is None:
            self._decoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="decode")
        return asyncio.get_running_loop().run_in_executor(
            self._decoder, _decode_body, model, body, content_type, encoding, limit
        )

    async def _resolve(self, target: str | None) -> tuple[ServedModel, MicroBatcher]:
        """The model a target names and its batcher, remembered for the next request: as a route when the
        repository's models never change (a `ModelRepository` once loaded), else as the batcher alone, which
        lets a full worker refuse before the lookup (a cache's lookup also keeps its LRU order)."""
        model = self.repository.lookup(target)
        if model is None:  # a multi-model cache miss: load (once, however many requests wait for it)
            assert isinstance(self.repository, ModelCache | MultiModelStore)
            model = await asyncio.wrap_future(self.repository.load(target))
        batcher = self.batcher(model)
        if isinstance(self.repository, ModelRepository):
            if len(self._routes) < _MEMO_LIMIT:
                self._routes[target] = (model, batcher)
        elif target not in self._target_batchers and len(self._target_batchers) < _MEMO_LIMIT:
            self._target_batchers[target] = batcher
        return model, batcher

    async def _refuse(
        self, batcher: MicroBatcher, headers: RequestHeaders, source: BodySource, respond: Respond
    ) -> None:
        """429 for a worker already full, at the least cost: no model lookup, no body read beyond the drain
        that lets the client see the answer, no exception, a body and headers built once per Retry-After
        value, and the reject pause shared with every other refusal of its moment (`RejectPause`)."""
        retry_after, body = self._refusal(batcher.refuse())
        if EXPECT not in headers:
            try:
                await source.drain(DRAIN_BYTES, self.read_deadlines)
            except ClientDisconnected:
                return
        extra = [retry_after]
        if CUSTOM_ATTRIBUTES in headers:
            extra.extend(_custom_attributes(headers))
        await self._reject_pause.wait()
        await _sent(respond(429, body, b"application/json", extra))

    def _refusal(self, retry_after_sec: int) -> tuple[tuple[bytes, bytes], bytes]:
        """Every 429's Retry-After header and body, built once per Retry-After value."""
        found = self._refusals.get(retry_after_sec)
        if found is None:
            body = error_body(
                Overloaded(
                    f"worker is full; retry after {retry_after_sec}s",
                    field="queue",
                    value="full",
                    allowed=f"<= {self.settings.max_queue_requests} requests and "
                    f"{self.settings.max_queue_rows} rows per worker",
                    retry_after_sec=retry_after_sec,
                )
            )
            found = ((b"retry-after", str(retry_after_sec).encode()), body)
            if len(self._refusals) < _MEMO_LIMIT:
                self._refusals[retry_after_sec] = found
        return found

    @property
    def fastapi(self) -> FastAPI:
        if self._fastapi is None:
            from servestack.adapters.docs import create_fastapi

            self._fastapi = create_fastapi(self)
        return self._fastapi


def _decode_body(
    model: ServedModel, body: bytes | SpooledBody, content_type: str, encoding: str | None, limit: int
) -> Arrays:
    if isinstance(body, SpooledBody):
        # An .npy body is viewed where it lies, in the file's pages (its array is a view of the mapping, which
        # stays open as long as the array does); other forms are parsed, so they are read back into memory.
        if content_type == media_types.NPY and encoding is None:
            return model.decode_mapped(body.mapped())
        body = body.read_all()
    if encoding is not None:
        body = media_types.decode_content(body, encoding, limit)
    return model.decode(body, content_type)


async def _respond(
    send: Send, status: int, body: bytes, content_type: bytes, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    if extra:
        headers.extend(extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _sent(sent: Awaitable[None] | None) -> None:
    """A `Respond`'s answer sent: awaited where it is an awaitable (ASGI), already sent where it is None (RSGI)."""
    if sent is not None:
        await sent


def _custom_attributes(headers: RequestHeaders) -> list[tuple[bytes, bytes]]:
    """SageMaker's custom attributes go back to the caller as they came (the response header of the same name)."""
    return [(_CUSTOM_ATTRIBUTES_BYTES, (headers.get(CUSTOM_ATTRIBUTES) or "").encode("latin-1"))]


# Header values repeat from request to request; parse each distinct one once (bounded, so callers sending
# ever-new values cost a parse each, never memory).
_CONTENT_TYPES: dict[str | None, str] = {}
_ACCEPTED: dict[str | None, str] = {}
_MEDIA_TYPE_BYTES = {media_type: media_type.encode() for media_type in media_types.ANSWER_TYPES}
_MEMO_LIMIT = 256


def _memo(memo: dict[str | None, str], raw: str | None, parse: Callable[[str | None], str]) -> str:
    found = memo.get(raw)
    if found is None:
        found = parse(raw)  # raises for an unusable value, which is then never remembered
        if len(memo) < _MEMO_LIMIT:
            memo[raw] = found
    return found


def create_app(
    repository: Repository, *, load_in_background: bool = False, freeze_after_load: bool = False
) -> ServingApp:
    return ServingApp(repository, load_in_background=load_in_background, freeze_after_load=freeze_after_load)


def build_repository(settings: ServingSettings) -> Repository:
    """Single-model serving from `model_dir`; with `registry_uri` set, the registry-backed cache; with
    `multi_model` set, SageMaker's multi-model contract (SageMaker loads and unloads the models)."""
    if settings.multi_model:
        return MultiModelStore(settings)
    if not settings.registry_uri:
        return ModelRepository(settings)
    from servestack.adapters.aws.registry import open_registry

    return ModelCache(settings, open_registry(settings.registry_uri))
