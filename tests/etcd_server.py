"""An etcd server on 127.0.0.1 with its v2 API on, for torchrun's ``etcd-v2`` rendezvous:
Debian's etcd-server (3.4), installed by the test run where it can (tests/debian_install.py)."""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from dist_resume.demo.job import free_port
from tests.debian_install import Need, ensure

ETCD = Need("the etcd rendezvous tests", ("etcd-server",), ("etcd",), "about 8 MB, some 20 s with apt-get update")
START_TIMEOUT = 60  # seconds; it serves within one here


@contextmanager
def etcd_server(directory: Path, report: Callable[[str], None]) -> Iterator[str]:
    """A fresh etcd (data and log in ``directory``) for the block; yields its client
    endpoint ``127.0.0.1:PORT``."""
    ensure(ETCD, report)
    client, peer = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    directory.mkdir(parents=True, exist_ok=True)
    command = ["etcd", "--enable-v2", "--name", "rendezvous", "--data-dir", str(directory / "data"),
               "--listen-client-urls", client, "--advertise-client-urls", client,
               "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
               "--initial-cluster", f"rendezvous={peer}"]
    with open(directory / "etcd.log", "w") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not _serves_v2(client):
            if server.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"etcd did not serve within {START_TIMEOUT} s (exit code {server.poll()}):\n"
                                     + (directory / "etcd.log").read_text()[-3000:])
            time.sleep(0.1)
        yield client.removeprefix("http://")
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _serves_v2(client: str) -> bool:
    try:
        with urllib.request.urlopen(f"{client}/v2/keys/", timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False
