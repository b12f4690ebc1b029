"""The async deployment's functions: submit (HTTP), worker (SQS) and SageMaker's notification recorder."""

from servestack.adapters.asynchronous import notification_handler, submit_handler, worker_handler

__all__ = ["notification_handler", "submit_handler", "worker_handler"]
