"""The Lambda entry: Mangum over the shared ASGI app. Models load during init (import), not per request.

Mangum answers API Gateway HTTP API (v2), REST API (v1), Function URL and ALB events alike. One more event,
`{"servestack": "sample"}`, which only a direct Invoke can send (an HTTP event always has its request context),
answers with the default model's packaged sample request and response: CodeDeploy's pre-traffic hook
(servestack/cdk/hooks/pre_traffic.py) reads the sample from the version it checks, whatever its size, then
sends it as an HTTP API event and compares the answer. Init imports
only what the first prediction needs (no FastAPI: it loads on the first docs or listing request), and
logs go through the standard library: with the function's log format set to JSON, Lambda adds the
request id and level itself, at no import cost.
"""

from __future__ import annotations

import json
from typing import Any

from mangum import Mangum

from servestack.adapters.app import create_app
from servestack.inference.manifest import SAMPLE_REQUEST, SAMPLE_RESPONSE
from servestack.inference.service import ModelRepository
from servestack.inference.settings import ServingSettings

repository = ModelRepository(ServingSettings.from_environment())
repository.load_all()
app = create_app(repository)
http_handler = Mangum(app, lifespan="off")
SAMPLE_EVENT = {"servestack": "sample"}


def handler(event: Any, context: Any) -> Any:
    if event == SAMPLE_EVENT:
        return packaged_sample()
    return http_handler(event, context)


def packaged_sample() -> dict[str, Any]:
    """The default model's sample request (its raw body) and the response the package says it gets."""
    model = repository.get()
    return {
        "model": model.manifest.key,
        "request": (model.package_dir / SAMPLE_REQUEST).read_text(encoding="utf-8"),
        "response": json.loads((model.package_dir / SAMPLE_RESPONSE).read_text(encoding="utf-8")),
    }
