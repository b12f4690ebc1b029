"""The local stand-in for a SageMaker endpoint's front: production variants split by weight, a shadow copy,
per-variant metrics, and the blue/green rehearsal (servestack/local/sagemaker/rehearsal.py) that shifts the weights. An
endpoint hosting inference components runs one child per component instead, picked by the request's
`X-Amzn-SageMaker-Inference-Component` header.

`python -m servestack.local.sagemaker.endpoint DEPLOYMENT ...` (servestack/local/sagemaker/endpoint.py)
starts one realtime child (`python -m servestack.adapters.realtime serve`) per variant (and the shadow), then serves:
- every inference route (`/invocations`, `/v1/models/...`): forwarded to a variant picked at random by
  weight; the answer carries `x-Amzn-Invoked-Production-Variant`, as SageMaker's does;
- `GET /ping`: the first live variant's;
- on its control port only (`--control-port`, recorded in local up's state file and used by the CLI; on the
  port callers invoke, `/_servestack/...` is a 403), and only to a request signed with the developer's keys
  (servestack/local/sagemaker/router_admin.py), the admin routes:
  - `GET /_servestack/metrics`: requests, 4xx/5xx, latency, restarts and pid per variant;
  - `GET /_servestack/shadow`: the shadow report (label agreement, mean |probability difference|, latency of each);
  - `POST /_servestack/deploy`, `GET /_servestack/deploy`: start and follow a rehearsal;
  - `GET /_servestack/components`, `POST /_servestack/components/{name}` `{"copies": N}`: a component's copies (0
    stops its child, N >= 1 starts it again if it was stopped; locally one child stands for all its copies).
A variant's container that exits is started again, with backoff (`_watch`); meanwhile its requests get a 503
with Retry-After. The router also sheds load itself: past `max_in_flight` requests waiting on its variants, a
request is answered 429 with Retry-After at once instead of queueing without end.

Fault injection (`error_rate`, `latency_ms`) exists only here, in the local router, applied to the green side
of a rehearsal: nothing in `handlers/` or `models/` can misbehave on purpose.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from servestack.adapters.body import ClientDisconnected, ReadDeadlines, read_asgi_body
from servestack.inference.errors import ServingError
from servestack.inference.settings import SIX_MEBIBYTES
from servestack.local.hosting import RealtimeProcess, free_port, kill_group, without_identity
from servestack.local.sagemaker.backends import Backend, Faults, ShadowReport, VariantPlan
from servestack.local.sagemaker.router_admin import control
from servestack.local.sagemaker.router_http import (
    ADMIN,
    FORWARDED,
    INFERENCE_COMPONENT,
    JSON_HEADERS,
    REFUSAL_HEADERS,
    ROUTER_REFUSAL,
    TARGET_VARIANT,
    VARIANT_HEADER,
    Receive,
    Scope,
    Send,
    admin_refusal,
    local_port,
    raw_target,
    refusal_headers,
    respond,
    restarting_body,
    returned_headers,
)

if TYPE_CHECKING:
    from servestack.local.iam import ControlGate
    from servestack.local.sagemaker.data_capture import NativeCapture

logger = logging.getLogger("servestack.router")


MAX_SHADOW_IN_FLIGHT = 64
# Requests the router holds at once (forwarded or waiting on a variant), past which it answers 429: a variant's
# own admission queue is far shorter, so this bounds only a flood that would otherwise queue in the router.
DEFAULT_MAX_IN_FLIGHT = 256
WATCH_INTERVAL_SEC = 0.25


class Router:
    """The ASGI app of the router process."""

    def __init__(
        self,
        deployment: str,
        plans: list[VariantPlan],
        *,
        shadow: VariantPlan | None = None,
        shadow_percent: float = 0.0,
        registry_uri: str = "",
        child_env: dict[str, str] | None = None,
        workers: int = 1,
        rehearsal_factory: Callable[[Router, dict[str, Any]], Any] | None = None,
        max_body_bytes: int = SIX_MEBIBYTES,
        body_read_timeout_sec: float = 10.0,
        control_port: int | None = None,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        control_gate: ControlGate | None = None,
        capture: NativeCapture | None = None,
    ) -> None:
        self.deployment = deployment
        # The admin routes answer only on this port (None: nowhere); the port callers invoke refuses them.
        self.control_port = control_port
        # ... and there only to the developer's signature (servestack/local/iam/control.py's ControlGate;
        # None: every admin request is refused).
        self.control_gate = control_gate
        self.max_in_flight = max_in_flight
        self.capture = capture  # the endpoint config's DataCaptureConfig, played (data_capture.py)
        self.in_flight = 0
        self.shed = 0
        self.plans = plans
        self.shadow_plan = shadow
        self.shadow_percent = shadow_percent
        self.registry_uri = registry_uri
        self.child_env = child_env or {}
        self.workers = workers
        self.variants: list[Backend] = []
        self.shadow: Backend | None = None
        self.report = ShadowReport()
        self._shadow_tasks: set[asyncio.Task[None]] = set()
        self._random = random.Random()  # noqa: S311 - traffic splitting, not cryptography
        self.rehearsal: Any = None
        self.rehearsal_factory = rehearsal_factory
        # The container's own limit (SageMaker InvokeEndpoint's 6 MB payload limit): a bigger body is the
        # router's 413, never buffered past it and never a variant's 5xx.
        self.max_body_bytes = max_body_bytes
        self.read_deadlines = ReadDeadlines(body_read_timeout_sec)
        # Inference components: their copy counts (every component is created with at least one copy).
        self.copies: dict[str, int] = {plan.component: 1 for plan in plans if plan.component is not None}
        self._watch_task: asyncio.Task[None] | None = None
        self._restart_tasks: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------------------------------ children
    def spawn(self, plan: VariantPlan) -> RealtimeProcess:
        env = {**self.child_env, **plan.environment, "SERVESTACK_DEFAULT_MODEL": plan.model}
        env.setdefault("SERVESTACK_REGISTRY_URI", "")
        if plan.package_dir is not None:
            env["SERVESTACK_MODEL_DIR"] = str(plan.package_dir)
        elif env.get("SERVESTACK_MULTI_MODEL") == "true":
            pass  # SageMaker's multi-model mode: models arrive through POST /models
        else:
            env |= {"SERVESTACK_REGISTRY_URI": self.registry_uri, "SERVESTACK_PREWARM": f"{plan.model}@{plan.version}"}
        # The container gets its own execution role's keys (the plan's), never the router's (the developer's).
        return RealtimeProcess.start(
            f"{self.deployment}/{plan.name}", free_port(), env=env, workers=self.workers,
            argv=list(plan.argv) if plan.argv else None, cwd=plan.cwd, base_env=without_identity(os.environ),
        )  # fmt: skip

    async def start_backend(self, plan: VariantPlan, *, weight: float, faults: Faults | None = None) -> Backend:
        process = self.spawn(plan)
        try:
            await asyncio.to_thread(process.wait_ready)
        except BaseException:
            await asyncio.to_thread(process.stop)
            raise
        return Backend(
            plan.name,
            f"{plan.model}@{plan.version}",
            process,
            weight,
            faults or Faults(),
            component=plan.component,
            plan=plan,
        )

    async def start(self) -> None:
        started = await asyncio.gather(*(self.start_backend(plan, weight=plan.weight) for plan in self.plans))
        self.variants = list(started)
        if self.shadow_plan is not None:
            self.shadow = await self.start_backend(self.shadow_plan, weight=0)
        self._watch_task = asyncio.get_running_loop().create_task(self._watch())

    async def stop_backend(self, backend: Backend) -> None:
        backend.retired = True
        backend.upstream.close()
        await asyncio.to_thread(backend.process.stop)

    # ------------------------------------------------------------------------------------------ restarts
    async def _watch(self) -> None:
        """Every container that exits (SIGKILLed, crashed) is started again, with backoff."""
        while True:
            await asyncio.sleep(WATCH_INTERVAL_SEC)
            for backend in [*self.variants, *([self.shadow] if self.shadow else [])]:
                if backend.restarting or backend.retired or backend.plan is None:
                    continue
                if backend.process.process.poll() is None:
                    continue
                backend.restarting = True
                task = asyncio.get_running_loop().create_task(self._restart(backend))
                self._restart_tasks.add(task)
                task.add_done_callback(self._restart_tasks.discard)

    async def _restart(self, backend: Backend) -> None:
        assert backend.plan is not None
        dead = backend.process
        # Its workers may outlive their master (granian's workers serve the port it handed them): the group goes.
        kill_group(dead.process)
        backend.upstream.close()
        ran_sec = time.monotonic() - backend.started_at
        while not backend.is_retired():
            delay = backend.backoff.next_delay(ran_sec)
            logger.warning(
                "router: %s exited with code %s; restarting it in %.2fs (restart %d)",
                dead.name, dead.process.returncode, delay, backend.restarts + 1,
            )  # fmt: skip
            await asyncio.sleep(delay)
            started = time.monotonic()
            process = None
            try:
                process = self.spawn(backend.plan)
                await asyncio.to_thread(process.wait_ready)
            except (OSError, RuntimeError, TimeoutError) as error:
                if process is not None:
                    await asyncio.to_thread(process.stop)
                logger.warning("router: %s did not start again: %s", dead.name, error)
                ran_sec = time.monotonic() - started
                continue
            except asyncio.CancelledError:  # the router is shutting down: the new container goes with it
                if process is not None:
                    process.stop(grace_sec=2)
                raise
            if backend.is_retired():  # stopped (scaled to zero, shut down) while it was starting
                await asyncio.to_thread(process.stop)
                return
            backend.replace_process(process)
            backend.restarts += 1
            backend.restarting = False
            logger.warning("router: %s is back (restart %d)", dead.name, backend.restarts)
            return

    async def stop(self) -> None:
        if self._watch_task is not None:
            self._watch_task.cancel()
        for task in list(self._restart_tasks):
            task.cancel()
        if self.rehearsal is not None:
            await self.rehearsal.cancel()
        backends = [*self.variants, *([self.shadow] if self.shadow else [])]
        await asyncio.gather(*(self.stop_backend(backend) for backend in backends))
        if self.capture is not None:
            await asyncio.to_thread(self.capture.close)

    # ------------------------------------------------------------------------------------------ routing
    def pick(self, component: str | None = None) -> Backend | None:
        """A backend taking traffic (of `component` on an endpoint hosting components), at random by weight."""
        live = [v for v in self.variants if v.weight > 0 and v.component == component]
        if not live:
            return None
        if len(live) == 1:
            return live[0]
        point = self._random.random() * sum(v.weight for v in live)
        for backend in live:
            point -= backend.weight
            if point < 0:
                return backend
        return live[-1]

    def variant(self, name: str) -> Backend | None:
        return next((v for v in self.variants if v.name == name), None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            return await self._lifespan(receive, send)
        path, method = scope["path"], scope["method"]
        request_headers: list[tuple[bytes, bytes]] = scope["headers"]
        try:
            target = raw_target(scope)
            body = await read_asgi_body(receive, request_headers, self.max_body_bytes, self.read_deadlines)
        except ServingError as refused:
            return await respond(send, refused.status_code, JSON_HEADERS, orjson.dumps({"error": refused.to_dict()}))
        except ClientDisconnected:
            return None
        on_control_port = self.control_port is not None and local_port(scope) == self.control_port
        if path.startswith(ADMIN) or on_control_port:
            if not (path.startswith(ADMIN) and on_control_port):
                return await respond(send, 403, REFUSAL_HEADERS, admin_refusal(method, path))
            status, headers, answer = await control(self, scope, body)
            return await respond(send, status, headers, answer)
        if self.in_flight >= self.max_in_flight:
            self.shed += 1
            return await respond(
                send, 429, [*JSON_HEADERS, *refusal_headers("ThrottlingException")], self._shed_refusal()
            )
        self.in_flight += 1
        try:
            return await self._route(scope, method, path, target, request_headers, body, send)
        finally:
            self.in_flight -= 1

    def _shed_refusal(self) -> bytes:
        message = f"the endpoint's router holds {self.max_in_flight} requests already; retry after a pause"
        error = {"type": "ThrottlingException", "message": message, "field": "in_flight",
                 "value": self.in_flight, "allowed": f"<= {self.max_in_flight}"}  # fmt: skip
        return orjson.dumps({"error": error})

    async def _route(
        self, scope: Scope, method: str, path: str, target: bytes, request_headers: list[tuple[bytes, bytes]],
        body: bytes, send: Send,
    ) -> None:  # fmt: skip
        if method == "GET" and path == "/ping":
            live = [v for v in self.variants if v.weight > 0] or self.variants
            if not live:  # every component scaled to zero: the endpoint itself is still in service
                return await respond(send, 200, [(b"content-type", b"application/json")], b"{}")
            if live[0].restarting:
                return await respond(
                    send, 503, [*JSON_HEADERS, *refusal_headers("ServiceUnavailable")], restarting_body(live[0])
                )
            status, headers, payload = await self.forward(live[0], "GET", b"/ping", [], b"")
            return await respond(send, status, returned_headers(headers), payload)
        headers = [(name, value) for name, value in request_headers if name in FORWARDED]
        if self.copies:
            backend, refusal = self._component_backend(request_headers)
            if refusal is not None:
                return await respond(send, 400, [(b"content-type", b"application/json")], orjson.dumps(refusal))
        else:
            wanted = next((value for name, value in request_headers if name == TARGET_VARIANT), None)
            backend = self.pick() if wanted is None else self.variant(wanted.decode("latin-1"))
            if backend is None:  # SageMaker's TargetVariant names a production variant, whatever its weight
                names = ", ".join(v.name for v in self.variants)
                error = {"type": "ValidationError", "message": f"TargetVariant: {wanted!r} is not one of {names}"}
                refusal_body = orjson.dumps({"error": error})
                return await respond(send, 400, [(b"content-type", b"application/json")], refusal_body)
        assert backend is not None
        if backend.restarting:
            return await respond(
                send, 503, [*JSON_HEADERS, *refusal_headers("ServiceUnavailable")], restarting_body(backend)
            )
        started = time.perf_counter()
        status, response_headers, payload = await self.forward(backend, method, target, headers, body)
        elapsed = time.perf_counter() - started
        backend.record(status, elapsed * 1e6)
        extra = [(VARIANT_HEADER, backend.name.encode())]
        await respond(send, status, [*returned_headers(response_headers), *extra], payload)
        if self.capture is not None and method == "POST" and status == 200:
            self.capture.observe(
                backend.name, _header(request_headers, b"content-type") or "application/json", body,
                _header(response_headers, b"content-type") or "application/json", payload,
            )  # fmt: skip
        if self.shadow is not None and method == "POST" and self._random.random() * 100 < self.shadow_percent:
            self._copy_to_shadow(method, target, headers, body, status, payload, elapsed)
        return None

    def _component_backend(self, headers: list[tuple[bytes, bytes]]) -> tuple[Backend | None, Any]:
        """The backend of the request's inference component, or the refusal SageMaker makes (the SageMaker
        Runtime front makes them first; a request sent to the router directly gets them here)."""
        from servestack.local.sagemaker.runtime_front import COMPONENT_NAME_REQUIRED, NO_CAPACITY

        raw = next((value for name, value in headers if name == INFERENCE_COMPONENT), None)
        allowed = ", ".join(self.copies)
        field_name = "X-Amzn-SageMaker-Inference-Component"
        if raw is None:
            error = {"type": "ValidationError", "message": COMPONENT_NAME_REQUIRED, "field": field_name}
            return None, {"error": {**error, "value": None, "allowed": allowed}}
        name = raw.decode("latin-1")
        if name not in self.copies:
            message = f"Inference Component {name} is not hosted by this endpoint"
            return None, {"error": {"type": "ValidationError", "message": message, "field": field_name,
                                    "value": name, "allowed": allowed}}  # fmt: skip
        backend = self.pick(name)
        if backend is None:
            return None, {"error": {"type": "ValidationError", "message": NO_CAPACITY, "field": field_name,
                                    "value": name, "allowed": f"a component with copies ({allowed})"}}  # fmt: skip
        return backend, None

    async def scale(self, component: str, copies: int) -> dict[str, Any]:
        """Set a component's copies: 0 stops its children; from 0 to N >= 1 its child starts again (the plan's
        version, the live one after a rehearsal). Returns once the change is in service."""
        plan = next(p for p in self.plans if p.component == component)
        running = [v for v in self.variants if v.component == component]
        if copies == 0:
            for backend in running:
                self.variants.remove(backend)
            await asyncio.gather(*(self.stop_backend(backend) for backend in running))
        elif not running:
            self.variants.append(await self.start_backend(plan, weight=plan.weight or 1.0))
        self.copies[component] = copies
        return self.components()

    def components(self) -> dict[str, Any]:
        """Each component's copies, its backends, and how many of them serve now (not restarting)."""
        return {
            name: {
                "copies": copies,
                "backends": [v.name for v in self.variants if v.component == name],
                "serving": sum(1 for v in self.variants if v.component == name and not v.restarting),
            }
            for name, copies in self.copies.items()
        }

    async def forward(
        self, backend: Backend, method: str, path: bytes, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        faults = backend.faults
        if faults.latency_ms:
            await asyncio.sleep(faults.latency_ms / 1000)
        if faults.error_rate and self._random.random() < faults.error_rate:
            error = {"type": "InjectedFault", "message": f"rehearsal fault injected into variant {backend.name}"}
            return 500, [(b"content-type", b"application/json")], orjson.dumps({"error": error})
        try:
            status, answered, payload = await backend.upstream.request(method, path, headers, body)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            error = {"type": "VariantUnavailable", "message": f"variant {backend.name}: {type(exc).__name__}"}
            return 502, [*JSON_HEADERS, *refusal_headers("ServiceUnavailable")], orjson.dumps({"error": error})
        # the refusal marker is the router's alone: a container's answer never carries it through
        return status, [(name, value) for name, value in answered if name != ROUTER_REFUSAL], payload

    def _copy_to_shadow(
        self,
        method: str,
        path: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        primary_status: int,
        primary_body: bytes,
        primary_sec: float,
    ) -> None:
        """After the primary answer is sent: a copy goes to the shadow in a task nobody awaits."""
        if len(self._shadow_tasks) >= MAX_SHADOW_IN_FLIGHT:
            self.report.dropped += 1
            return
        shadow = self.shadow
        assert shadow is not None

        async def copy() -> None:
            started = time.perf_counter()
            try:
                status, _, payload = await shadow.upstream.request(method, path, headers, body)
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                status, payload = 599, b""
            elapsed = time.perf_counter() - started
            shadow.record(status, elapsed * 1e6)
            report = self.report
            report.copied += 1
            report.primary_ms.append(primary_sec * 1000)
            report.shadow_ms.append(elapsed * 1000)
            if status != 200:
                report.shadow_errors += 1
            elif primary_status == 200:
                report.compare(primary_body, payload)

        task = asyncio.get_running_loop().create_task(copy())
        self._shadow_tasks.add(task)
        task.add_done_callback(self._shadow_tasks.discard)

    # ------------------------------------------------------------------------------------------ admin
    def metrics(self) -> dict[str, Any]:
        return {
            "deployment": self.deployment,
            "in_flight": self.in_flight,
            "shed": self.shed,  # requests answered 429 because the router held max_in_flight already
            "variants": {v.name: v.summary() for v in self.variants},
            "shadow": {self.shadow.name: self.shadow.summary()} if self.shadow else None,
        }

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.start()
                except Exception as exc:
                    logger.exception("router: variants failed to start")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    return next((value.decode("latin-1") for key, value in headers if key.lower() == name), None)
