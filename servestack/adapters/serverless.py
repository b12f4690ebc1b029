"""The Lambda entry: Mangum over the shared ASGI app. Models load during init (import), not per request.

Mangum answers API Gateway HTTP API (v2), REST API (v1), Function URL and ALB events alike. Init imports
only what the first prediction needs (no FastAPI: it loads on the first docs or listing request), and
logs go through the standard library: with the function's log format set to JSON, Lambda adds the
request id and level itself, at no import cost.
"""

from __future__ import annotations

from mangum import Mangum

from servestack.adapters.app import create_app
from servestack.inference.service import ModelRepository
from servestack.inference.settings import ServingSettings

repository = ModelRepository(ServingSettings.from_environment())
repository.load_all()
app = create_app(repository)
handler = Mangum(app, lifespan="off")
