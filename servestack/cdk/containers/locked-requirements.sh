#!/bin/sh
# Writes the image's requirements from uv.lock (the one place dependency versions come from), for the CPU or the
# GPU image. The GPU image swaps the CPU onnxruntime wheel for onnxruntime-gpu of the very same locked version,
# so both images run one onnxruntime version. Both carry pyarrow (the parquet extra): Parquet batch input and
# output run on Fargate (the CPU image); the Lambda bundle leaves pyarrow out.
#   containers/locked-requirements.sh cpu|gpu > requirements.txt     (run from the repository root)
set -eu
flavour="${1:?usage: locked-requirements.sh cpu|gpu}"
locked="$(uv export --frozen --no-dev --extra server --extra aws --extra parquet --no-emit-project --no-hashes --format requirements-txt)"
case "$flavour" in
  cpu)
    printf '%s\n' "$locked"
    ;;
  gpu)
    version="$(printf '%s\n' "$locked" | sed -n 's/^onnxruntime==\([^ ;]*\).*$/\1/p')"
    if [ -z "$version" ]; then
      echo "locked-requirements.sh: uv.lock pins no onnxruntime" >&2
      exit 1
    fi
    printf '%s\n' "$locked" | grep -v '^onnxruntime=='
    printf 'onnxruntime-gpu==%s\n' "$version"
    ;;
  *)
    echo "locked-requirements.sh: '$flavour' is not one of cpu, gpu" >&2
    exit 2
    ;;
esac
