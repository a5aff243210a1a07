#!/usr/bin/env python3
"""Generate the TLS material for gpu-scheduler's admission webhook.

Writes into --output-dir (default ./certs, which git ignores):

  ca.crt, ca.key (0600)     a private CA; its certificate is the caBundle
  tls.crt, tls.key (0600)   the serving certificate, for the webhook Service's DNS names
  webhook-tls-secret.yaml   a kubernetes.io/tls Secret (tls.crt, tls.key, ca.crt), mode 0600

and prints the base64 caBundle on stdout (messages go to stderr), so that

  CA_BUNDLE=$(./generate-webhook-certs.py --namespace gpu-scheduler-system)

works. Existing files are never overwritten without --force. --reissue makes a
new serving certificate from the existing CA (the caBundle stays the same):
the way to renew before tls.crt expires.

Examples:
  ./generate-webhook-certs.py
  ./generate-webhook-certs.py --service my-webhook --namespace gpu --days 90
  ./generate-webhook-certs.py --ip 127.0.0.1 --dns localhost --output-dir /tmp/certs
  ./generate-webhook-certs.py --reissue
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import ipaddress
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_SERVICE = "gpu-scheduler-webhook"
DEFAULT_NAMESPACE = "gpu-scheduler-system"
DEFAULT_SECRET = "gpu-scheduler-webhook-tls"  # noqa: S105 (a Secret object's name)
DEFAULT_DAYS = 365
DEFAULT_CA_DAYS = 3650
KEY_TYPES = ("ecdsa-p256", "ecdsa-p384", "rsa-2048", "rsa-4096")
# Certificates start a little in the past so that a node whose clock lags still accepts them.
BACKDATE = dt.timedelta(minutes=5)

CA_CRT, CA_KEY, TLS_CRT, TLS_KEY = "ca.crt", "ca.key", "tls.crt", "tls.key"
SECRET_FILE = "webhook-tls-secret.yaml"  # noqa: S105 (a file name)
PRIVATE = (CA_KEY, TLS_KEY, SECRET_FILE)

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


class CertError(Exception):
    """Something the user must fix (existing files, a missing CA); the message says what."""


@dataclass(frozen=True)
class Issued:
    ca_cert: x509.Certificate
    ca_key: PrivateKey
    cert: x509.Certificate
    key: PrivateKey


def generate_key(key_type: str) -> PrivateKey:
    if key_type == "ecdsa-p256":
        return ec.generate_private_key(ec.SECP256R1())
    if key_type == "ecdsa-p384":
        return ec.generate_private_key(ec.SECP384R1())
    if key_type in ("rsa-2048", "rsa-4096"):
        return rsa.generate_private_key(public_exponent=65537, key_size=int(key_type.split("-")[1]))
    raise CertError(f"unknown key type {key_type!r}: choose one of {', '.join(KEY_TYPES)}")


def service_dns_names(service: str, namespace: str) -> list[str]:
    """The names under which the apiserver may reach the Service."""
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def make_ca(
    key: PrivateKey, days: int = DEFAULT_CA_DAYS, common_name: str = "gpu-scheduler-webhook-ca"
) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - BACKDATE)
        .not_valid_after(_now() + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )


def make_serving_cert(
    ca_cert: x509.Certificate,
    ca_key: PrivateKey,
    key: PrivateKey,
    dns_names: Sequence[str],
    *,
    ips: Sequence[str] = (),
    days: int = DEFAULT_DAYS,
) -> x509.Certificate:
    """A server certificate for ``dns_names`` and ``ips``, signed by the CA."""
    if not dns_names:
        raise CertError("the serving certificate needs at least one DNS name")
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    for ip in ips:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(ip)))
        except ValueError:
            raise CertError(f"--ip {ip!r} is not an IP address") from None
    # The certificate may not outlive the CA that signs it.
    not_after = min(_now() + dt.timedelta(days=days), ca_cert.not_valid_after_utc)
    rsa_key = isinstance(key, rsa.RSAPrivateKey)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_names[-1])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - BACKDATE)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=rsa_key,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def key_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def ca_bundle(ca_cert: x509.Certificate) -> str:
    """The webhook configurations' ``caBundle``: the CA certificate's PEM, base64-encoded."""
    return base64.b64encode(cert_pem(ca_cert)).decode()


def secret_manifest(name: str, namespace: str, issued: Issued) -> str:
    """A kubernetes.io/tls Secret holding the serving pair and the CA certificate."""
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "gpu-scheduler", "app.kubernetes.io/component": "webhook"},
        },
        "type": "kubernetes.io/tls",
        "data": {
            "tls.crt": base64.b64encode(cert_pem(issued.cert)).decode(),
            "tls.key": base64.b64encode(key_pem(issued.key)).decode(),
            "ca.crt": ca_bundle(issued.ca_cert),
        },
    }
    header = "# Generated by generate-webhook-certs.py. Holds a private key: never commit it.\n"
    return header + yaml.safe_dump(secret, sort_keys=False)


def load_ca(out_dir: Path) -> tuple[x509.Certificate, PrivateKey]:
    """The existing CA in ``out_dir``; CertError when missing or when key and certificate differ."""
    crt_path, key_path = out_dir / CA_CRT, out_dir / CA_KEY
    for path in (crt_path, key_path):
        if not path.is_file():
            raise CertError(f"--reissue needs the existing CA, but {path} does not exist")
    try:
        cert = x509.load_pem_x509_certificate(crt_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except ValueError as exc:
        raise CertError(f"cannot read the CA in {out_dir}: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise CertError(f"{key_path} holds a {type(key).__name__}; only ECDSA and RSA CAs are supported")
    if key.public_key().public_numbers() != cert.public_key().public_numbers():  # type: ignore[union-attr]
        raise CertError(f"{key_path} is not the key of {crt_path}")
    if cert.not_valid_after_utc <= _now():
        raise CertError(
            f"the CA in {crt_path} expired on {cert.not_valid_after_utc:%Y-%m-%d}; "
            "make a new one with --force"
        )
    return cert, key


def issue(
    out_dir: Path,
    *,
    service: str = DEFAULT_SERVICE,
    namespace: str = DEFAULT_NAMESPACE,
    dns: Sequence[str] = (),
    ips: Sequence[str] = (),
    days: int = DEFAULT_DAYS,
    ca_days: int = DEFAULT_CA_DAYS,
    key_type: str = "ecdsa-p256",
    reissue: bool = False,
) -> Issued:
    """Make (or, with ``reissue``, load) the CA and make a serving certificate. Writes nothing."""
    if days < 1 or ca_days < 1:
        raise CertError("--days and --ca-days must be at least 1")
    if reissue:
        ca_cert, ca_key = load_ca(out_dir)
    else:
        ca_key = generate_key(key_type)
        ca_cert = make_ca(ca_key, days=max(ca_days, days))
    names = list(dict.fromkeys([*service_dns_names(service, namespace), *dns]))
    key = generate_key(key_type)
    cert = make_serving_cert(ca_cert, ca_key, key, names, ips=ips, days=days)
    return Issued(ca_cert=ca_cert, ca_key=ca_key, cert=cert, key=key)


def _write(path: Path, data: bytes, private: bool) -> None:
    """Write ``data``; private files are created 0600 and never readable by others, even briefly."""
    mode = 0o600 if private else 0o644
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
    finally:
        os.close(fd)


def write(
    out_dir: Path,
    issued: Issued,
    secret_name: str,
    namespace: str,
    *,
    force: bool = False,
    reissue: bool = False,
) -> list[Path]:
    """Write the files; refuse (CertError) to replace existing ones unless ``force``.

    With ``reissue`` the CA files are left alone and the serving files are replaced
    (that is what re-issuing means), so --force is not needed for them.
    """
    files: dict[str, bytes] = {
        TLS_CRT: cert_pem(issued.cert),
        TLS_KEY: key_pem(issued.key),
        SECRET_FILE: secret_manifest(secret_name, namespace, issued).encode(),
    }
    if not reissue:
        files = {CA_CRT: cert_pem(issued.ca_cert), CA_KEY: key_pem(issued.ca_key), **files}
    out_dir.mkdir(parents=True, exist_ok=True)
    existing = [out_dir / n for n in files if (out_dir / n).exists()]
    if existing and not (force or reissue):
        raise CertError(
            "refusing to overwrite "
            + ", ".join(str(p) for p in existing)
            + ": pass --force to replace them (a new CA changes the caBundle), "
            "or --reissue to renew only the serving certificate from the existing CA"
        )
    written = []
    for name, data in files.items():
        _write(out_dir / name, data, private=name in PRIVATE)
        written.append(out_dir / name)
    return written


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="generate-webhook-certs.py",
        description="Make a CA and a serving certificate for the gpu-scheduler webhook; "
        "print the base64 caBundle on stdout.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--service", default=DEFAULT_SERVICE, help="the webhook's Service name")
    parser.add_argument("--namespace", default=DEFAULT_NAMESPACE, help="the Service's namespace")
    parser.add_argument("--output-dir", type=Path, default=Path("certs"), help="where to write the files")
    parser.add_argument("--days", type=int, default=DEFAULT_DAYS, help="serving certificate validity")
    parser.add_argument("--ca-days", type=int, default=DEFAULT_CA_DAYS, help="CA validity (new CA only)")
    parser.add_argument("--key-type", choices=KEY_TYPES, default="ecdsa-p256", help="key algorithm")
    parser.add_argument("--secret-name", default=DEFAULT_SECRET, help="name of the Secret in the manifest")
    parser.add_argument(
        "--dns", action="append", default=[], metavar="NAME", help="extra DNS SAN (repeatable)"
    )
    parser.add_argument("--ip", action="append", default=[], metavar="ADDR", help="extra IP SAN (repeatable)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--force", action="store_true", help="replace existing files, CA included")
    mode.add_argument(
        "--reissue",
        action="store_true",
        help="new serving certificate from the existing ca.crt/ca.key; the CA and caBundle stay",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out_dir: Path = args.output_dir
    try:
        issued = issue(
            out_dir,
            service=args.service,
            namespace=args.namespace,
            dns=args.dns,
            ips=args.ip,
            days=args.days,
            ca_days=args.ca_days,
            key_type=args.key_type,
            reissue=args.reissue,
        )
        written = write(
            out_dir, issued, args.secret_name, args.namespace, force=args.force, reissue=args.reissue
        )
    except CertError as exc:
        print(f"generate-webhook-certs.py: error: {exc}", file=sys.stderr)
        return 1
    sans = issued.cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    names = [str(v) for v in sans.get_values_for_type(x509.DNSName)]
    names += [str(v) for v in sans.get_values_for_type(x509.IPAddress)]
    what = "re-issued the serving certificate from the existing CA" if args.reissue else "made a new CA"
    print(f"{what}; serving certificate for {', '.join(names)}", file=sys.stderr)
    print(f"valid until {issued.cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC", file=sys.stderr)
    for path in written:
        print(f"wrote {path}", file=sys.stderr)
    print(f"apply the Secret: kubectl apply -f {out_dir / SECRET_FILE}", file=sys.stderr)
    print("caBundle (base64 of ca.crt) follows on stdout", file=sys.stderr)
    print(ca_bundle(issued.ca_cert))
    return 0


if __name__ == "__main__":
    sys.exit(main())
