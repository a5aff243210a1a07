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
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from cryptography import x509

from kube_gpu_scheduler.certs.errors import CertError
from kube_gpu_scheduler.certs.files import SECRET_FILE, reason
from kube_gpu_scheduler.certs.issuing import DEFAULT_CA_DAYS, DEFAULT_DAYS, KEY_TYPES, ca_bundle
from kube_gpu_scheduler.certs.names import MAX_CA_DAYS, MAX_DAYS, check_subdomain
from kube_gpu_scheduler.certs.webhook_tls import (
    DEFAULT_NAMESPACE,
    DEFAULT_SECRET,
    DEFAULT_SERVICE,
    issue,
    write,
)

PROG = "generate-webhook-certs"


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
        return _fail(f"{where}{reason(exc)}")
    except KeyboardInterrupt:
        _fail("interrupted")
        return 130
    except Exception as exc:  # the promise is one line, not a traceback, even for a bug
        return _fail(f"unexpected {type(exc).__name__}: {exc} (please report this)")
