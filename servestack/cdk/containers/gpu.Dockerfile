# servestack realtime container, GPU: SageMaker runs `docker run <image> serve` and calls :8080/ping and
# /invocations. Its build context is staged at synth (servestack/cdk/images.py), as cpu.Dockerfile's is.
# PyPI's onnxruntime-gpu (1.31.1, requirements.txt) is a CUDA 13.0 build with cuDNN 9: its CUDA provider needs
# libcudart.so.13, libcublas.so.13, libcublasLt.so.13 and libcurand.so.10, which a CUDA 12 base lacks (onnxruntime
# would then run on the CPU, servestack/inference/providers.py refuses that). This tag: CUDA 13.0, the wheel's own
# (its build_and_package_info.cuda_version), at 13.0's latest update (NVIDIA supports the latest point release of
# each toolkit version only), with cuDNN 9 for CUDA 13 (libcudnn9-cuda-13), the runtime libraries without the
# compiler; 13.0 rather than 13.1+, the CUDA of the host's driver 580 (SageMaker's GPU host AMI,
# servestack/cdk/realtime.py), so that nothing leans on CUDA's minor-version compatibility.
# NVIDIA's CUDA image as NVIDIA publishes it to ECR Public besides Docker Hub: servestack/cdk/images.py says why
# this registry.
FROM public.ecr.aws/nvidia/cuda:13.0.3-cudnn-runtime-ubuntu24.04

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
