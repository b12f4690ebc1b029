#!/usr/bin/env bash
# `make test-localstack`: LocalStack in host mode (no Docker), the S3/SQS-only integration tests against it,
# then stop it. Recipe and pins: localstack/README.md ("Host mode"). LocalStack ignores SIGTERM while it tries
# to reach its analytics host, so it gets SIGKILL after a short grace period.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=localstack/.venv
PORT="${LOCALSTACK_PORT:-4566}"
PY313="$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")/versions/3.13.0/bin/python3"
if [[ ! -x "$VENV/bin/python" ]]; then
  [[ -x "$PY313" ]] || { echo "LocalStack host mode needs Python >= 3.12; $PY313 not found (pyenv install 3.13)" >&2; exit 2; }
  "$PY313" -m venv "$VENV"
  "$VENV/bin/pip" install -q 'localstack-core[runtime]==2026.3.0' 'cbor2<6' 'pyopenssl==24.3.0' \
    'cryptography==44.0.3' service_identity
fi
LOG=localstack/.localstack.log
GATEWAY_LISTEN="127.0.0.1:$PORT" SERVICES=s3,sqs,sns,events DISABLE_EVENTS=1 \
  "$VENV/bin/python" -m localstack.runtime.main >"$LOG" 2>&1 &
PID=$!
stop() { kill -TERM "$PID" 2>/dev/null || true; sleep 3; kill -KILL "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; }
trap stop EXIT
for _ in $(seq 1 120); do
  curl -sf "http://127.0.0.1:$PORT/_localstack/health" >/dev/null && break
  kill -0 "$PID" 2>/dev/null || { echo "LocalStack exited; see $LOG" >&2; tail -20 "$LOG" >&2; exit 1; }
  sleep 0.5
done
curl -sf "http://127.0.0.1:$PORT/_localstack/health" >/dev/null || { echo "LocalStack not healthy after 60s" >&2; exit 1; }
echo "LocalStack ready on :$PORT. Not run here (need DynamoDB, Lambda or paid services): the async job tests," \
  "the e2e local up test (DynamoDB); CDK deploys (HTTP API v2, SageMaker, CodeDeploy, app autoscaling)."
AWS_ENDPOINT_URL="http://127.0.0.1:$PORT" .venv/bin/python -m pytest -m localstack -p no:cacheprovider tests/integration "$@"
