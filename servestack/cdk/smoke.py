"""Post-deploy smoke test run by the pipeline: invoke each deployment once with its model's sample request.

Reads SMOKE_<i>_DEPLOYMENT (name in serving.yaml), SMOKE_<i>_KIND and SMOKE_<i>_TARGET (stack outputs):
- sagemaker:    InvokeEndpoint with sample-request.json, predictions must equal sample-response.json;
- sagemaker-component: the same on `<endpoint>/<inference component>`, with InferenceComponentName;
- lambda-http:  invoke the `live` alias with an HTTP API (v2) POST /invocations event, same check;
- lambda-async: invoke the submit function with POST /jobs, expect 2xx;
- batch:        the schedule (`<group>/<name>`) exists and is ENABLED.
Exits non-zero on the first failure, naming the deployment and what was wrong.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import boto3

from servestack.project import find_project
from servestack.spec import load_spec


def http_event(method: str, path: str, body: str) -> dict[str, Any]:
    http = {"method": method, "path": path, "protocol": "HTTP/1.1", "sourceIp": "127.0.0.1", "userAgent": "smoke"}
    return {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": path,
        "rawQueryString": "",
        "headers": {"content-type": "application/json", "host": "smoke.local"},
        "requestContext": {
            "accountId": "-",
            "apiId": "smoke",
            "domainName": "smoke.local",
            "domainPrefix": "smoke",
            "http": http,
            "requestId": "smoke",
            "routeKey": "$default",
            "stage": "$default",
            "time": "",
            "timeEpoch": 0,
        },
        "body": body,
        "isBase64Encoded": False,
    }


def check(deployment: str, kind: str, target: str) -> str | None:
    root = find_project() or Path.cwd()  # the pipeline runs it in the project's checkout
    spec = load_spec(root / "serving.yaml")
    model = spec.models_of(deployment)[0]
    sample = (root / model.artifact_path / "sample-request.json").read_text(encoding="utf-8")
    expected = json.loads((root / model.artifact_path / "sample-response.json").read_text(encoding="utf-8"))
    if kind in {"sagemaker", "sagemaker-component"}:
        endpoint, _, component = target.partition("/")
        named = {"InferenceComponentName": component} if kind == "sagemaker-component" else {}
        out = boto3.client("sagemaker-runtime").invoke_endpoint(
            EndpointName=endpoint, ContentType="application/json", Accept="application/json", Body=sample, **named
        )
        got = json.loads(out["Body"].read())
    elif kind in {"lambda-http", "lambda-async"}:
        path = "/invocations" if kind == "lambda-http" else "/jobs"
        out = boto3.client("lambda").invoke(
            FunctionName=target, Payload=json.dumps(http_event("POST", path, sample)).encode()
        )
        reply = json.loads(out["Payload"].read() or b"null")
        status = reply.get("statusCode") if isinstance(reply, dict) else None
        if out.get("FunctionError") or not isinstance(status, int) or status >= 300:
            return f"{kind} {target}: {str(reply)[:300]}"
        if kind == "lambda-async":
            return None
        got = json.loads(reply["body"])
    elif kind == "batch":
        group, _, schedule = target.rpartition("/")  # `<group>/<schedule>`; a bare name is in the default group
        state = boto3.client("scheduler").get_schedule(Name=schedule, GroupName=group or "default")["State"]
        return None if state == "ENABLED" else f"schedule {target} is {state}"
    else:
        return f"unknown smoke kind {kind!r}"
    if got.get("predictions") != expected["predictions"]:
        return f"{kind} {target}: predictions {got.get('predictions')} != expected {expected['predictions']}"
    return None


def main() -> int:
    failures = 0
    i = 0
    while f"SMOKE_{i}_DEPLOYMENT" in os.environ:
        deployment = os.environ[f"SMOKE_{i}_DEPLOYMENT"]
        problem = check(deployment, os.environ[f"SMOKE_{i}_KIND"], os.environ[f"SMOKE_{i}_TARGET"])
        print(f"{deployment}: {'ok' if problem is None else 'FAILED ' + problem}")
        failures += problem is not None
        i += 1
    if i == 0:
        print("no SMOKE_<i>_DEPLOYMENT variables: nothing to check", file=sys.stderr)
        return 2
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
