"""Run the admission webhook as a host process, for the tests and the demo.

The local kube-apiserver calls it at ``https://127.0.0.1:PORT``, so its serving
certificate carries the IP SAN 127.0.0.1 (and ``localhost``)::

    certs = make_certs(workdir / "webhook-certs")
    with run_webhook(certs, port) as proc:  # already answering https://127.0.0.1:PORT/readyz
        ...
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from localcluster.procs import ManagedProcess

REPO = Path(__file__).resolve().parent.parent
CERT_SCRIPT = REPO / "generate-webhook-certs.py"
HOST = "127.0.0.1"


def webhook_command() -> Path:
    """The ``gpu-scheduler-webhook`` console script of the interpreter's virtualenv."""
    return Path(sys.executable).parent / "gpu-scheduler-webhook"


def make_certs(
    out_dir: Path, *, service: str = "gpu-scheduler-webhook", namespace: str = "gpu-scheduler-system"
) -> Path:
    """CA and serving certificate (SANs include 127.0.0.1 and localhost) in ``out_dir``; returns it.

    Runs ``generate-webhook-certs.py`` itself, the way a user does; ``out_dir`` must not hold
    certificates already (the script refuses to overwrite them).
    """
    subprocess.run(
        [
            sys.executable,
            str(CERT_SCRIPT),
            "--output-dir",
            str(out_dir),
            "--service",
            service,
            "--namespace",
            namespace,
            "--ip",
            HOST,
            "--dns",
            "localhost",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return out_dir


def ca_bundle(certs_dir: Path) -> str:
    """The ``caBundle`` for a webhook configuration: base64 of ``ca.crt``."""
    return base64.b64encode((certs_dir / "ca.crt").read_bytes()).decode()


def run_webhook(
    certs_dir: Path,
    port: int,
    env: Mapping[str, str] | None = None,
    log_path: Path | None = None,
    *,
    workers: int = 1,
    timeout: float = 60,
) -> ManagedProcess:
    """Start ``gpu-scheduler-webhook`` on 127.0.0.1:``port`` and wait until ``/readyz`` answers 200.

    ``env`` adds to (and overrides) the current environment, e.g. ``{"KUBECONFIG": ...}`` so that
    ``/validate`` can look nodes up, or ``{"WEBHOOK_INJECTION_MODE": "nvidia"}``. The returned
    process is started; stop it with ``.stop()`` or use it as a context manager. One worker
    (gevent: up to $WEBHOOK_WORKER_CONNECTIONS connections) is plenty on a laptop; the chart runs two.
    """
    full_env = {
        **os.environ,
        "WEBHOOK_TLS_CERT_FILE": str(certs_dir / "tls.crt"),
        "WEBHOOK_TLS_KEY_FILE": str(certs_dir / "tls.key"),
        "WEBHOOK_PORT": str(port),
        **(env or {}),
    }
    proc = ManagedProcess(
        f"webhook-{port}",
        [webhook_command(), "--host", HOST, "--port", str(port), "--workers", str(workers)],
        env=full_env,
        log_path=log_path,
    )
    proc.start()
    try:
        proc.wait_http(f"https://{HOST}:{port}/readyz", timeout=timeout, cafile=certs_dir / "ca.crt")
    except BaseException:
        proc.stop()
        raise
    return proc
