"""Which action on which resource a call to a REST service needs, read from botocore's models of their routes:
SageMaker (control plane and Runtime), Lambda, EventBridge Scheduler, and API Gateway's execute-api."""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass
from functools import cache

from servestack.local.iam.calls import Check, Operation, Where, json_body, target_operation, unrecognised
from servestack.local.iam.wire import HttpRequest

# ------------------------------------------------------------------------------ REST services from botocore's models


@dataclass(frozen=True)
class RestRoute:
    operation: str
    method: str
    pattern: re.Pattern[str]
    required_query: tuple[str, ...]
    specificity: tuple[int, int]


@cache
def rest_routes(service_name: str) -> tuple[RestRoute, ...]:
    """Each operation's `http.method` and `http.requestUri` from botocore's service model, as a matcher."""
    import botocore.session

    model = botocore.session.get_session().get_service_model(service_name)
    routes = []
    for name in model.operation_names:
        http = model.operation_model(name).http
        path, _, query = http["requestUri"].partition("?")
        regex = ""
        literal = 0
        for piece in re.split(r"(\{[^}]+\})", path):
            if piece.startswith("{") and piece.endswith("}"):
                greedy = piece.endswith("+}")
                label = piece[1:-2] if greedy else piece[1:-1]
                regex += f"(?P<{label}>{'.+' if greedy else '[^/]+'})"
            else:
                regex += re.escape(piece)
                literal += len(piece)
        required = tuple(part.split("=", 1)[0] for part in query.split("&") if part)
        routes.append(RestRoute(name, http["method"], re.compile(regex + "/?"), required, (len(required), literal)))
    return tuple(sorted(routes, key=lambda route: route.specificity, reverse=True))


def match_rest(service_name: str, request: HttpRequest) -> tuple[str, dict[str, str]] | None:
    """(operation, decoded path parameters) of a REST request, None when no operation matches."""
    method = request.method.upper()
    for route in rest_routes(service_name):
        if route.method != method or any(key not in request.query for key in route.required_query):
            continue
        matched = route.pattern.fullmatch(request.raw_path)
        if matched:
            return route.operation, {key: urllib.parse.unquote(value) for key, value in matched.groupdict().items()}
    return None


SAGEMAKER_RUNTIME_ACTIONS = {
    "InvokeEndpoint": "sagemaker:InvokeEndpoint",
    "InvokeEndpointAsync": "sagemaker:InvokeEndpointAsync",
    "InvokeEndpointWithResponseStream": "sagemaker:InvokeEndpointWithResponseStream",
}


# The control-plane calls local up answers for inference components
# (servestack/local/sagemaker/inference_components.py):
# `sagemaker:<Operation>` on the component's ARN (Service Authorization Reference: resource type
# inference-component).
SAGEMAKER_COMPONENT_OPERATIONS = frozenset({"DescribeInferenceComponent", "UpdateInferenceComponentRuntimeConfig"})
# The transform-job calls local up answers (servestack/local/sagemaker/transform_jobs.py), on the job's ARN.
SAGEMAKER_TRANSFORM_JOB_OPERATIONS = frozenset({"CreateTransformJob", "DescribeTransformJob"})


def sagemaker_endpoint_arn(name: str, where: Where) -> str:
    return f"arn:aws:sagemaker:{where.region}:{where.account}:endpoint/{name.lower()}"


def describe_sagemaker(request: HttpRequest, where: Where) -> Operation:
    matched = match_rest("sagemaker-runtime", request) if request.path.startswith("/endpoints/") else None
    if matched is not None:
        operation, params = matched
        arn = sagemaker_endpoint_arn(params["EndpointName"], where)
        return Operation("sagemaker", operation, (Check(SAGEMAKER_RUNTIME_ACTIONS[operation], arn),))
    control_plane = target_operation(request, "SageMaker")
    if control_plane in SAGEMAKER_COMPONENT_OPERATIONS:
        name = json_body(request).get("InferenceComponentName")
        if isinstance(name, str) and name:
            arn = f"arn:aws:sagemaker:{where.region}:{where.account}:inference-component/{name.lower()}"
            return Operation("sagemaker", control_plane, (Check(f"sagemaker:{control_plane}", arn),))
    if control_plane in SAGEMAKER_TRANSFORM_JOB_OPERATIONS:
        name = json_body(request).get("TransformJobName")
        if isinstance(name, str) and name:
            arn = f"arn:aws:sagemaker:{where.region}:{where.account}:transform-job/{name.lower()}"
            return Operation("sagemaker", control_plane, (Check(f"sagemaker:{control_plane}", arn),))
    return unrecognised(
        "sagemaker",
        control_plane,
        "only SageMaker Runtime's invocations, inference component and transform job calls are recognised",
    )


LAMBDA_ACTIONS = {
    "Invoke": "lambda:InvokeFunction",
    "InvokeWithResponseStream": "lambda:InvokeFunction",
    "InvokeAsync": "lambda:InvokeAsync",
}
LAMBDA_NO_RESOURCE = frozenset(
    {"ListFunctions", "GetAccountSettings", "ListLayers", "ListCodeSigningConfigs", "ListEventSourceMappings"}
)
FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,140}$")


def lambda_function_arn(raw: str, qualifier: str | None, where: Where) -> str | None:
    """A function name as Lambda accepts it (`name`, `name:qualifier`, `account:function:name[:qualifier]`,
    or a full ARN) -> the function ARN, qualified when a qualifier is given; None when malformed."""
    region, account = where.region, where.account
    parts = raw.split(":")
    if parts[0] == "arn":
        if len(parts) not in (7, 8) or parts[2] != "lambda" or parts[5] != "function":
            return None
        region, account, parts = parts[3], parts[4], parts[6:]
    elif len(parts) in (3, 4) and parts[1] == "function":
        account, parts = parts[0], parts[2:]
    if not 1 <= len(parts) <= 2 or not FUNCTION_NAME.match(parts[0]):
        return None
    name_qualifier = parts[1] if len(parts) == 2 else None
    final = name_qualifier or qualifier
    return f"arn:aws:lambda:{region}:{account}:function:{parts[0]}" + (f":{final}" if final else "")


def describe_lambda(request: HttpRequest, where: Where) -> Operation:
    matched = match_rest("lambda", request)
    if matched is None:
        return unrecognised("lambda", None, f"{request.method} {request.path} is no Lambda API operation")
    operation, params = matched
    action = LAMBDA_ACTIONS.get(operation, f"lambda:{operation}")
    if operation in LAMBDA_NO_RESOURCE:
        return Operation("lambda", operation, (Check(action, "*"),))
    raw = params.get("FunctionName")
    if raw is None:
        return unrecognised("lambda", operation, "resource not derived for this Lambda operation")
    arn = lambda_function_arn(raw, request.query.get("Qualifier") or None, where)
    if arn is None:
        return unrecognised("lambda", operation, f"{raw!r} is not a function name, name:qualifier or function ARN")
    return Operation("lambda", operation, (Check(action, arn),))


def describe_scheduler(request: HttpRequest, where: Where) -> Operation:
    """EventBridge Scheduler (rest-json): an operation naming a schedule is `scheduler:<Op>` on
    `arn:aws:scheduler:{region}:{account}:schedule/{groupName, default "default"}/{Name}` (Service Authorization
    Reference, resource type schedule); one naming a group, on `...:schedule-group/{Name}`; lists on `*`."""
    matched = match_rest("scheduler", request)
    if matched is None:
        return unrecognised("scheduler", None, f"{request.method} {request.path} is no Scheduler API operation")
    operation, params = matched
    action = f"scheduler:{operation}"
    name = params.get("Name")
    if name is None:
        return Operation("scheduler", operation, (Check(action, "*"),))
    prefix = f"arn:aws:scheduler:{where.region}:{where.account}"
    if "ScheduleGroup" in operation:
        return Operation("scheduler", operation, (Check(action, f"{prefix}:schedule-group/{name}"),))
    group = request.query.get("groupName") or "default"
    return Operation("scheduler", operation, (Check(action, f"{prefix}:schedule/{group}/{name}"),))


@dataclass(frozen=True)
class ExecuteApi:
    """The HTTP API a request to servestack's API front is for."""

    api_id: str
    stage: str = "$default"


def describe_execute_api(request: HttpRequest, where: Where, api: ExecuteApi) -> Operation:
    """`execute-api:Invoke` on `arn:aws:execute-api:{region}:{account}:{apiId}/{stage}/{METHOD}/{path}`
    (API Gateway Developer Guide, "Control access to an HTTP API with IAM authorization"). A named stage is
    the first path segment; `$default` has none."""
    path = request.path
    if api.stage != "$default":
        prefix = f"/{api.stage}"
        path = path[len(prefix) :] if path == prefix or path.startswith(prefix + "/") else path
    route = f"{api.api_id}/{api.stage}/{request.method.upper()}/{path.lstrip('/')}"
    arn = f"arn:aws:execute-api:{where.region}:{where.account}:{route}"
    return Operation("execute-api", "Invoke", (Check("execute-api:Invoke", arn),))
