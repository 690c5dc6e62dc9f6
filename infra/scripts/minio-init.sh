#!/bin/sh
# One-shot, idempotent: the bucket layerlab writes to (MLflow artifacts, Tune storage) and an S3 user
# that may use that bucket and nothing else, so no client holds MinIO's root credentials.
# Runs in the MinIO client image (mc); reads the passwords from secret files.
set -eu

for name in MINIO_URL MINIO_ROOT_USER MINIO_ROOT_PASSWORD_FILE S3_BUCKET S3_ACCESS_KEY_ID S3_SECRET_ACCESS_KEY_FILE; do
    eval "value=\${${name}:-}"
    if [ -z "$value" ]; then
        echo "minio-init.sh: set $name" >&2
        exit 64
    fi
done
root_password=$(cat "$MINIO_ROOT_PASSWORD_FILE")
s3_secret=$(cat "$S3_SECRET_ACCESS_KEY_FILE")

# mc takes an alias from MC_HOST_<alias>, which keeps the root password off the command line.
# (infra/scripts/make-secrets.sh writes hex secrets, which need no URL escaping.)
export MC_HOST_minio="${MINIO_URL%%://*}://${MINIO_ROOT_USER}:${root_password}@${MINIO_URL#*://}"

mc mb --ignore-existing "minio/$S3_BUCKET"

policy=/tmp/layerlab-bucket-policy.json
cat > "$policy" <<JSON
{
  "Version": "2012-10-17",
  "Statement": [
    {"Effect": "Allow", "Action": ["s3:*"],
     "Resource": ["arn:aws:s3:::$S3_BUCKET", "arn:aws:s3:::$S3_BUCKET/*"]}
  ]
}
JSON
mc admin policy create minio layerlab-bucket "$policy"
mc admin user add minio "$S3_ACCESS_KEY_ID" "$s3_secret"
# attach refuses a policy that is already attached (a rerun); any other failure is real.
if ! mc admin policy attach minio layerlab-bucket --user "$S3_ACCESS_KEY_ID" 2>/tmp/attach.err; then
    if ! mc admin user info minio "$S3_ACCESS_KEY_ID" | grep -q layerlab-bucket; then
        cat /tmp/attach.err >&2
        exit 1
    fi
fi
echo "minio-init.sh: bucket $S3_BUCKET and user $S3_ACCESS_KEY_ID are ready"
