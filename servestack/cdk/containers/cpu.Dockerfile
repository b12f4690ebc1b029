# servestack realtime container, CPU: the same `serve` entry and SageMaker contract as gpu.Dockerfile.
# Build from the repository root: docker build -f servestack/cdk/containers/cpu.Dockerfile .
FROM python:3.12-slim

# SageMaker reads these labels: the container serves the multi-model API (servestack/adapters/multi_model.py), which custom
# containers may do on CPU instances only, and it listens on SAGEMAKER_BIND_TO_PORT when that is set.
LABEL com.amazonaws.sagemaker.capabilities.multi-models=true
LABEL com.amazonaws.sagemaker.capabilities.accept-bind-to-port=true

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH \
    SERVESTACK_PROVIDERS=CPUExecutionProvider

RUN python -m venv $VIRTUAL_ENV && pip install --no-cache-dir uv==0.13.8

WORKDIR /opt/program
COPY pyproject.toml uv.lock README.md ./
COPY servestack/cdk/containers/locked-requirements.sh ./containers/
# --compile-bytecode: uv does not byte-compile by default, and PYTHONDONTWRITEBYTECODE=1 stops Python writing
# .pyc at run time, so without it every start (`serve`, the Fargate batch task) compiled numpy, botocore,
# onnxruntime and pyarrow from source again: ~0.6 CPU s of the batch job's ~1.2 s start-up (bench/batch_job.py).
RUN containers/locked-requirements.sh cpu > /tmp/requirements.txt \
 && uv pip install --no-cache --compile-bytecode -r /tmp/requirements.txt

COPY models ./models
COPY handlers ./handlers
COPY servestack ./servestack
RUN uv pip install --no-cache --compile-bytecode --no-deps . && python -m compileall -q /opt/program

# SageMaker mounts model data at /opt/ml/model; the bundled models serve when nothing is mounted.
EXPOSE 8080
USER 1000
ENTRYPOINT ["serve"]
CMD ["serve"]
