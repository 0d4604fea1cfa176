"""A real S3 server for tests and development: a one-node Ceph cluster with the RADOS Gateway.

    .venv/bin/python storage/ceph_rgw.py [--bucket checkpoints]

Starts a monitor, one OSD that keeps its objects in memory (memstore, at most 1 GiB) and
radosgw, in a temporary directory, with authentication off inside the cluster and an S3 user
with fresh keys. Prints the environment a job needs, serves until interrupted, then kills the
daemons and removes the directory. Every daemon binds 127.0.0.1 only. Needs the Debian/Ubuntu
packages ceph-mon, ceph-osd and radosgw (see INSTALL_HINT).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

HOST = "127.0.0.1"
BINARIES = ("monmaptool", "ceph-mon", "ceph", "ceph-osd", "radosgw", "radosgw-admin")
PACKAGES = ("ceph-mon", "ceph-osd", "radosgw")  # Debian's, holding BINARIES
INSTALL_HINT = f"apt-get update && apt-get install -y --no-install-recommends {' '.join(PACKAGES)}"
MEMSTORE_BYTES = 1 << 30
START_TIMEOUT = 180.0  # seconds; a cold start takes about 15 s on 2 cores


class CephStartError(RuntimeError):
    """The cluster did not come up; the message ends with the failing daemon's log."""


@dataclass(frozen=True)
class RGWEndpoint:
    """Where the gateway listens and the S3 keys of its one user."""

    url: str
    key_id: str
    secret: str

    def __repr__(self) -> str:  # keep the secret out of tracebacks that show locals
        return f"RGWEndpoint(url={self.url!r}, key_id={self.key_id!r})"


def missing_binaries() -> list[str]:
    """The Ceph programs this module needs that are not on PATH."""
    return [name for name in BINARIES if shutil.which(name) is None]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL it when the process that started it dies, so a
    killed test run leaves no daemon behind."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _config(root: Path, fsid: str, mon_port: int, rgw_port: int) -> str:
    return f"""[global]
fsid = {fsid}
mon host = v2:{HOST}:{mon_port}
mon initial members = a
public addr = {HOST}
cluster addr = {HOST}
public network = {HOST}/32
ms bind ipv6 = false
ms bind msgr1 = false
auth cluster required = none
auth service required = none
auth client required = none
ms mon client mode = crc
keyring = /dev/null
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
mon allow pool size one = true
mon warn on pool no redundancy = false
mon data avail warn = 1
osd crush chooseleaf type = 0
osd objectstore = memstore
memstore device bytes = {MEMSTORE_BYTES}
run dir = {root}/run
admin socket = {root}/run/$name.asok
pid file = {root}/run/$name.pid
log file = {root}/log/$name.log
log to stderr = false
mon data = {root}/mon/$name
osd data = {root}/osd/$name
rgw data = {root}/rgw
rgw frontends = beast endpoint={HOST}:{rgw_port}
"""


class Cluster:
    """The daemons of one cluster under ``root``; ``stop`` kills and reaps them."""

    def __init__(self, root: Path, deadline: float) -> None:
        self.root = root
        self.conf = root / "ceph.conf"
        self.deadline = deadline
        self.daemons: dict[str, subprocess.Popen] = {}

    def _remaining(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise self.failure(f"Ceph did not start within {START_TIMEOUT:.0f} s")
        return left

    def failure(self, what: str) -> CephStartError:
        """The error for `what` went wrong, led by the daemons that exited: a command against
        a cluster whose monitor died only times out, and the exit is the cause to name."""
        exited = [f"{name} exited with {proc.returncode}" for name, proc in self.daemons.items()
                  if proc.poll() is not None]
        return CephStartError(f"{'; '.join(exited)}, so: {what}{self._logs()}" if exited else f"{what}{self._logs()}")

    def _logs(self) -> str:
        tails = []
        for log in sorted((self.root / "log").glob("*")):
            lines = log.read_text(errors="replace").splitlines()[-15:]
            tails.append(f"\n--- {log.name} (last lines)\n" + "\n".join(lines))
        return "".join(tails)

    def tool(self, *args: str) -> str:
        """Run a Ceph command-line tool against this cluster; its stdout."""
        try:
            result = subprocess.run([args[0], "-c", str(self.conf), *args[1:]], capture_output=True,
                                    text=True, timeout=self._remaining(), stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise self.failure(f"{' '.join(args[:3])} did not finish in time") from None
        if result.returncode != 0:
            raise self.failure(f"{' '.join(args[:3])} failed ({result.returncode}): {result.stderr.strip()[-2000:]}")
        return result.stdout

    def start(self, name: str, *args: str) -> None:
        """Start a daemon in the foreground (``-f``) as a child of this process."""
        out = open(self.root / "log" / f"{name}.out", "w")
        with out:
            self.daemons[name] = subprocess.Popen(
                [args[0], "-c", str(self.conf), "-f", *args[1:]], stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)

    def wait_until(self, ready: Callable[[], bool], what: str) -> None:
        """Poll ``ready()`` until it is true; fail at the deadline or when a daemon exits."""
        while not ready():
            if any(proc.poll() is not None for proc in self.daemons.values()):
                raise self.failure(f"waiting for {what}")
            time.sleep(min(0.2, self._remaining()))

    def stop(self) -> None:
        # SIGKILL: the cluster is thrown away, and a clean OSD shutdown would first write
        # every object that memstore holds to disk.
        for proc in self.daemons.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self.daemons.values():
            proc.wait(timeout=60)


def _rgw_answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


@contextmanager
def ceph_rgw(timeout: float = START_TIMEOUT) -> Iterator[RGWEndpoint]:
    """A fresh cluster while the context lasts. Raises ``CephStartError`` (with the daemons'
    logs) when it is not serving S3 within ``timeout`` seconds."""
    missing = missing_binaries()
    if missing:
        raise CephStartError(f"Ceph programs not found: {', '.join(missing)}; install them with: "
                             f"{INSTALL_HINT}")
    with ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dist-resume-ceph-")))
        for sub in ("run", "log", "mon", "osd/osd.0", "rgw"):
            (root / sub).mkdir(parents=True)
        cluster = Cluster(root, time.monotonic() + timeout)
        stack.callback(cluster.stop)
        fsid, osd_uuid = str(uuid.uuid4()), str(uuid.uuid4())
        mon_port, rgw_port = _free_port(), _free_port()
        cluster.conf.write_text(_config(root, fsid, mon_port, rgw_port))

        subprocess.run(["monmaptool", "--create", "--fsid", fsid, "--addv", "a",
                        f"[v2:{HOST}:{mon_port}]", str(root / "monmap")],
                       check=True, capture_output=True, timeout=60)
        cluster.tool("ceph-mon", "--mkfs", "-i", "a", "--monmap", str(root / "monmap"))
        cluster.start("mon.a", "ceph-mon", "-i", "a")
        osd_id = cluster.tool("ceph", "--connect-timeout", "60", "osd", "new", osd_uuid).strip()
        cluster.tool("ceph-osd", "-i", osd_id, "--mkfs", "--osd-uuid", osd_uuid)
        cluster.start("osd.0", "ceph-osd", "-i", osd_id)
        cluster.wait_until(lambda: json.loads(cluster.tool("ceph", "osd", "stat", "-f", "json"))
                           ["num_up_osds"] == 1, "the OSD to be up")

        endpoint = RGWEndpoint(f"http://{HOST}:{rgw_port}", "DR" + secrets.token_hex(9).upper(),
                               secrets.token_hex(20))
        # radosgw-admin creates the gateway's pools, then the user, waiting for the OSD.
        cluster.tool("radosgw-admin", "-n", "client.rgw", "user", "create", "--uid", "dist-resume",
                     "--display-name", "dist-resume tests", "--access-key", endpoint.key_id,
                     "--secret-key", endpoint.secret)
        cluster.start("client.rgw", "radosgw", "-n", "client.rgw")
        cluster.wait_until(lambda: _rgw_answers(endpoint.url), f"radosgw to answer on {endpoint.url}")
        yield endpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bucket", default="checkpoints", help="bucket to create (default: checkpoints)")
    args = parser.parse_args()
    import boto3

    start = time.monotonic()
    with ceph_rgw() as rgw:
        boto3.client("s3", endpoint_url=rgw.url, region_name="us-east-1", aws_access_key_id=rgw.key_id,
                     aws_secret_access_key=rgw.secret).create_bucket(Bucket=args.bucket)
        print(f"# Ceph RGW ready in {time.monotonic() - start:.1f} s; Ctrl-C stops it and deletes its data")
        print(f"export AWS_ENDPOINT_URL={rgw.url}")
        print(f"export AWS_ACCESS_KEY_ID={rgw.key_id} AWS_SECRET_ACCESS_KEY={rgw.secret} "
              "AWS_DEFAULT_REGION=us-east-1")
        print(f"# checkpoint URL: s3://{args.bucket}/<run>", flush=True)
        stop = threading.Event()
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        stop.wait()


if __name__ == "__main__":
    main()
