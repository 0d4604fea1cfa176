#!/bin/sh
# docker-compose.yml's healthcheck of the minio service (runs in the minio image, which ships
# mc): succeeds once MinIO serves and the checkpoint bucket exists, creating it if missing.
# Needs MINIO_ROOT_USER, MINIO_ROOT_PASSWORD and CHECKPOINT_BUCKET in the environment.
set -eu
mc ready local >/dev/null
mc alias set dist-resume http://localhost:9000 "$MINIO_ROOT_USER" "$MINIO_ROOT_PASSWORD" >/dev/null
mc mb --ignore-existing "dist-resume/$CHECKPOINT_BUCKET" >/dev/null
