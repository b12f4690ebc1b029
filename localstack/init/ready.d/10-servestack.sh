#!/usr/bin/env bash
# Runs inside the LocalStack container once it is ready: the bucket `servestack local up` and the tests expect
# for the example batch deployment (name rule: servestack/local/resources.py). Queues and tables are created
# by `servestack local up --endpoint-url http://localhost:4566` or by `cdklocal deploy`.
set -euo pipefail
awslocal s3 mb s3://servestack-cancer-nightly || true
awslocal s3api put-bucket-versioning --bucket servestack-cancer-nightly --versioning-configuration Status=Enabled
