"""What a name, an address or a validity may be in a certificate this program issues; anything
else is refused with a message that says why (never rewritten)."""

from __future__ import annotations

import ipaddress
import re

from kube_gpu_scheduler.certs.errors import CertError

MAX_DAYS = 3650
MAX_CA_DAYS = 36500


# RFC 1123 label (Kubernetes' DNS-1123 label), RFC 1035 label (Kubernetes' DNS-1035 label, what
# Service names must be), and a label of Kubernetes' DNS-1123 subdomain (no per-label limit there).
_LABEL_1123 = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_LABEL_1035 = re.compile(r"[a-z]([a-z0-9-]{0,61}[a-z0-9])?")
_SUBDOMAIN_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")
MAX_DNS_NAME = 253

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


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
