"""The API Gateway HTTP APIs of a template, read the way `local up` serves them: each API's routes, their
authorization, and the Lambda proxy integration each one invokes."""

from __future__ import annotations

from collections.abc import Callable

from servestack.local.apigateway.definitions import HttpApiDef, RouteDef
from servestack.local.cloudformation import (
    Resolver,
    Resource,
    StackTemplate,
    TemplateError,
    logical_id_of,
)
from servestack.local.lambda_ import FunctionDef


def read_http_apis(
    template: StackTemplate,
    resolver: Resolver,
    resources: list[Resource],
    function_by_arn: Callable[[str], FunctionDef | None],
) -> dict[str, HttpApiDef]:
    """The stack's HTTP APIs, each route with the function of the stack its integration invokes."""
    apis: dict[str, HttpApiDef] = {}
    integrations = {r.logical_id: r for r in resources if r.type == "AWS::ApiGatewayV2::Integration"}
    for api in (r for r in resources if r.type == "AWS::ApiGatewayV2::Api"):
        protocol = api.properties.get("ProtocolType", "HTTP")
        if protocol != "HTTP":
            raise TemplateError(f"{template.name}: API {api.logical_id} is {protocol}; local mode runs HTTP APIs")
        routes: list[RouteDef] = []
        for route in (r for r in resources if r.type == "AWS::ApiGatewayV2::Route"):
            if logical_id_of(route.properties["ApiId"]) != api.logical_id:
                continue
            target = str(resolver.resolve(route.properties.get("Target", "")))
            integration = integrations.get(target.removeprefix("integrations/"))
            if integration is None:
                integration = next(
                    (
                        i
                        for i in integrations.values()
                        if resolver.ref(i.logical_id) == target.removeprefix("integrations/")
                    ),
                    None,
                )
            if integration is None:
                raise TemplateError(f"{template.name}: route {route.logical_id} has no integration in the stack")
            uri = str(resolver.resolve(integration.properties["IntegrationUri"]))
            function = function_by_arn(uri)
            if function is None:
                raise TemplateError(
                    f"{template.name}: integration {integration.logical_id} targets {uri}, not a function of the stack"
                )
            parts = uri.split(":")
            qualifier = parts[7] if len(parts) > 7 else None
            routes.append(
                RouteDef(
                    str(resolver.resolve(route.properties["RouteKey"])),
                    str(resolver.resolve(route.properties.get("AuthorizationType", "NONE"))),
                    function.name,
                    qualifier,
                    int(resolver.resolve(integration.properties.get("TimeoutInMillis", 30_000))),
                    str(resolver.resolve(integration.properties.get("PayloadFormatVersion", "2.0"))),
                )
            )
        api_id = resolver.physical_name(api.logical_id)
        apis[api.logical_id] = HttpApiDef(api.logical_id, api_id, resolver.arn("execute-api", api_id), tuple(routes))
    return apis


# How local mode plays each of API Gateway's resource types (`local up --explain`).
API_GATEWAY_TYPES: dict[str, str] = {
    "AWS::ApiGatewayV2::Api": "local HTTP API front",
    "AWS::ApiGatewayV2::Route": "route with its authorizer (AWS_IAM: SigV4 + execute-api:Invoke)",
    "AWS::ApiGatewayV2::Integration": "Lambda proxy integration (payload 2.0, timeout)",
    "AWS::ApiGatewayV2::Stage": "the $default stage",
}
