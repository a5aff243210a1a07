"""Certificates and keys for the local control plane (never committed: they live in its workdir).

Issued by the project's one certificate builder, kube_gpu_scheduler.certs (the same code as
generate-webhook-certs.py): ECDSA P-256 keys, a CA, serving and client certificates."""

from __future__ import annotations

from pathlib import Path

from kube_gpu_scheduler.certs import (
    cert_pem,
    generate_key,
    key_pem,
    make_ca,
    make_client_cert,
    make_serving_cert,
    public_key_pem,
)

_VALIDITY_DAYS = 2
_KEY_TYPE = "ecdsa-p256"


def _write_key(path: Path, pem: bytes) -> None:
    path.write_bytes(pem)
    path.chmod(0o600)


class LocalPKI:
    """A throw-away CA that signs the apiserver's serving cert and client certs."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ca_key = generate_key(_KEY_TYPE)
        self.ca_cert = make_ca(self.ca_key, days=_VALIDITY_DAYS, common_name="gpu-scheduler-localcluster-ca")
        self.ca_file = self.dir / "ca.crt"
        self.ca_file.write_bytes(cert_pem(self.ca_cert))
        _write_key(self.dir / "ca.key", key_pem(self.ca_key))

    def issue(
        self,
        name: str,
        cn: str,
        org: str | None = None,
        dns: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
        server: bool = False,
    ) -> tuple[Path, Path]:
        """``name``.crt and ``name``.key: a serving certificate for ``dns`` and ``ips`` (``server``),
        else a client certificate for user ``cn`` in group ``org``."""
        key = generate_key(_KEY_TYPE)
        if server:
            cert = make_serving_cert(
                self.ca_cert,
                self.ca_key,
                key,
                dns,
                ips=ips,
                days=_VALIDITY_DAYS,
                common_name=cn,
                organization=org,
            )
        else:
            cert = make_client_cert(self.ca_cert, self.ca_key, key, cn, organization=org, days=_VALIDITY_DAYS)
        crt, keyfile = self.dir / f"{name}.crt", self.dir / f"{name}.key"
        crt.write_bytes(cert_pem(cert))
        _write_key(keyfile, key_pem(key))
        return crt, keyfile

    def service_account_keys(self) -> tuple[Path, Path]:
        key = generate_key("rsa-2048")
        priv, pub = self.dir / "sa.key", self.dir / "sa.pub"
        _write_key(priv, key_pem(key))
        pub.write_bytes(public_key_pem(key))
        return priv, pub
