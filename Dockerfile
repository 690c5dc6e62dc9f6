# One image for every role of the production stack (infra/): the API (`layerlab serve`), queue workers
# (`layerlab-worker.sh`), the MLflow server (`mlflow-server.sh`), migrations (`layerlab migrate`) and
# Ray nodes (`ray start`). CPU torch by default:
#   docker build -t layerlab .
#   docker build --build-arg TORCH_VARIANT=cuda -t layerlab:cuda .    # GPU hosts (run with --gpus all)
# Offline hosts (no registry, no PyTorch index): scripts/build-image.sh (`make image`) makes the base
# image from the Debian mirror and installs torch from the host's local wheels.
# BASE_IMAGE: the python image, or an equivalent (Python 3.11 first on PATH, Debian bookworm, apt).
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

# cpu:  torch/torchvision from TORCH_INDEX (the CPU wheels); the lock's CUDA libraries are left out.
# cuda: requirements.lock exactly as tested: PyPI's torch with the CUDA libraries the lock pins.
ARG TORCH_VARIANT=cpu
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
# pip's local wheel folders and CA bundle (build-image.sh passes the host's and mounts them); unset: defaults.
ARG PIP_FIND_LINKS
ARG PIP_EXTRA_INDEX_URL
ARG PIP_CERT

# NVIDIA_DRIVER_CAPABILITIES: the container toolkit then mounts libnvidia-ml next to the CUDA driver,
# which Ray needs to count a node's GPUs (harmless without a GPU).
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    RAY_USAGE_STATS_ENABLED=0 MLFLOW_DISABLE_TELEMETRY=true \
    HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 LAYERLAB_HOME=/data \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

# tini: PID 1 that forwards signals and reaps the daemons `ray start` leaves behind.
# openssh-client, rsync: the Ray cluster launcher (infra/ray-cluster.yaml) drives nodes through them.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgl1 libegl1 curl tini openssh-client rsync \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 10001 --user-group layerlab \
 && mkdir -p /data && chown layerlab:layerlab /data

WORKDIR /app
# Only the lock before the long dependency layer, so that edits elsewhere reuse it.
COPY requirements.lock ./
RUN case "$TORCH_VARIANT" in \
      cpu) grep -E '^(torch|torchvision)==' requirements.lock > /tmp/torch.txt \
        && pip install --index-url "$TORCH_INDEX" -r /tmp/torch.txt \
        && grep -v -E '^(torch|torchvision|triton|nvidia-|cuda-)' requirements.lock > /tmp/requirements.txt \
        && pip install -r /tmp/requirements.txt ;; \
      cuda) pip install -r requirements.lock ;; \
      *) echo "TORCH_VARIANT=$TORCH_VARIANT: use cpu or cuda" >&2; exit 2 ;; \
    esac
COPY pyproject.toml README.md ./
COPY service ./service
COPY workers ./workers
COPY jobs ./jobs
COPY sweeps ./sweeps
RUN pip install --no-deps .
COPY --chmod=0755 infra/scripts/with-secrets.sh infra/scripts/layerlab-worker.sh infra/scripts/mlflow-server.sh \
     /usr/local/bin/

# Numeric, so that Kubernetes' runAsNonRoot can check it.
USER 10001:10001
# with-secrets.sh turns NAME_FILE secrets into the variables libpq, boto3 and MLflow read, then execs.
ENTRYPOINT ["/usr/bin/tini", "--", "with-secrets.sh"]
EXPOSE 8000
# The default command's check (the API); infra/ gives every other role its own.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
  CMD curl -fsS http://127.0.0.1:8000/healthz || exit 1
CMD ["layerlab", "serve", "--host", "0.0.0.0", "--port", "8000"]
