"""A local S3 endpoint for development: moto's server on 127.0.0.1 with one bucket.

    .venv/bin/python storage/dev_s3_server.py [--port 9000] [--bucket checkpoints]

Prints the environment a job needs (endpoint and fake credentials), then serves until
interrupted. Only ever binds the loopback address.
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import threading

import boto3
from moto.server import ThreadedMotoServer

HOST = "127.0.0.1"
KEY_ID = "dev-key-id"
SECRET = "dev-secret-key"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--bucket", default="checkpoints", help="bucket to create (default: checkpoints)")
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)

    port = args.port or _free_port()
    endpoint = f"http://{HOST}:{port}"
    server = ThreadedMotoServer(ip_address=HOST, port=port, verbose=False)
    server.start()
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=KEY_ID,
                 aws_secret_access_key=SECRET).create_bucket(Bucket=args.bucket)
    print(f"export AWS_ENDPOINT_URL={endpoint}")
    print(f"export AWS_ACCESS_KEY_ID={KEY_ID} AWS_SECRET_ACCESS_KEY={SECRET} AWS_DEFAULT_REGION=us-east-1")
    print(f"# checkpoint URL: s3://{args.bucket}/<run>", flush=True)

    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    server.stop()


if __name__ == "__main__":
    main()
