"""The apiserver's admission configuration: every admission webhook call it makes carries a client
certificate of its own CA (``Cluster.webhook_client_ca_file``), so a webhook can require it."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml


def write_admission_config(workdir: Path, crt: Path, key: Path) -> Path:
    """An AdmissionConfiguration whose webhook kubeconfig gives every webhook call a client certificate.

    The apiserver looks a webhook's ``users`` entry up by the URL's host:port (or, for a Service,
    ``NAME.NAMESPACE.svc:PORT``), then ``*.``-suffixes of it, the same without ``:443``, and
    last ``*``. A URL webhook on 127.0.0.1 with a free port only matches ``*``. Servers that do
    not ask for a client certificate never see it.
    """
    kubeconfig = workdir / "webhook-admission.kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "users": [
                    {
                        "name": "*",
                        "user": {
                            "client-certificate-data": base64.b64encode(crt.read_bytes()).decode(),
                            "client-key-data": base64.b64encode(key.read_bytes()).decode(),
                        },
                    }
                ],
            },
            sort_keys=False,
        )
    )
    kubeconfig.chmod(0o600)
    plugin = {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "WebhookAdmissionConfiguration",
        "kubeConfigFile": str(kubeconfig),
    }
    path = workdir / "admission-config.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "apiserver.config.k8s.io/v1",
                "kind": "AdmissionConfiguration",
                "plugins": [
                    {"name": "MutatingAdmissionWebhook", "configuration": plugin},
                    {"name": "ValidatingAdmissionWebhook", "configuration": plugin},
                ],
            },
            sort_keys=False,
        )
    )
    return path
