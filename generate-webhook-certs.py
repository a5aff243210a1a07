#!/usr/bin/env python3
"""Generate the TLS material for gpu-scheduler's admission webhook: a private CA, a serving
certificate for the webhook Service's DNS names and a kubernetes.io/tls Secret in --output-dir
(default ./certs), and the base64 caBundle on stdout:

  CA_BUNDLE=$(./generate-webhook-certs.py --namespace gpu-scheduler-system)

``./generate-webhook-certs.py --help`` says every option, what names are accepted, and how files
are written. The program is the package ``kube_gpu_scheduler.certs`` of the checkout this script
sits in (its directory is first on ``sys.path``); it needs the Python packages cryptography and
PyYAML.
"""

from __future__ import annotations

import sys

PROG = "generate-webhook-certs"

try:
    from kube_gpu_scheduler.certs.cli import main
except ImportError as _missing:  # pragma: no cover - depends on the interpreter it is run with
    print(
        f"{PROG}: error: needs the Python packages cryptography and PyYAML ({_missing}); "
        "run it with the project's virtualenv or pip install cryptography pyyaml",
        file=sys.stderr,
    )
    raise SystemExit(2) from None

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
