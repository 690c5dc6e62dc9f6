#!/bin/sh
# The MLflow tracking server of the production stack: PostgreSQL backend store, artifacts proxied to S3
# (clients upload through the server), basic auth with the admin password from a secret file.
# `layerlab mlflow-server` refuses a missing or default password; this script checks the stores are set.
set -eu

for name in LAYERLAB_MLFLOW_BACKEND_STORE_URI LAYERLAB_MLFLOW_AUTH_DB_URI LAYERLAB_MLFLOW_ARTIFACTS_DESTINATION; do
    eval "value=\${${name}:-}"
    if [ -z "$value" ]; then
        echo "mlflow-server.sh: set $name (infra/docker-compose.yml shows the values for the compose stack)" >&2
        exit 64
    fi
done
exec layerlab mlflow-server --host 0.0.0.0 --port 5000 "$@"
