"""servestack's CDK constructs, for any CDK app (`pip install 'servestack[cdk]'`).

- `add_serving(app)`: a stack per deployment of the project's serving.yaml (`servestack init --existing-cdk-app`
  writes one); `DeploymentStack`: one deployment's stack.
- One construct per mode, for an app that composes its own: `RealtimeEndpoint` (SageMaker, blue/green with
  rollback alarms, autoscaling), `ServerlessEndpoint` (Lambda, alias, CodeDeploy, HTTP API), `AsyncEndpoint`
  (S3 + SQS + DLQ + DynamoDB), `BatchJob` (EventBridge Scheduler to Lambda, Fargate or Batch Transform), and
  `ComponentEndpoint` (SageMaker inference components).
- `PipelineStack`: the delivery pipeline (synth, staging, smoke test, approval, production).

Names load on first use, so that importing one module of the package does not import them all.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from servestack.cdk.app import add_serving, build_app
    from servestack.cdk.asynchronous import AsyncEndpoint
    from servestack.cdk.batch import BatchJob
    from servestack.cdk.components import ComponentEndpoint
    from servestack.cdk.deployment import DeploymentStack
    from servestack.cdk.pipeline import PipelineStack
    from servestack.cdk.realtime import RealtimeEndpoint
    from servestack.cdk.serverless import ServerlessEndpoint

_HOMES = {
    "add_serving": "app",
    "build_app": "app",
    "AsyncEndpoint": "asynchronous",
    "BatchJob": "batch",
    "ComponentEndpoint": "components",
    "DeploymentStack": "deployment",
    "PipelineStack": "pipeline",
    "RealtimeEndpoint": "realtime",
    "ServerlessEndpoint": "serverless",
}
__all__ = [
    "AsyncEndpoint",
    "BatchJob",
    "ComponentEndpoint",
    "DeploymentStack",
    "PipelineStack",
    "RealtimeEndpoint",
    "ServerlessEndpoint",
    "add_serving",
    "build_app",
]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'servestack.cdk' has no attribute {name!r}")
    return getattr(importlib.import_module(f"servestack.cdk.{_HOMES[name]}"), name)
