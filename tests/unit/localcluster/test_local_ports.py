"""free_port: the ports the local control plane's servers listen on.

CI once failed 15 tests because a controller-manager's --secure-port, picked with bind(0), was
taken by another worker's outgoing connection before the controller-manager bound it."""

from __future__ import annotations

import socket
import subprocess
import sys

from localcluster import network
from localcluster.network import free_port


def test_ports_lie_outside_the_kernels_ephemeral_range() -> None:
    low, high = network._ephemeral_range()
    ports = [free_port() for _ in range(50)]
    assert all(not low <= p <= high for p in ports), ports
    assert len(set(ports)) == len(ports)


def test_processes_side_by_side_are_never_handed_the_same_port() -> None:
    code = "from localcluster.network import free_port\nprint(*[free_port() for _ in range(100)])"
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(4)
    ]
    ports = [int(p) for proc in procs for p in proc.communicate(timeout=60)[0].split()]
    assert all(proc.returncode == 0 for proc in procs)
    assert len(ports) == 400
    assert len(set(ports)) == 400


def test_a_port_something_listens_on_is_skipped() -> None:
    pool = network._pool()
    assert pool is not None, "the ephemeral range leaves no room on this machine"
    # The port the shared counter hands out next, taken by a listener first.
    for _ in range(20):
        upcoming = pool[
            (int(network._POOL_LOCK.read_text() or 0) if network._POOL_LOCK.exists() else 0) % len(pool)
        ]
        with socket.socket() as held:
            try:
                held.bind(("127.0.0.1", upcoming))
            except OSError:
                continue  # another process holds it already; try the next one
            held.listen()
            port = free_port()
            assert port != upcoming
            assert network._bindable(port)
            return
    raise AssertionError("could not hold the upcoming port")
