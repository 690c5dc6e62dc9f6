# One image for the API, the workers and Ray nodes. CPU torch by default;
#   docker build --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 -t layerlab:cuda .
# gives the CUDA build (run it with --gpus all).
FROM python:3.11-slim-bookworm

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    RAY_USAGE_STATS_ENABLED=0 MLFLOW_DISABLE_TELEMETRY=true \
    HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 LAYERLAB_HOME=/data

RUN apt-get update \
 && apt-get install -y --no-install-recommends libgl1 libegl1 curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 10001 layerlab \
 && mkdir -p /data && chown layerlab /data

WORKDIR /app
COPY requirements.lock pyproject.toml README.md ./
# torch/torchvision from the chosen index; everything else pinned by the lock (its CUDA wheels dropped).
RUN pip install --index-url "$TORCH_INDEX" torch==2.14.1 torchvision==0.29.1 \
 && grep -v -E '^(torch|torchvision|triton|nvidia-)' requirements.lock > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt
COPY service ./service
COPY workers ./workers
COPY jobs ./jobs
COPY sweeps ./sweeps
RUN pip install --no-deps .

USER layerlab
VOLUME ["/data"]
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
  CMD curl -fsS http://127.0.0.1:8000/healthz || exit 1
CMD ["layerlab", "serve", "--host", "0.0.0.0", "--port", "8000"]
