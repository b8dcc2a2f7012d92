# CPU image by default; for GPU workers build with a CUDA base, e.g.
#   docker build --build-arg BASE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 \
#                --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 -t liar:gpu .
ARG BASE=python:3.11-slim
FROM ${BASE}
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 LIAR_DATA_DIR=/data GRADIO_ANALYTICS_ENABLED=False
RUN if ! command -v python3 >/dev/null; then \
      apt-get update && apt-get install -y --no-install-recommends python3 python3-pip python3-venv && \
      rm -rf /var/lib/apt/lists/*; fi
WORKDIR /opt/liar
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN pip install --index-url ${TORCH_INDEX} "torch==2.13.0"
COPY pyproject.toml README.md ./
COPY core core
COPY jobs jobs
COPY app app
# the "monitor" extra: Flower, which the compose file runs from this same image; "s3": a store in S3 or MinIO
RUN pip install ".[monitor,s3]"
# --build-arg LLAMA_CPP=1: llama.cpp's quantizer for the q8_0 / q4_k_m GGUF forms (a worker without it
# refuses those forms before pruning); llama-cpp-python built from source, compilers removed afterwards
ARG LLAMA_CPP=0
RUN if [ "$LLAMA_CPP" = 1 ]; then \
      apt-get update && apt-get install -y --no-install-recommends build-essential cmake && \
      CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF" \
        pip install "llama-cpp-python==0.3.36" && \
      apt-get purge -y build-essential cmake && apt-get autoremove -y && rm -rf /var/lib/apt/lists/*; fi
# not root: a job runs code from the models and lm-eval tasks it is given. A fixed uid that the CUDA
# base's own user (ubuntu, 1000) does not clash with; /data is created here so a fresh named volume
# starts owned by it
RUN useradd --system --uid 10001 --create-home --home-dir /home/liar liar && mkdir -p /data && chown liar:liar /data
USER liar
VOLUME /data
# default: a worker; the compose file also runs the app, the migration and Flower with other commands
CMD ["liar", "worker"]
