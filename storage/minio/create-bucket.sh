#!/bin/sh
# One-shot bucket creation for docker-compose (runs in the minio/mc image).
# Needs MINIO_ROOT_USER, MINIO_ROOT_PASSWORD and CHECKPOINT_BUCKET in the environment.
set -eu
mc alias set local http://minio:9000 "$MINIO_ROOT_USER" "$MINIO_ROOT_PASSWORD" >/dev/null
mc mb --ignore-existing "local/$CHECKPOINT_BUCKET"
echo "bucket $CHECKPOINT_BUCKET ready"
