"""localcluster.pki: the local control plane's certificates, issued by the project's one
certificate builder (kube_gpu_scheduler/certs/issuing.py, as generate-webhook-certs.py's)."""

from __future__ import annotations

import stat
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from localcluster.pki import LocalPKI

REPO = Path(__file__).resolve().parents[3]


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def usages(cert: x509.Certificate) -> list[x509.ObjectIdentifier]:
    return list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def test_a_client_certificate_names_the_user_and_group(tmp_path: Path) -> None:
    pki = LocalPKI(tmp_path)
    crt, key = pki.issue("admin", "kubernetes-admin", org="system:masters")
    cert = load(crt)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "kubernetes-admin"
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:masters"
    assert usages(cert) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    cert.verify_directly_issued_by(load(pki.ca_file))
    private = serialization.load_pem_private_key(key.read_bytes(), password=None)
    assert isinstance(private, ec.EllipticCurvePrivateKey)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600


def test_a_serving_certificate_holds_its_names_and_addresses(tmp_path: Path) -> None:
    pki = LocalPKI(tmp_path)
    crt, _ = pki.issue(
        "apiserver", "kube-apiserver", dns=("localhost", "kubernetes"), ips=("127.0.0.1",), server=True
    )
    cert = load(crt)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["localhost", "kubernetes"]
    assert [str(a) for a in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert usages(cert) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "kube-apiserver"
    cert.verify_directly_issued_by(load(pki.ca_file))
    # An address alone is enough (the extender's certificate in tests/integration/test_extender.py).
    ip_only, _ = pki.issue("extender", "gpu-scheduler-extender", ips=("127.0.0.1",), server=True)
    assert load(ip_only).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    # And none at all (tests/unit/extender/test_scheduler_extender.py's TLS context test).
    bare, _ = pki.issue("ext2", "ext2", server=True)
    assert not [e for e in load(bare).extensions if isinstance(e.value, x509.SubjectAlternativeName)]


def test_the_ca_and_the_service_account_keys(tmp_path: Path) -> None:
    pki = LocalPKI(tmp_path)
    ca = load(pki.ca_file)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert stat.S_IMODE((tmp_path / "ca.key").stat().st_mode) == 0o600
    priv, pub = pki.service_account_keys()
    private = serialization.load_pem_private_key(priv.read_bytes(), password=None)
    public = serialization.load_pem_public_key(pub.read_bytes())
    assert isinstance(private, rsa.RSAPrivateKey) and isinstance(public, rsa.RSAPublicKey)
    assert private.public_key().public_numbers() == public.public_numbers()


def test_one_certificate_builder() -> None:
    """No second X.509 builder in the product, the tooling or the script: they all issue through
    kube_gpu_scheduler/certs/issuing.py."""
    sources = [REPO / "generate-webhook-certs.py"]
    for top in ("kube_gpu_scheduler", "localcluster", "bench", "tools", "tests/support"):
        sources += sorted((REPO / top).rglob("*.py"))
    builders = [p.relative_to(REPO).as_posix() for p in sources if "CertificateBuilder(" in p.read_text()]
    assert builders == ["kube_gpu_scheduler/certs/issuing.py"]
