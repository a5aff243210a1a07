"""``generate-webhook-certs.py``'s program: the admission webhook's TLS material (a private CA, a
serving certificate for the webhook Service's names, a kubernetes.io/tls Secret, the caBundle),
and the one X.509 certificate builder of the project (the local control plane's CA, serving
and client certificates come from it too).

``names.py`` (what a name, an address or a validity may be), ``issuing.py`` (keys and
certificates), ``files.py`` (the files, read and written safely), ``webhook_tls.py`` (the
request: ``issue``, ``write``) and ``cli.py`` (the command line, ``main``).
"""

from kube_gpu_scheduler.certs.cli import main, parse_args
from kube_gpu_scheduler.certs.errors import CertError
from kube_gpu_scheduler.certs.files import load_ca
from kube_gpu_scheduler.certs.issuing import (
    BACKDATE,
    KEY_TYPES,
    ca_bundle,
    cert_pem,
    generate_key,
    key_pem,
    make_ca,
    make_client_cert,
    make_serving_cert,
    public_key_pem,
)
from kube_gpu_scheduler.certs.names import check_dns_name, check_ip, check_label, check_subdomain
from kube_gpu_scheduler.certs.webhook_tls import Issued, issue, secret_manifest, service_dns_names, write

__all__ = [
    "BACKDATE",
    "KEY_TYPES",
    "CertError",
    "Issued",
    "ca_bundle",
    "cert_pem",
    "check_dns_name",
    "check_ip",
    "check_label",
    "check_subdomain",
    "generate_key",
    "issue",
    "key_pem",
    "load_ca",
    "main",
    "make_ca",
    "make_client_cert",
    "make_serving_cert",
    "parse_args",
    "public_key_pem",
    "secret_manifest",
    "service_dns_names",
    "write",
]
