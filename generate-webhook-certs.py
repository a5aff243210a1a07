#!/usr/bin/env python3
"""Generate the TLS material for gpu-scheduler's admission webhook.

Writes into --output-dir (default ./certs, which git ignores):

  ca.crt (0644), ca.key (0600)     a private CA; its certificate is the caBundle
  tls.crt (0644), tls.key (0600)   the serving certificate, for the webhook Service's DNS names
  webhook-tls-secret.yaml (0600)   a kubernetes.io/tls Secret (tls.crt, tls.key, ca.crt)

and prints the base64 caBundle on stdout (messages go to stderr), so that

  CA_BUNDLE=$(./generate-webhook-certs.py --namespace gpu-scheduler-system)

works. Existing files are never overwritten without --force. --reissue makes a
new serving certificate from the existing CA (the caBundle stays the same):
the way to renew before tls.crt expires.

Names and addresses (anything else is refused, never rewritten):
  --service      a Kubernetes Service name, which is an RFC 1035 label: 1 to 63 of
                 a-z, 0-9 and '-', starting with a letter, ending with a letter or digit
  --namespace    an RFC 1123 label: the same, but it may start with a digit
  --secret-name  an RFC 1123 subdomain: such labels joined by '.', at most 253 in all
  --dns NAME     an RFC 1123 DNS name: labels of 1 to 63 of a-z, 0-9 and '-', not
                 starting or ending with '-', at most 253 in all, no trailing dot, the
                 last label not all digits (addresses go in --ip). Upper case is
                 refused rather than folded, so the certificate holds what you typed.
                 A wildcard is allowed only as the whole left-most label, with at least
                 two labels after it: *.example.com, never *, *.com, a.*.b or f*o.com
                 (OpenSSL matches none of those). It matches exactly one label.
  --ip ADDR      an IPv4 or IPv6 address, without a zone (%eth0); not 0.0.0.0 or ::

Validity:
  --days 1 to 3650 (serving certificate), --ca-days 1 to 36500 (new CA). The serving
  certificate may not outlive its CA: --days above --ca-days, or with --reissue a
  --days beyond the existing CA's expiry, is refused and the message says how many
  days fit. Nothing is clamped or stretched silently.

Files:
  --output-dir may be a symbolic link: it is the directory you named. The files in
  it must be regular files or absent: an entry ca.crt, ca.key, tls.crt, tls.key or
  webhook-tls-secret.yaml that is a symbolic link, a directory or anything else is
  refused (with --force and --reissue too) and nothing is written. Each file is
  written to a new temporary file in the same directory (created exclusively, never
  through a link, 0600 or 0644 from the start), flushed to disk and renamed over the
  old entry: readers see the old or the new file, never a partial one, and what a
  hard link to the old file holds is not touched. A new output directory gets 0700.

Exit status: 0 on success; 2 on any error, with exactly one line on stderr
("generate-webhook-certs: error: ...") and nothing on stdout; 130 on Ctrl-C.

Examples:
  ./generate-webhook-certs.py
  ./generate-webhook-certs.py --service my-webhook --namespace gpu --days 90
  ./generate-webhook-certs.py --ip 127.0.0.1 --dns localhost --output-dir /tmp/certs
  ./generate-webhook-certs.py --reissue
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import ipaddress
import os
import re
import secrets
import stat
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

PROG = "generate-webhook-certs"

try:
    import yaml
    from cryptography import x509
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
except ImportError as _missing:  # pragma: no cover - depends on the interpreter it is run with
    print(
        f"{PROG}: error: needs the Python packages cryptography and PyYAML ({_missing}); "
        "run it with the project's virtualenv or pip install cryptography pyyaml",
        file=sys.stderr,
    )
    raise SystemExit(2) from None

DEFAULT_SERVICE = "gpu-scheduler-webhook"
DEFAULT_NAMESPACE = "gpu-scheduler-system"
DEFAULT_SECRET = "gpu-scheduler-webhook-tls"  # noqa: S105 (a Secret object's name)
DEFAULT_DAYS = 365
DEFAULT_CA_DAYS = 3650
MAX_DAYS = 3650
MAX_CA_DAYS = 36500
KEY_TYPES = ("ecdsa-p256", "ecdsa-p384", "rsa-2048", "rsa-4096")
# Certificates start a little in the past so that a node whose clock lags still accepts them.
BACKDATE = dt.timedelta(minutes=5)
# No PEM certificate or key comes near this; a larger ca.crt/ca.key is not one.
MAX_READ = 1 << 20
# X.509's upper bound for a commonName (RFC 5280, ub-common-name).
MAX_COMMON_NAME = 64

CA_CRT, CA_KEY, TLS_CRT, TLS_KEY = "ca.crt", "ca.key", "tls.crt", "tls.key"
SECRET_FILE = "webhook-tls-secret.yaml"  # noqa: S105 (a file name)
PRIVATE = (CA_KEY, TLS_KEY, SECRET_FILE)
PRIVATE_MODE, PUBLIC_MODE = 0o600, 0o644

# RFC 1123 label (Kubernetes' DNS-1123 label), RFC 1035 label (Kubernetes' DNS-1035 label, what
# Service names must be), and a label of Kubernetes' DNS-1123 subdomain (no per-label limit there).
_LABEL_1123 = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_LABEL_1035 = re.compile(r"[a-z]([a-z0-9-]{0,61}[a-z0-9])?")
_SUBDOMAIN_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")
MAX_DNS_NAME = 253

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class CertError(Exception):
    """Something the user must fix (an option, existing files, the CA); the message says what."""


@dataclass(frozen=True)
class Issued:
    ca_cert: x509.Certificate
    ca_key: PrivateKey
    cert: x509.Certificate
    key: PrivateKey


# ---------------------------------------------------------------------------- validation


def _lower_hint(value: str, valid: bool) -> str:
    """A hint for a value that only its upper case letters make invalid."""
    if valid and value != value.lower():
        return f": upper case is not allowed, use {value.lower()!r}"
    return ""


def check_label(option: str, value: str, *, rfc1035: bool = False) -> None:
    """``value`` is an RFC 1123 label (or, with ``rfc1035``, an RFC 1035 label)."""
    pattern = _LABEL_1035 if rfc1035 else _LABEL_1123
    if pattern.fullmatch(value):
        return
    hint = _lower_hint(value, bool(pattern.fullmatch(value.lower())))
    start = "a letter" if rfc1035 else "a letter or digit"
    raise CertError(
        f"{option} {value!r} is not an RFC {1035 if rfc1035 else 1123} label"
        + (
            hint
            or f": 1 to 63 characters of a-z, 0-9 and '-', starting with {start}, ending with a letter or digit"
        )
    )


def _subdomain_ok(value: str) -> bool:
    return 0 < len(value) <= MAX_DNS_NAME and all(_SUBDOMAIN_LABEL.fullmatch(p) for p in value.split("."))


def check_subdomain(option: str, value: str) -> None:
    """``value`` is an RFC 1123 subdomain, as Kubernetes checks object names."""
    if _subdomain_ok(value):
        return
    hint = _lower_hint(value, _subdomain_ok(value.lower()))
    raise CertError(
        f"{option} {value!r} is not an RFC 1123 subdomain"
        + (
            hint
            or ": labels of a-z, 0-9 and '-' (not starting or ending with '-') joined by '.', at most 253 in all"
        )
    )


def check_dns_name(name: str, option: str = "--dns") -> None:
    """``name`` is a DNS SAN this script will put in a certificate; see the module docstring."""
    what = f"{option} {name!r}"
    if not name:
        raise CertError(f"{what}: a DNS name cannot be empty")
    if not name.isascii():
        raise CertError(f"{what}: only ASCII is allowed; write an internationalized name in its xn-- form")
    if name != name.lower():
        raise CertError(
            f"{what}: upper case is not allowed (DNS names compare without case), use {name.lower()!r}"
        )
    if len(name) > MAX_DNS_NAME:
        raise CertError(f"{what}: a DNS name is at most {MAX_DNS_NAME} characters, this one has {len(name)}")
    if name.endswith("."):
        raise CertError(f"{what}: no trailing dot; certificates hold names without it")
    labels = name.split(".")
    wildcard = labels[0] == "*"
    if wildcard:
        labels = labels[1:]
    if any("*" in label for label in labels):
        raise CertError(
            f"{what}: a wildcard is allowed only as the whole left-most label, as in *.example.com"
        )
    if wildcard and len(labels) < 2:
        raise CertError(
            f"{what}: a wildcard needs at least two labels after it (*.example.com); "
            "OpenSSL matches no '*' or '*.com'-style wildcard"
        )
    for label in labels:
        if not label:
            raise CertError(f"{what}: empty label (a leading dot or two dots in a row)")
        if len(label) > 63:
            raise CertError(
                f"{what}: label {label[:16]!r}... is {len(label)} characters, at most 63 are allowed"
            )
        if not _LABEL_1123.fullmatch(label):
            raise CertError(
                f"{what}: label {label!r} may hold only a-z, 0-9 and '-', and may not start or end with '-'"
            )
    if labels[-1].isdigit():
        raise CertError(
            f"{what}: looks like an IP address (the last label is all digits): pass addresses with --ip"
        )


def check_ip(value: str) -> IPAddress:
    """``value`` as an address for an IP SAN."""
    try:
        addr = ipaddress.ip_address(value)
    except ValueError:
        raise CertError(f"--ip {value!r} is not an IP address") from None
    if isinstance(addr, ipaddress.IPv6Address) and addr.scope_id is not None:
        raise CertError(f"--ip {value!r}: a certificate cannot hold a zone (%{addr.scope_id}); leave it out")
    if addr.is_unspecified:
        raise CertError(f"--ip {value!r} is the unspecified address, which no client connects to")
    return addr


def check_days(days: int, ca_days: int) -> None:
    if not 1 <= days <= MAX_DAYS:
        raise CertError(
            f"--days {days} is out of range: the serving certificate is valid for 1 to {MAX_DAYS} days"
        )
    if not 1 <= ca_days <= MAX_CA_DAYS:
        raise CertError(f"--ca-days {ca_days} is out of range: a CA is valid for 1 to {MAX_CA_DAYS} days")


# ---------------------------------------------------------------------------- certificates


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
        .not_valid_before(_now() - BACKDATE)
        .not_valid_after(not_after)
    )


def make_ca(
    key: PrivateKey, days: int = DEFAULT_CA_DAYS, common_name: str = "gpu-scheduler-webhook-ca"
) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    return (
        _builder(name, name, key, _now() + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
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
    common_name: str | None = None,
) -> x509.Certificate:
    """A server certificate for ``dns_names`` and ``ips``, signed by the CA.

    The names must be valid already (``check_dns_name``); addresses are checked here.
    The commonName (which verifiers ignore when there are SANs) is ``common_name`` or the
    first name that fits its 64 characters.
    """
    if not dns_names:
        raise CertError("the serving certificate needs at least one DNS name")
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    addrs = dict.fromkeys(check_ip(ip) for ip in ips)
    sans += [x509.IPAddress(a) for a in addrs]
    if common_name is None:
        fitting = [n for n in dns_names if len(n) <= MAX_COMMON_NAME and "*" not in n]
        common_name = fitting[0] if fitting else "gpu-scheduler-webhook"
    # The certificate may not outlive the CA that signs it (issue() refuses a --days that
    # would; this only takes off the moments between making the CA and this certificate).
    not_after = min(_now() + dt.timedelta(days=days), ca_cert.not_valid_after_utc)
    rsa_key = isinstance(key, rsa.RSAPrivateKey)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    return (
        _builder(subject, ca_cert.subject, key, not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False, key_encipherment=rsa_key), critical=True)
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


# ---------------------------------------------------------------------------- files


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _open_dir(out_dir: Path, *, create: bool, missing: str = "") -> int:
    """A descriptor of ``out_dir`` (a symbolic link to a directory is followed: the user named it).

    All file operations go through this descriptor, so the directory is looked up once.
    With ``create`` a missing directory is made (0700); otherwise CertError(``missing``).
    """
    if create:
        try:
            out_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except FileExistsError:
            if out_dir.is_symlink():
                raise CertError(f"--output-dir {out_dir} is a symbolic link to a missing directory") from None
            raise CertError(f"--output-dir {out_dir} exists and is not a directory") from None
        except OSError as exc:
            raise CertError(f"cannot create --output-dir {out_dir}: {_reason(exc)}") from None
    try:
        return os.open(out_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise CertError(missing or f"--output-dir {out_dir} does not exist") from None
    except NotADirectoryError:
        raise CertError(f"--output-dir {out_dir} is not a directory") from None
    except OSError as exc:
        raise CertError(f"cannot open --output-dir {out_dir}: {_reason(exc)}") from None


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _existing_regular(dfd: int, out_dir: Path, name: str, verb: str) -> bool:
    """Whether ``name`` exists in the directory; CertError when it is anything but a regular file."""
    path = out_dir / name
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise CertError(f"cannot look at {path}: {_reason(exc)}") from None
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(name, dir_fd=dfd)
        except OSError:
            target = "?"
        raise CertError(
            f"refusing to {verb} {path}: it is a symbolic link (to {target!r}) and this script never "
            "follows links to its files; remove the link or choose another --output-dir"
        )
    if not stat.S_ISREG(st.st_mode):
        raise CertError(f"refusing to {verb} {path}: it is {_kind(st.st_mode)}, not a regular file")
    return True


def _read_regular(dfd: int, out_dir: Path, name: str, missing: str) -> bytes:
    """The content of the regular file ``name``, read without following a link."""
    path = out_dir / name
    if not _existing_regular(dfd, out_dir, name, "read"):
        raise CertError(missing)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except OSError as exc:
        raise CertError(f"cannot read {path}: {_reason(exc)}") from None
    with os.fdopen(fd, "rb") as f:
        try:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # replaced since we looked
                raise CertError(f"refusing to read {path}: it is not a regular file")
            data = f.read(MAX_READ + 1)
        except OSError as exc:
            raise CertError(f"cannot read {path}: {_reason(exc)}") from None
    if len(data) > MAX_READ:
        raise CertError(f"{path} is larger than {MAX_READ // 1024} KiB, which no PEM certificate or key is")
    return data


def _write_temp(dfd: int, out_dir: Path, name: str, data: bytes, mode: int) -> str:
    """``data`` in a new file next to ``name`` (mode ``mode`` from its creation, on disk); its name."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    tmp = f".{name}.{secrets.token_hex(8)}.tmp"
    try:
        fd = os.open(tmp, flags, mode, dir_fd=dfd)
    except OSError as exc:
        raise CertError(f"cannot write {out_dir / name}: {_reason(exc)}") from None
    try:
        try:
            os.fchmod(fd, mode)  # the umask may have taken bits off a public file
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dfd)
        if isinstance(exc, OSError):
            raise CertError(f"cannot write {out_dir / name}: {_reason(exc)}") from None
        raise
    return tmp


def _replace_files(dfd: int, out_dir: Path, files: dict[str, tuple[bytes, int]]) -> None:
    """Write every file to a temporary file first, then rename each over its target.

    ``os.replace`` swaps the directory entry: a symbolic link there would be replaced, never
    followed, and the content of a hard link to the old file stays as it was.
    """
    temps: dict[str, str] = {}
    try:
        for name, (data, mode) in files.items():
            temps[name] = _write_temp(dfd, out_dir, name, data, mode)
        for name in files:
            try:
                os.replace(temps[name], name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except OSError as exc:
                raise CertError(f"cannot replace {out_dir / name}: {_reason(exc)}") from None
            del temps[name]
        # Some file systems refuse fsync on a directory; the files themselves are on disk.
        with contextlib.suppress(OSError):
            os.fsync(dfd)
    finally:
        for tmp in temps.values():
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)


def _spki(key: PrivateKey | x509.Certificate) -> bytes:
    public = key.public_key()
    return public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def load_ca(out_dir: Path) -> tuple[x509.Certificate, PrivateKey]:
    """The existing CA in ``out_dir``; CertError when it is missing, unreadable, not a CA, or
    when key and certificate differ. Links are not followed: ca.crt and ca.key must be regular files."""
    crt_path, key_path = out_dir / CA_CRT, out_dir / CA_KEY
    missing = "--reissue needs the existing CA, but {} does not exist"
    dfd = _open_dir(out_dir, create=False, missing=missing.format(crt_path))
    try:
        crt_data = _read_regular(dfd, out_dir, CA_CRT, missing.format(crt_path))
        key_data = _read_regular(dfd, out_dir, CA_KEY, missing.format(key_path))
    finally:
        os.close(dfd)
    try:
        cert = x509.load_pem_x509_certificate(crt_data)
        cert_spki = _spki(cert)
    except (ValueError, UnsupportedAlgorithm):
        raise CertError(f"cannot read the CA: {crt_path} does not hold a PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(key_data, password=None)
    except TypeError:
        raise CertError(
            f"cannot read the CA: {key_path} is encrypted; give the script an unencrypted key"
        ) from None
    except (ValueError, UnsupportedAlgorithm):
        raise CertError(f"cannot read the CA: {key_path} does not hold a PEM private key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise CertError(f"{key_path} holds a {type(key).__name__}; only ECDSA and RSA CAs are supported")
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except (x509.ExtensionNotFound, ValueError):
        is_ca = False
    if not is_ca:
        raise CertError(f"{crt_path} is not a CA certificate (no basicConstraints CA:TRUE)")
    if _spki(key) != cert_spki:
        raise CertError(f"{key_path} is not the key of {crt_path}")
    if cert.not_valid_after_utc <= _now():
        raise CertError(
            f"the CA in {crt_path} expired on {cert.not_valid_after_utc:%Y-%m-%d}; make a new one with --force"
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
    """Check the request, make (or, with ``reissue``, load) the CA and make a serving certificate.

    Writes nothing; CertError for anything the user must fix.
    """
    check_label("--service", service, rfc1035=True)
    check_label("--namespace", namespace)
    for name in dns:
        check_dns_name(name)
    for ip in ips:
        check_ip(ip)
    check_days(days, ca_days)
    if key_type not in KEY_TYPES:
        raise CertError(f"unknown key type {key_type!r}: choose one of {', '.join(KEY_TYPES)}")
    if reissue:
        ca_cert, ca_key = load_ca(out_dir)
        ca_end = ca_cert.not_valid_after_utc
        left = ca_end - _now()
        if dt.timedelta(days=days) > left:
            fix = f"pass --days {left.days} or less, or" if left.days >= 1 else "it is due:"
            raise CertError(
                f"--days {days} would outlive the CA in {out_dir / CA_CRT}, which expires on "
                f"{ca_end:%Y-%m-%d %H:%M} UTC: {fix} make a new CA with --force"
            )
    else:
        if days > ca_days:
            raise CertError(
                f"--days {days} is longer than --ca-days {ca_days}: the serving certificate may not "
                "outlive its CA; lower --days or raise --ca-days"
            )
        ca_key = generate_key(key_type)
        ca_cert = make_ca(ca_key, days=ca_days)
    names = list(dict.fromkeys([*service_dns_names(service, namespace), *dns]))
    svc_name = f"{service}.{namespace}.svc"
    key = generate_key(key_type)
    cert = make_serving_cert(
        ca_cert,
        ca_key,
        key,
        names,
        ips=ips,
        days=days,
        common_name=svc_name if len(svc_name) <= MAX_COMMON_NAME else service,
    )
    return Issued(ca_cert=ca_cert, ca_key=ca_key, cert=cert, key=key)


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
    (that is what re-issuing means), so --force is not needed for them. An entry that is
    a symbolic link or not a regular file is refused whatever the flags, before anything
    is written.
    """
    check_subdomain("--secret-name", secret_name)
    check_label("--namespace", namespace)
    files: dict[str, bytes] = {
        TLS_CRT: cert_pem(issued.cert),
        TLS_KEY: key_pem(issued.key),
        SECRET_FILE: secret_manifest(secret_name, namespace, issued).encode(),
    }
    if not reissue:
        files = {CA_CRT: cert_pem(issued.ca_cert), CA_KEY: key_pem(issued.ca_key), **files}
    dfd = _open_dir(out_dir, create=True)
    try:
        existing = [out_dir / n for n in files if _existing_regular(dfd, out_dir, n, "write")]
        if existing and not (force or reissue):
            raise CertError(
                "refusing to overwrite "
                + ", ".join(str(p) for p in existing)
                + ": pass --force to replace them (a new CA changes the caBundle), "
                "or --reissue to renew only the serving certificate from the existing CA"
            )
        modes = {n: (data, PRIVATE_MODE if n in PRIVATE else PUBLIC_MODE) for n, data in files.items()}
        _replace_files(dfd, out_dir, modes)
    finally:
        os.close(dfd)
    return [out_dir / n for n in files]


# ---------------------------------------------------------------------------- command line


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """Usage errors are one line too (no usage block); --help has the details."""
        raise CertError(f"{message} (see --help)")


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    pass


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    doc = __doc__ or ""
    parser = _Parser(
        prog="generate-webhook-certs.py",
        description="Make a CA and a serving certificate for the gpu-scheduler webhook; "
        "print the base64 caBundle on stdout.",
        epilog=doc[doc.find("Names and addresses") :] if "Names and addresses" in doc else None,
        formatter_class=_Formatter,
    )
    parser.add_argument(
        "--service", default=DEFAULT_SERVICE, help="the webhook's Service name (RFC 1035 label)"
    )
    parser.add_argument(
        "--namespace", default=DEFAULT_NAMESPACE, help="the Service's namespace (RFC 1123 label)"
    )
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=Path("certs"),
        help="where to write the files (may be a symbolic link; the files in it may not)",
    )
    parser.add_argument(
        "--days", type=int, default=DEFAULT_DAYS, help=f"serving certificate validity, 1 to {MAX_DAYS}"
    )
    parser.add_argument(
        "--ca-days",
        type=int,
        default=DEFAULT_CA_DAYS,
        help=f"CA validity (new CA only), 1 to {MAX_CA_DAYS}, at least --days",
    )
    parser.add_argument("--key-type", choices=KEY_TYPES, default="ecdsa-p256", help="key algorithm")
    parser.add_argument(
        "--secret-name",
        default=DEFAULT_SECRET,
        help="name of the Secret in the manifest (RFC 1123 subdomain)",
    )
    parser.add_argument(
        "--dns",
        action="append",
        default=[],
        metavar="NAME",
        help="extra DNS SAN, lower case, a wildcard only as *.domain.tld (repeatable)",
    )
    parser.add_argument(
        "--ip", action="append", default=[], metavar="ADDR", help="extra IP SAN, IPv4 or IPv6 (repeatable)"
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--force", action="store_true", help="replace existing files, CA included")
    mode.add_argument(
        "--reissue",
        action="store_true",
        help="new serving certificate from the existing ca.crt/ca.key; the CA and caBundle stay",
    )
    return parser.parse_args(argv)


def _run(argv: Sequence[str] | None) -> int:
    args = parse_args(argv)
    out_dir: Path = args.output_dir
    check_subdomain("--secret-name", args.secret_name)  # before any key is made
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
    written = write(out_dir, issued, args.secret_name, args.namespace, force=args.force, reissue=args.reissue)
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


def _fail(message: str) -> int:
    """One line on stderr, whatever the message holds; the exit status of every failure."""
    line = message.replace("\r", "\\r").replace("\n", "\\n")
    print(f"{PROG}: error: {line}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; every failure is one line on stderr and exit status 2, never a traceback."""
    try:
        return _run(argv)
    except CertError as exc:
        return _fail(str(exc))
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        return _fail(f"{where}{_reason(exc)}")
    except KeyboardInterrupt:
        _fail("interrupted")
        return 130
    except Exception as exc:  # the promise is one line, not a traceback, even for a bug
        return _fail(f"unexpected {type(exc).__name__}: {exc} (please report this)")


if __name__ == "__main__":
    sys.exit(main())
