# servestack realtime container, GPU: SageMaker runs `docker run <image> serve` and calls :8080/ping and
# /invocations. Build from the repository root: docker build -f servestack/cdk/containers/gpu.Dockerfile .
# onnxruntime-gpu 1.2x/1.3x wheels are built against CUDA 12 and cuDNN 9, which this base image carries.
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

LABEL com.amazonaws.sagemaker.capabilities.accept-bind-to-port=true
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH \
    SERVESTACK_PROVIDERS=auto

RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv $VIRTUAL_ENV \
 && pip install --no-cache-dir uv==0.13.8

WORKDIR /opt/program
# Dependencies first (a layer that changes only with the lock): the lock's onnxruntime version, GPU build.
COPY pyproject.toml uv.lock README.md ./
COPY servestack/cdk/containers/locked-requirements.sh ./containers/
# --compile-bytecode: uv does not byte-compile by default, and PYTHONDONTWRITEBYTECODE=1 stops Python writing
# .pyc at run time, so without it every start (`serve`, the Fargate batch task) compiled numpy, botocore,
# onnxruntime and pyarrow from source again: ~0.6 CPU s of the batch job's ~1.2 s start-up (bench/batch_job.py).
RUN containers/locked-requirements.sh gpu > /tmp/requirements.txt \
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
