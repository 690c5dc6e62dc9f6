#!/bin/sh
# Write the secret files the stack mounts (default folder: infra/secrets/), one random value each;
# existing files are kept. Usage: infra/scripts/make-secrets.sh [FOLDER]
set -eu

dir=${1:-$(dirname "$0")/../secrets}
mkdir -p "$dir"
# The containers read the files as their own (non-root) users, so the files are 0644; the folder
# (0700) keeps other users of this host out.
chmod 0700 "$dir"
for name in postgres_password minio_root_password s3_secret_key mlflow_admin_password mlflow_secret_key \
    ray_auth_token; do
    file="$dir/$name"
    if [ -e "$file" ]; then
        echo "kept  $file"
        continue
    fi
    # 32 random bytes as hex: long enough for every consumer, and safe inside URLs (minio-init.sh).
    head -c 32 /dev/urandom | od -An -v -tx1 | tr -d ' \n' > "$file"
    chmod 0644 "$file"
    echo "wrote $file"
done
