"""CodeDeploy for Lambda, as `local up` plays it: a serverless deployment's blue/green release of its alias.

Other packages of local mode import from here only (tests/unit/test_import_boundaries.py).
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servestack.local.codedeploy.definitions import CODEDEPLOY_TYPES, LambdaDeploymentDef, read_lambda_deployments
    from servestack.local.codedeploy.deployments import LocalCodeDeploy
    from servestack.local.codedeploy.serverless_release import deploy_serverless
else:
    from servestack.local import lazy_interface

    __getattr__, __dir__ = lazy_interface(__name__, __file__)

__all__ = ["CODEDEPLOY_TYPES", "LambdaDeploymentDef", "LocalCodeDeploy", "deploy_serverless", "read_lambda_deployments"]
