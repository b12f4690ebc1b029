# servestack realtime container, GPU: SageMaker runs `docker run <image> serve` and calls :8080/ping and
# /invocations. Its build context is staged at synth (servestack/cdk/images.py), as cpu.Dockerfile's is.
# onnxruntime-gpu 1.2x/1.3x wheels are built against CUDA 12 and cuDNN 9, which this base image carries.
# NVIDIA's CUDA image as NVIDIA publishes it to ECR Public besides Docker Hub: servestack/cdk/images.py says why
# this registry.
FROM public.ecr.aws/nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

LABEL com.amazonaws.sagemaker.capabilities.accept-bind-to-port=true
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH PYTHONPATH=/opt/program \
    SERVESTACK_PROVIDERS=auto

RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv $VIRTUAL_ENV \
 && pip install --no-cache-dir uv==0.13.8

WORKDIR /opt/program
# Dependencies first: servestack's locked runtime with onnxruntime-gpu of the very version the CPU image runs.
# --compile-bytecode: without it every start compiles the dependencies again (see cpu.Dockerfile).
COPY requirements.txt ./
RUN uv pip install --no-cache --compile-bytecode -r requirements.txt

COPY servestack ./servestack
COPY handlers ./handlers
COPY models ./models
RUN python -m compileall -q /opt/program

EXPOSE 8080
USER 1000
ENTRYPOINT ["python", "-m", "handlers.realtime"]
CMD ["serve"]
