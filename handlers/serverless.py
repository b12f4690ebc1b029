"""The Lambda entry: Mangum over the shared app. Models load during init (import), not per request.

Mangum answers API Gateway HTTP API (v2), REST API (v1), Function URL and ALB events alike.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger
from mangum import Mangum

from handlers.app import create_app
from models.service import ModelRepository
from models.settings import ServingSettings

logger = Logger(service="servestack")

repository = ModelRepository(ServingSettings())
repository.load_all()
app = create_app(repository)
asgi_handler = Mangum(app, lifespan="off")


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    response: dict[str, Any] = asgi_handler(event, context)
    return response
