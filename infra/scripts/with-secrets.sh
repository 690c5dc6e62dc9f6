#!/bin/sh
# Secrets arrive as files (Compose secrets, Kubernetes secret volumes) but libpq, boto3 and the MLflow
# client read environment variables. For each NAME below, NAME_FILE=/run/secrets/x exports NAME with
# that file's content; then the command runs in its place:
#   with-secrets.sh layerlab worker
# It is the image's entrypoint. `docker compose exec` skips the entrypoint, so operators prefix it there:
#   docker compose exec api with-secrets.sh layerlab token create --user alice
set -eu

if [ "$#" -eq 0 ]; then
    echo "usage: with-secrets.sh COMMAND [ARG...]" >&2
    exit 64
fi

for name in PGPASSWORD AWS_SECRET_ACCESS_KEY MLFLOW_TRACKING_PASSWORD; do
    eval "file=\${${name}_FILE:-}"
    [ -n "$file" ] || continue
    eval "already=\${${name}+set}"
    if [ -n "$already" ]; then
        echo "with-secrets.sh: both $name and ${name}_FILE are set; unset one of them" >&2
        exit 64
    fi
    if [ ! -r "$file" ]; then
        echo "with-secrets.sh: ${name}_FILE=$file is not a readable file; create the secret (infra/secrets/README.md)" >&2
        exit 66
    fi
    value=$(cat "$file")  # $(...) drops the trailing newline that `echo secret > file` leaves
    if [ -z "$value" ]; then
        echo "with-secrets.sh: ${name}_FILE=$file is empty; write the secret into it" >&2
        exit 66
    fi
    export "$name=$value"
    unset "${name}_FILE"
done

exec "$@"
