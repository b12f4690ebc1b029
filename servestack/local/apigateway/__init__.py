"""API Gateway HTTP APIs, as `local up` plays them: routes, authorizers and Lambda proxy integrations.

Other packages of local mode import from here only (tests/unit/test_import_boundaries.py).
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servestack.local.apigateway.definitions import HttpApiDef, RouteDef
    from servestack.local.apigateway.http_api import HttpApiFront
    from servestack.local.apigateway.planning import ApiGatewayPlanner
    from servestack.local.apigateway.reading import API_GATEWAY_TYPES, read_http_apis
else:
    from servestack.local import lazy_interface

    __getattr__, __dir__ = lazy_interface(__name__, __file__)

__all__ = ["API_GATEWAY_TYPES", "ApiGatewayPlanner", "HttpApiDef", "HttpApiFront", "RouteDef", "read_http_apis"]
