"""Run the scheduler as a host process, for the tests and the demo.

::

    proc = run_scheduler(sa_kubeconfig, env={"GPU_SCHEDULER_LEASE_NAMESPACE": ns})
    ...                      # /readyz answered 200: caches synced
    proc.stop()              # SIGTERM: the scheduler releases its Lease and exits

The HTTP port is in ``proc.env["GPU_SCHEDULER_HTTP_PORT"]`` (see :func:`http_url`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from localcluster.network import free_port
from localcluster.procs import ManagedProcess

HOST = "127.0.0.1"


def scheduler_command() -> Path:
    """The ``gpu-scheduler`` console script of the interpreter's virtualenv."""
    return Path(sys.executable).parent / "gpu-scheduler"


def http_url(proc: ManagedProcess, path: str = "") -> str:
    """``http://127.0.0.1:PORT`` + ``path`` of a process started by :func:`run_scheduler`."""
    return f"http://{HOST}:{proc.env['GPU_SCHEDULER_HTTP_PORT']}{path}"


def run_scheduler(
    kubeconfig: Path,
    env: Mapping[str, str] | None = None,
    log_path: Path | None = None,
    http_port: int | None = None,
    *,
    timeout: float = 60,
) -> ManagedProcess:
    """Start ``gpu-scheduler`` against ``kubeconfig`` and wait until ``/readyz`` answers 200.

    ``env`` adds to (and overrides) the current environment, e.g.
    ``{"GPU_SCHEDULER_LEASE_NAMESPACE": ns, "POD_NAME": "replica-a"}``. Without
    ``http_port`` a free one is chosen. The returned process is started; stop it
    with ``.stop()`` or use it as a context manager.
    """
    port = http_port or free_port()
    full_env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "GPU_SCHEDULER_HTTP_ADDRESS": HOST,
        "GPU_SCHEDULER_HTTP_PORT": str(port),
        **(env or {}),
    }
    name = f"gpu-scheduler-{full_env.get('POD_NAME') or port}"
    proc = ManagedProcess(name, [scheduler_command()], env=full_env, log_path=log_path)
    proc.start()
    try:
        proc.wait_http(http_url(proc, "/readyz"), timeout=timeout)
    except BaseException:
        proc.stop()
        raise
    return proc
