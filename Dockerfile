# Trainer image: CPU-only torch, dist-resume with its S3 extra, the launch scripts.
FROM python:3.11.11-slim-bookworm

# torch first, from the CPU wheel index: the default index would pull a multi-GB CUDA build.
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu

WORKDIR /app
COPY . .
RUN pip install --no-cache-dir '.[s3]'

CMD ["bash", "launch/multinode.sh", "launch/train.py"]
