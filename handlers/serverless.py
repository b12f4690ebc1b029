"""The Lambda function's entry (`handlers.serverless.handler`): servestack's HTTP app under Mangum."""

from servestack.adapters.serverless import handler

__all__ = ["handler"]
