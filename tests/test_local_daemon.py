"""The daemon and code server a command starts (pipelines/local_daemon.py) live as long as the
command, whichever of its threads first asked for them."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import psutil
import yaml
from dagster import DagsterInstance

from pipelines.local_daemon import LocalDaemon, live_daemons

ROOT = Path(__file__).parent.parent
LINGER_S = 3.0  # a parent-death signal is sent as the thread ends; the dead are reaped at once


def test_services_started_for_a_thread_that_ends_serve_on_until_the_command_closes_them(tmp_path):
    """An overlapping iteration's thread queues the first run, then ends before the command does:
    the kernel's parent-death signal follows the thread that started a process, and must not
    take the code server or the daemon with that thread."""
    (tmp_path / "dagster.yaml").write_text((ROOT / "pipelines" / "dagster.yaml").read_text())
    before = set(psutil.Process().children())  # a session's servers, started by other tests
    with DagsterInstance.from_config(str(tmp_path)) as instance:
        daemon = LocalDaemon(instance, {"DAGSTER_HOME": str(tmp_path)})
        with daemon:
            asking = threading.Thread(target=daemon.ensure)
            asking.start()
            asking.join()
            time.sleep(LINGER_S)
            services = set(psutil.Process().children()) - before
            assert len(services) == 2 and all(service.status() != psutil.STATUS_ZOMBIE for service in services)
            assert live_daemons(instance)
            [location] = yaml.safe_load(daemon.workspace.read_text())["load_from"]
            with socket.socket(socket.AF_UNIX) as code_server:
                code_server.connect(location["grpc_server"]["socket"])  # refused once its server is dead
        assert set(psutil.Process().children()) == before
