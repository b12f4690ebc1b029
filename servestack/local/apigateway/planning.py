"""API Gateway's part of `local up`'s plan: each HTTP API of a stack on the port its URL was resolved with (its
front runs in local up's own process, so it starts no child), and the signed curls the banner shows for it."""

from __future__ import annotations

from typing import Protocol

from servestack.local.apigateway.definitions import HttpApiDef
from servestack.local.iam import Credentials
from servestack.local.planning import PlanContext, ServicePlan, curl_sigv4


class ApiStack(Protocol):
    """What API Gateway reads of a stack's topology."""

    @property
    def mode(self) -> str: ...
    @property
    def apis(self) -> dict[str, HttpApiDef]: ...


class ApiGatewayPlanner:
    """The HTTP APIs of every stack planned so far, each with its port (the fronts local up serves)."""

    name = "apigateway"

    def __init__(self, developer: Credentials) -> None:
        self.developer = developer  # the banner's curls sign with the developer's keys
        self.apis: list[tuple[HttpApiDef, int]] = []

    def plan(self, topology: ApiStack, context: PlanContext) -> ServicePlan:
        part = ServicePlan()
        for api in topology.apis.values():
            port = context.api_ports[api.logical_id]
            self.apis.append((api, port))
            part.entry |= {"url": f"http://127.0.0.1:{port}", "api_id": api.api_id}
        url = part.entry.get("url")
        if topology.mode == "serverless" and url:
            part.commands.append(curl_sigv4(f"{url}/invocations", context.region, self.developer, context.sample))
        elif topology.mode == "async" and url:
            part.commands.append(curl_sigv4(f"{url}/jobs", context.region, self.developer, context.sample))
            part.commands.append(curl_sigv4(f"{url}/jobs/JOB_ID", context.region, self.developer, None))
        return part
