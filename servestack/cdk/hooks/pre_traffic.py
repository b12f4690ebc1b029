"""CodeDeploy BeforeAllowTraffic hook: read the new version's packaged sample (`{"servestack": "sample"}`), invoke
it with the sample request as an HTTP API event, and fail the deployment unless it answers 200 with the
expected predictions. The sample stays in the package, so it may be as large as an invocation carries.

Env: TARGET_FUNCTION (the new version's ARN), REL_TOL. Inline code: standard library and boto3, under 4 KB.
"""

import json
import math
import os

import boto3

_lambda = boto3.client("lambda")
_codedeploy = boto3.client("codedeploy")


def _close(got, want, tol):
    if isinstance(want, float) or isinstance(got, float):
        return isinstance(got, int | float) and math.isclose(got, want, rel_tol=tol, abs_tol=tol)
    if isinstance(want, list):
        same_len = isinstance(got, list) and len(got) == len(want)
        return same_len and all(_close(g, w, tol) for g, w in zip(got, want, strict=True))
    if isinstance(want, dict):
        return isinstance(got, dict) and all(k in got and _close(got[k], v, tol) for k, v in want.items())
    return got == want


def _event(body):
    http = {
        "method": "POST",
        "path": "/invocations",
        "protocol": "HTTP/1.1",
        "sourceIp": "127.0.0.1",
        "userAgent": "servestack-pre-traffic",
    }
    return {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": "/invocations",
        "rawQueryString": "",
        "headers": {"content-type": "application/json", "host": "pre-traffic.local"},
        "requestContext": {
            "accountId": "-",
            "apiId": "pre-traffic",
            "domainName": "pre-traffic.local",
            "domainPrefix": "pre-traffic",
            "http": http,
            "requestId": "pre-traffic",
            "routeKey": "$default",
            "stage": "$default",
            "time": "",
            "timeEpoch": 0,
        },
        "body": body,
        "isBase64Encoded": False,
    }


def _invoke(payload):
    out = _lambda.invoke(FunctionName=os.environ["TARGET_FUNCTION"], Payload=json.dumps(payload).encode())
    reply = json.loads(out["Payload"].read() or b"null")
    return reply, out.get("FunctionError") or not isinstance(reply, dict)


def check():
    """Return None when the new version answers correctly, else why not."""
    sample, failed = _invoke({"servestack": "sample"})
    if failed:
        return f"no packaged sample: {sample!r}"[:500]
    reply, failed = _invoke(_event(sample["request"]))
    if failed:
        return f"function error: {reply!r}"[:500]
    if reply.get("statusCode") != 200:
        return f"status {reply.get('statusCode')}: {reply.get('body')!r}"[:500]
    got = json.loads(reply.get("body") or "null")
    want = sample["response"]
    if not _close(got, want, float(os.environ.get("REL_TOL", "1e-4"))):
        return f"wrong answer: got {got!r}, expected {want!r}"[:500]
    return None


def handler(event, context):
    try:
        problem = check()
    except Exception as exc:  # any failure must fail the deployment, not hang it
        problem = f"{type(exc).__name__}: {exc}"
    print(json.dumps({"deployment": event.get("DeploymentId"), "problem": problem}))
    _codedeploy.put_lifecycle_event_hook_execution_status(
        deploymentId=event["DeploymentId"],
        lifecycleEventHookExecutionId=event["LifecycleEventHookExecutionId"],
        status="Failed" if problem else "Succeeded",
    )
    return {"ok": problem is None, "problem": problem}
