# servestack realtime container, CPU: the same entry and SageMaker contract as gpu.Dockerfile.
# Its build context is staged at synth (servestack/cdk/images.py): requirements.txt (servestack's locked runtime
# for this image), servestack's runtime, the project's entry points (handlers/) and the deployment's model packages.
# Docker's official python image, mirrored on ECR Public (Docker Hub throttles anonymous pulls per IP, and
# CodeBuild's are shared): servestack/cdk/images.py says why this registry.
FROM public.ecr.aws/docker/library/python:3.12-slim

# SageMaker reads these labels: the container serves the multi-model API (servestack/adapters/multi_model.py),
# which custom containers may do on CPU instances only, and it listens on SAGEMAKER_BIND_TO_PORT when set.
LABEL com.amazonaws.sagemaker.capabilities.multi-models=true
LABEL com.amazonaws.sagemaker.capabilities.accept-bind-to-port=true

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH PYTHONPATH=/opt/program \
    SERVESTACK_PROVIDERS=CPUExecutionProvider

RUN python -m venv $VIRTUAL_ENV && pip install --no-cache-dir uv==0.13.8

WORKDIR /opt/program
# Dependencies first (a layer that changes only with servestack's version).
# --compile-bytecode: uv does not byte-compile by default, and PYTHONDONTWRITEBYTECODE=1 stops Python writing
# .pyc at run time, so without it every start (`serve`, the Fargate batch task) compiled numpy, botocore,
# onnxruntime and pyarrow from source again: ~0.6 CPU s of the batch job's ~1.2 s start-up (bench/batch_job.py).
COPY requirements.txt ./
RUN uv pip install --no-cache --compile-bytecode -r requirements.txt

COPY servestack ./servestack
COPY handlers ./handlers
COPY models ./models
RUN python -m compileall -q /opt/program

# SageMaker runs `docker run IMAGE serve`, and mounts model data at /opt/ml/model; the packages in
# /opt/program/models serve when nothing is mounted (the Fargate batch task).
EXPOSE 8080
USER 1000
ENTRYPOINT ["python", "-m", "handlers.realtime"]
CMD ["serve"]
