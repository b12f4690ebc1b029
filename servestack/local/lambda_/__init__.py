"""Lambda, as `local up` plays it: the execution environments, the Invoke API, the functions of the templates
and their SQS event source mappings.

Other packages of local mode import from here only (tests/unit/test_import_boundaries.py).
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servestack.local.lambda_.definitions import EventSourceMappingDef, FunctionDef
    from servestack.local.lambda_.invoke import INVOKE_PREFIX, INVOKE_SUFFIX, lambda_error
    from servestack.local.lambda_.planning import LambdaPlanner
    from servestack.local.lambda_.poller import SqsPoller
    from servestack.local.lambda_.reading import LAMBDA_TYPES, read_functions, read_lambda
    from servestack.local.lambda_.runner import runner_command
    from servestack.local.lambda_.runtime import REGION, http_api_event
    from servestack.local.lambda_.service import HostedFunction, LambdaService
else:
    from servestack.local import lazy_interface

    __getattr__, __dir__ = lazy_interface(__name__, __file__)

__all__ = [
    "INVOKE_PREFIX",
    "INVOKE_SUFFIX",
    "LAMBDA_TYPES",
    "REGION",
    "EventSourceMappingDef",
    "FunctionDef",
    "HostedFunction",
    "LambdaPlanner",
    "LambdaService",
    "SqsPoller",
    "http_api_event",
    "lambda_error",
    "read_functions",
    "read_lambda",
    "runner_command",
]
