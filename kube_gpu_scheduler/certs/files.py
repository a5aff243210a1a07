"""The program's files, read and written safely: never through a symbolic link, never half
written (a temporary file renamed over the old entry), private files 0600 from their creation;
and the existing CA read back for --reissue."""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from kube_gpu_scheduler.certs.errors import CertError
from kube_gpu_scheduler.certs.issuing import PrivateKey, now

# No PEM certificate or key comes near this; a larger ca.crt/ca.key is not one.
MAX_READ = 1 << 20

CA_CRT, CA_KEY, TLS_CRT, TLS_KEY = "ca.crt", "ca.key", "tls.crt", "tls.key"
SECRET_FILE = "webhook-tls-secret.yaml"  # noqa: S105 (a file name)
PRIVATE = (CA_KEY, TLS_KEY, SECRET_FILE)
PRIVATE_MODE, PUBLIC_MODE = 0o600, 0o644


def reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def open_dir(out_dir: Path, *, create: bool, missing: str = "") -> int:
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
            raise CertError(f"cannot create --output-dir {out_dir}: {reason(exc)}") from None
    try:
        return os.open(out_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise CertError(missing or f"--output-dir {out_dir} does not exist") from None
    except NotADirectoryError:
        raise CertError(f"--output-dir {out_dir} is not a directory") from None
    except OSError as exc:
        raise CertError(f"cannot open --output-dir {out_dir}: {reason(exc)}") from None


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


def existing_regular(dfd: int, out_dir: Path, name: str, verb: str) -> bool:
    """Whether ``name`` exists in the directory; CertError when it is anything but a regular file."""
    path = out_dir / name
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise CertError(f"cannot look at {path}: {reason(exc)}") from None
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
    if not existing_regular(dfd, out_dir, name, "read"):
        raise CertError(missing)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except OSError as exc:
        raise CertError(f"cannot read {path}: {reason(exc)}") from None
    with os.fdopen(fd, "rb") as f:
        try:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # replaced since we looked
                raise CertError(f"refusing to read {path}: it is not a regular file")
            data = f.read(MAX_READ + 1)
        except OSError as exc:
            raise CertError(f"cannot read {path}: {reason(exc)}") from None
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
        raise CertError(f"cannot write {out_dir / name}: {reason(exc)}") from None
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
            raise CertError(f"cannot write {out_dir / name}: {reason(exc)}") from None
        raise
    return tmp


def replace_files(dfd: int, out_dir: Path, files: dict[str, tuple[bytes, int]]) -> None:
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
                raise CertError(f"cannot replace {out_dir / name}: {reason(exc)}") from None
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
    dfd = open_dir(out_dir, create=False, missing=missing.format(crt_path))
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
    if cert.not_valid_after_utc <= now():
        raise CertError(
            f"the CA in {crt_path} expired on {cert.not_valid_after_utc:%Y-%m-%d}; make a new one with --force"
        )
    return cert, key
