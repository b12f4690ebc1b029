"""The blue/green rehearsal a local router runs for `servestack local deploy NAME --version V`.

It does what SageMaker's blue/green update does with the deployment's `strategy`: start the green fleet
(the new version, fetched from the registry), shift traffic to it (canary x% for an interval, then all; or
linear steps; or all at once), keep the blue fleet through the bake time, and roll back when an alarm fires.
The alarms are `servestack.alarms.sagemaker_variant_alarms(deployment.alarms)`, the definitions the CDK
constructs deploy, evaluated on the router's live observations of the green side (period and number of
periods can be shortened for a rehearsal). On success the green fleet takes the variant's name, the blue
fleet stops, and the registry's `live` alias moves to the new version. Every step goes on a timeline.

On an endpoint hosting inference components, a rehearsal updates one component (`component` in the request):
blue and green are that component's copies, requests naming it split between them, the alarms are the
component's (named as the template names them, `<component>-5xx-rate`...), and the other components serve
untouched throughout. SageMaker rolls a component's copies over in batches; the rehearsal shifts the
component's traffic in the strategy's steps, as for a variant.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from servestack.alarms import AlarmDefinition, datapoints, sagemaker_variant_alarms
from servestack.inference.errors import ServingError
from servestack.local.sagemaker.backends import Backend, Faults, VariantPlan
from servestack.local.sagemaker.router import Router
from servestack.local.sagemaker.variant_start import prepare
from servestack.spec import RealtimeDeployment, ServingSpec

logger = logging.getLogger("servestack.rehearsal")
STRATEGIES = ("canary", "linear", "all_at_once")
GREEN_ROOTS = "sagemaker"  # under the cache folder: each green fleet's /opt/ml/model, removed once it is retired


def _remove(root: Path | None) -> None:
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)


@dataclass(frozen=True)
class Step:
    percent: int  # of the traffic on green
    hold_sec: float
    label: str


def steps_of(
    kind: str, canary_percent: int, linear_step_percent: int, interval_sec: float, bake_sec: float
) -> list[Step]:
    """The traffic shifts of a strategy; the last step (100%) is held for the bake time."""
    shifts: list[Step] = []
    if kind == "canary":
        shifts.append(Step(canary_percent, interval_sec, f"canary {canary_percent}%"))
    elif kind == "linear":
        shifts += [
            Step(p, interval_sec, f"linear step {p}%") for p in range(linear_step_percent, 100, linear_step_percent)
        ]
    shifts.append(Step(100, bake_sec, "all traffic, baking"))
    return shifts


def _number(request: dict[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    value = request.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise ValueError(f"{key}: {value!r} is not a number in {lo:g}..{hi:g}")
    return float(value)


class Rehearsal:
    def __init__(
        self,
        router: Router,
        *,
        deployment: str,
        version: str,
        steps: list[Step],
        alarms: list[AlarmDefinition],
        faults: Faults,
        cache_dir: Path,
        strategy: dict[str, Any],
        component: str | None = None,
    ) -> None:
        self.router = router
        self.component = component
        self.deployment = deployment
        self.version = version
        self.steps = steps
        self.alarms = alarms
        self.faults = faults
        self.cache_dir = cache_dir
        self.strategy = strategy
        self.state = "pending"
        self.timeline: list[dict[str, Any]] = []
        self.fired: dict[str, Any] | None = None
        self.started = time.monotonic()
        self._task: asyncio.Task[None] | None = None
        self.blue: Backend | None = None
        self.green: Backend | None = None
        self.green_root: Path | None = None  # the green fleet's instance root, when it downloaded its model

    @classmethod
    def from_request(
        cls, router: Router, spec: ServingSpec, deployment: str, request: dict[str, Any], *, cache_dir: Path
    ) -> Rehearsal:
        """Validate a POST /_servestack/deploy body; errors name the field, the value and what is allowed."""
        d = spec.deployments[deployment]
        assert isinstance(d, RealtimeDeployment)
        if d.multi_model:
            raise ValueError(f"{deployment}: multi_model endpoints load versions on demand; nothing to rehearse")
        component = request.get("component")
        if router.copies:
            hosted = ", ".join(router.copies)
            if component is None:
                raise ValueError(
                    f"component: missing is not allowed: {deployment} hosts inference components ({hosted})"
                )
            if component not in router.copies:
                raise ValueError(
                    f"component: {component!r} is not one of {deployment}'s inference components ({hosted})"
                )
        elif component is not None:
            raise ValueError(f"component: {component!r} is not allowed: {deployment} hosts no inference components")
        live = [v for v in router.variants if v.weight > 0 and v.component == component]
        if component is not None and not live:
            raise ValueError(f"component: {component} has no copy in service; set its copies to 1 or more first")
        if len(live) != 1:
            raise ValueError(f"{deployment}: has {len(live)} production variants taking traffic, rehearsal needs 1")
        version = request.get("version")
        if not isinstance(version, str) or not version:
            raise ValueError(f"version: {version!r} is not a version label")
        kind = request.get("strategy") or d.strategy.type
        if kind not in STRATEGIES:
            raise ValueError(f"strategy: {kind!r} is not one of {', '.join(STRATEGIES)}")
        canary = int(_number(request, "canary_percent", d.strategy.canary_percent, 1, 99))
        step = int(_number(request, "linear_step_percent", d.strategy.linear_step_percent, 1, 99))
        interval = _number(request, "interval_sec", d.strategy.interval_minutes * 60, 0.1, 3600)
        bake = _number(request, "bake_sec", d.strategy.bake_minutes * 60, 0, 3600)
        period = int(_number(request, "period_sec", d.alarms.period_sec, 1, 3600))
        periods = int(_number(request, "evaluation_periods", d.alarms.evaluation_periods, 1, 30))
        faults = Faults.parse(request.get("faults"))
        alarms = [a.with_period(period, periods) for a in sagemaker_variant_alarms(d.alarms)]
        strategy = {"type": kind, "canary_percent": canary, "linear_step_percent": step}
        strategy |= {
            "interval_sec": interval,
            "bake_sec": bake,
            "alarm_period_sec": period,
            "evaluation_periods": periods,
        }
        return cls(
            router,
            deployment=deployment,
            version=version,
            steps=steps_of(kind, canary, step, interval, bake),
            alarms=alarms,
            faults=faults,
            cache_dir=cache_dir,
            strategy=strategy,
            component=component,
        )

    # ------------------------------------------------------------------------------------------ state
    @property
    def done(self) -> bool:
        return self.state in ("succeeded", "rolled_back", "failed")

    def event(self, what: str, **details: Any) -> None:
        now = time.monotonic()
        entry = {
            "at": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "wall": time.time(),
            "t_sec": round(now - self.started, 3),
            "event": what,
            **details,
        }
        self.timeline.append(entry)
        logger.info("rehearsal %s: %s %s", self.deployment, what, details or "")

    def status(self) -> dict[str, Any]:
        return {
            "deployment": self.deployment,
            "component": self.component,
            "version": self.version,
            "from": self.blue.model if self.blue else None,
            "state": self.state,
            "strategy": self.strategy,
            "faults": {"error_rate": self.faults.error_rate, "latency_ms": self.faults.latency_ms},
            "alarms": [self.describe_alarm(a) for a in self.alarms],
            "fired": self.fired,
            "green": self.green.summary() if self.green else None,
            "blue": self.blue.summary() if self.blue else None,
            "timeline": self.timeline,
        }

    @property
    def alarm_prefix(self) -> str:
        """A component's alarms carry its name, as in the template; a variant rehearsal's the deployment's."""
        return self.component or self.deployment

    def describe_alarm(self, alarm: AlarmDefinition) -> dict[str, Any]:
        return {
            "name": f"{self.alarm_prefix}-{alarm.name}",
            "metric": alarm.metric,
            "statistic": alarm.statistic,
            "threshold": alarm.threshold,
            "unit": alarm.unit,
            "period_sec": alarm.period_sec,
            "evaluation_periods": alarm.evaluation_periods,
        }

    def begin(self) -> None:
        self.state = "running"
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def cancel(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.green is not None and self.green in self.router.variants and self.state != "succeeded":
            self.router.variants.remove(self.green)
            await self.router.stop_backend(self.green)

    # ------------------------------------------------------------------------------------------ the run
    async def _run(self) -> None:
        try:
            await self._rehearse()
        except asyncio.CancelledError:
            self.state = "failed"
            raise
        except (ServingError, OSError, RuntimeError, TimeoutError, ValueError) as exc:  # VariantStartError too
            message = exc.message if isinstance(exc, ServingError) else str(exc)
            self.event("failed", reason=message)
            self.state = "failed"
            if self.green is not None and self.green in self.router.variants:
                await self._retire(self.green)
                if self.blue is not None:
                    self.blue.weight = 100
            await asyncio.to_thread(_remove, self.green_root)

    async def _rehearse(self) -> None:
        from servestack.registry import open_registry

        blue = next(v for v in self.router.variants if v.weight > 0 and v.component == self.component)
        self.blue = blue
        name = blue.model.split("@")[0]
        started = {"component": self.component} if self.component else {}
        self.event("started", blue=blue.model, green=f"{name}@{self.version}", strategy=self.strategy, **started)
        registry = open_registry(self.router.registry_uri)
        version = await asyncio.to_thread(registry.resolve, name, self.version)
        self.version = version  # the version blue serves too: a redeploy, a new fleet of the same model
        # Green is the blue variant's container (image command, environment, role) with the new model, and it
        # starts as a variant starts (servestack/local/sagemaker/variant_start.py): its image pulled with the execution
        # role, and its model downloaded with the role from the template's ModelDataUrl when that holds the
        # version; another version comes from the registry (servestack/local/up/fidelity.py says so).
        blue_plan = next((p for p in self.router.plans if p.name == blue.name), None)
        source = blue_plan.source if blue_plan is not None else None
        if source is not None and source.holds(version):
            self.green_root = self.cache_dir / GREEN_ROOTS / self.deployment / f"green-{uuid.uuid4().hex[:12]}"
            package = await asyncio.to_thread(prepare, source, self.green_root)
        else:
            if source is not None:
                await asyncio.to_thread(prepare, source, None)  # the image pull
            package = await asyncio.to_thread(registry.fetch, name, version, self.cache_dir)
        self.event("green starting", package=str(package), faults=self.strategy_faults())
        if blue_plan is None:
            plan = VariantPlan("green", name, version, 0, package, component=self.component)
        else:
            plan = replace(blue_plan, name="green", model=name, version=version, weight=0, package_dir=package)
        self.green = green = await self.router.start_backend(plan, weight=0, faults=self.faults)
        self.router.variants.append(green)
        self.event("green ready", url=green.url)
        shift_start = time.monotonic()
        for step in self.steps:
            blue.weight, green.weight = 100 - step.percent, step.percent
            self.event("traffic shifted", green_percent=step.percent, step=step.label, hold_sec=step.hold_sec)
            fired = await self._watch(step.hold_sec, shift_start)
            if fired is not None:
                self.fired = fired
                blue.weight, green.weight = 100, 0
                self.event("alarm fired", **fired)
                await self._retire(green)
                self.event("rolled back", green_percent=0, blue=blue.model)
                await asyncio.to_thread(_remove, self.green_root)
                self.state = "rolled_back"
                return
        # Success: the green fleet takes over the variant's (or component's) name; the blue fleet goes. The plan
        # of that name now starts the new version (a component scaled to zero and back comes up on it).
        self.router.variants.remove(blue)
        await self.router.stop_backend(blue)
        green.name = blue.name
        self.router.plans = [
            replace(p, model=name, version=version, package_dir=package) if p.name == blue.name else p
            for p in self.router.plans
        ]
        self.event("blue stopped", blue=blue.model)
        retired = blue.plan.package_dir if blue.plan is not None else None
        if retired is not None and retired.is_relative_to(self.cache_dir / GREEN_ROOTS):  # an earlier green's
            await asyncio.to_thread(_remove, retired.parents[2])  # <root>/opt/ml/model
        change = await asyncio.to_thread(registry.promote, name, version)
        self.event("live", alias="live", previous=change.previous, current=change.current)
        self.state = "succeeded"

    def strategy_faults(self) -> dict[str, float] | None:
        return {"error_rate": self.faults.error_rate, "latency_ms": self.faults.latency_ms} if self.faults else None

    async def _watch(self, hold_sec: float, since: float) -> dict[str, Any] | None:
        """Hold for `hold_sec`, evaluating every alarm on green's observations after each tick."""
        assert self.green is not None
        deadline = time.monotonic() + hold_sec
        tick = min(0.25, min(a.period_sec for a in self.alarms) / 4)
        while True:
            now = time.monotonic()
            for alarm in self.alarms:
                points = datapoints(alarm, list(self.green.observations), since, now)
                if alarm.evaluate(points):
                    recent = points[-alarm.evaluation_periods :]
                    return {
                        "alarm": f"{self.alarm_prefix}-{alarm.name}",
                        "description": alarm.describe(f"{self.alarm_prefix}/green"),
                        "datapoints": [round(p, 2) if p is not None else None for p in recent],
                        "threshold": alarm.threshold,
                        "unit": alarm.unit,
                    }
            if now >= deadline:
                return None
            await asyncio.sleep(min(tick, max(0.0, deadline - now)) or tick)

    async def _retire(self, backend: Backend) -> None:
        if backend in self.router.variants:
            self.router.variants.remove(backend)
        await self.router.stop_backend(backend)
