"""Keys and X.509 certificates: a private CA, serving and client certificates signed by it, and
their PEM forms. The one certificate builder of the project: the webhook's certificates
(generate-webhook-certs.py) and the local control plane's (localcluster/pki.py) come from here."""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kube_gpu_scheduler.certs.errors import CertError
from kube_gpu_scheduler.certs.names import check_ip

DEFAULT_DAYS = 365
DEFAULT_CA_DAYS = 3650
KEY_TYPES = ("ecdsa-p256", "ecdsa-p384", "rsa-2048", "rsa-4096")
# Certificates start a little in the past so that a node whose clock lags still accepts them.
BACKDATE = dt.timedelta(minutes=5)
# X.509's upper bound for a commonName (RFC 5280, ub-common-name).
MAX_COMMON_NAME = 64

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


def generate_key(key_type: str) -> PrivateKey:
    if key_type == "ecdsa-p256":
        return ec.generate_private_key(ec.SECP256R1())
    if key_type == "ecdsa-p384":
        return ec.generate_private_key(ec.SECP384R1())
    if key_type in ("rsa-2048", "rsa-4096"):
        return rsa.generate_private_key(public_exponent=65537, key_size=int(key_type.split("-")[1]))
    raise CertError(f"unknown key type {key_type!r}: choose one of {', '.join(KEY_TYPES)}")


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _key_usage(*, ca: bool, key_encipherment: bool = False) -> x509.KeyUsage:
    """A CA signs certificates and CRLs; a serving certificate signs handshakes (and, RSA, enciphers keys)."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=key_encipherment,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _builder(
    subject: x509.Name, issuer: x509.Name, key: PrivateKey, not_after: dt.datetime
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now() - BACKDATE)
        .not_valid_after(not_after)
    )


def make_ca(
    key: PrivateKey, days: int = DEFAULT_CA_DAYS, common_name: str = "gpu-scheduler-webhook-ca"
) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    return (
        _builder(name, name, key, now() + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )


def _subject(common_name: str, organization: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attrs)


def _leaf(
    ca_cert: x509.Certificate,
    ca_key: PrivateKey,
    key: PrivateKey,
    subject: x509.Name,
    usage: x509.ObjectIdentifier,
    sans: Sequence[x509.GeneralName],
    days: int,
) -> x509.Certificate:
    """A certificate for ``key`` (``usage``: server or client authentication), signed by the CA."""
    # The certificate may not outlive the CA that signs it (issue() refuses a --days that
    # would; this only takes off the moments between making the CA and this certificate).
    not_after = min(now() + dt.timedelta(days=days), ca_cert.not_valid_after_utc)
    rsa_key = isinstance(key, rsa.RSAPrivateKey)
    builder = (
        _builder(subject, ca_cert.subject, key, not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False, key_encipherment=rsa_key), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return (
        builder.add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )


def make_serving_cert(
    ca_cert: x509.Certificate,
    ca_key: PrivateKey,
    key: PrivateKey,
    dns_names: Sequence[str],
    *,
    ips: Sequence[str] = (),
    days: int = DEFAULT_DAYS,
    common_name: str | None = None,
    organization: str | None = None,
) -> x509.Certificate:
    """A server certificate for ``dns_names`` and ``ips``, signed by the CA.

    The names must be valid already (``check_dns_name``); addresses are checked here.
    The commonName (which verifiers ignore when there are SANs) is ``common_name`` or the
    first name that fits its 64 characters. Without names and addresses the certificate has no
    SAN extension (the local control plane's tests make such certificates; the script's always
    hold the Service's names).
    """
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    addrs = dict.fromkeys(check_ip(ip) for ip in ips)
    sans += [x509.IPAddress(a) for a in addrs]
    if common_name is None:
        fitting = [n for n in dns_names if len(n) <= MAX_COMMON_NAME and "*" not in n]
        common_name = fitting[0] if fitting else "gpu-scheduler-webhook"
    subject = _subject(common_name, organization)
    return _leaf(ca_cert, ca_key, key, subject, ExtendedKeyUsageOID.SERVER_AUTH, sans, days)


def make_client_cert(
    ca_cert: x509.Certificate,
    ca_key: PrivateKey,
    key: PrivateKey,
    common_name: str,
    *,
    organization: str | None = None,
    days: int = DEFAULT_DAYS,
) -> x509.Certificate:
    """A client certificate for user ``common_name`` in group ``organization`` (as the apiserver
    reads a client certificate), signed by the CA."""
    subject = _subject(common_name, organization)
    return _leaf(ca_cert, ca_key, key, subject, ExtendedKeyUsageOID.CLIENT_AUTH, (), days)


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def key_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def public_key_pem(key: PrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def ca_bundle(ca_cert: x509.Certificate) -> str:
    """The webhook configurations' ``caBundle``: the CA certificate's PEM, base64-encoded."""
    return base64.b64encode(cert_pem(ca_cert)).decode()
