"""generate-webhook-certs.py: run as users run it (a subprocess), and its program
``kube_gpu_scheduler.certs`` imported for its functions."""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import os
import ssl
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from kube_gpu_scheduler import certs as gen
from kube_gpu_scheduler.certs import cli as certs_cli

SCRIPT = Path(__file__).resolve().parents[3] / "generate-webhook-certs.py"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("generate_webhook_certs", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=False, timeout=120
    )


def handshake(out: Path, name: str) -> str | None:
    """A TLS handshake in memory with the files in ``out``, the client verifying ``name``; its version."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(out / "tls.crt", out / "tls.key")
    client = ssl.create_default_context(cafile=str(out / "ca.crt"))
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    c = client.wrap_bio(c_in, c_out, server_hostname=name)
    s = server.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):
        for side in (c, s):
            with contextlib.suppress(ssl.SSLWantReadError):
                side.do_handshake()
        s_in.write(c_out.read())
        c_in.write(s_out.read())
    return c.version()


def assert_one_line_error(res: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """The promise for every failure: exit 2, one line on stderr, no traceback, nothing on stdout."""
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert "Traceback" not in res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("generate-webhook-certs: error: "), lines[0]
    assert res.stdout == ""
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def snapshot(directory: Path) -> dict[str, tuple[str, bytes | str]]:
    """Every entry of ``directory``: a link as its target, a file as its bytes (never followed)."""
    entries: dict[str, tuple[str, bytes | str]] = {}
    for p in directory.iterdir():
        if p.is_symlink():
            entries[p.name] = ("link", os.readlink(p))
        elif p.is_file():
            entries[p.name] = ("file", p.read_bytes())
        else:
            entries[p.name] = ("other", "")
    return entries


def cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def sans(c: x509.Certificate) -> tuple[list[str], list[str]]:
    ext = c.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return list(ext.get_values_for_type(x509.DNSName)), [
        str(i) for i in ext.get_values_for_type(x509.IPAddress)
    ]


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    out = tmp_path_factory.mktemp("gen") / "certs"
    res = run(
        "--output-dir",
        str(out),
        "--service",
        "hook",
        "--namespace",
        "gpu",
        "--ip",
        "127.0.0.1",
        "--dns",
        "localhost",
    )
    assert res.returncode == 0, res.stderr
    return out, res


def test_script_is_executable_with_a_python3_shebang() -> None:
    assert SCRIPT.read_text().startswith("#!/usr/bin/env python3\n")
    assert os.access(SCRIPT, os.X_OK)


def test_the_script_is_the_program_of_its_checkout() -> None:
    """The documented script is a thin wrapper: its ``main`` is kube_gpu_scheduler.certs', which it
    finds beside itself (a checkout, the package not installed: no site, no .pth, no editable
    install; only the interpreter's third-party packages on PYTHONPATH)."""
    assert load_script().main is certs_cli.main
    assert len(SCRIPT.read_text().splitlines()) < 50
    site_packages = next(p for p in sys.path if p.endswith("site-packages") and Path(p, "yaml").is_dir())
    assert not Path(site_packages, "kube_gpu_scheduler").exists()  # only the checkout's can answer
    res = subprocess.run(
        [sys.executable, "-S", str(SCRIPT), "--help"],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": site_packages},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("usage: generate-webhook-certs.py")
    assert res.stdout == run("--help").stdout


def test_files_and_modes(generated: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, _ = generated
    assert sorted(p.name for p in out.iterdir()) == [
        "ca.crt",
        "ca.key",
        "tls.crt",
        "tls.key",
        "webhook-tls-secret.yaml",
    ]
    for name in ("ca.key", "tls.key", "webhook-tls-secret.yaml"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o600, name
    for name in ("ca.crt", "tls.crt"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o644, name


def test_sans(generated: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, _ = generated
    dns, ips = sans(cert(out / "tls.crt"))
    assert dns == ["hook", "hook.gpu", "hook.gpu.svc", "hook.gpu.svc.cluster.local", "localhost"]
    assert ips == ["127.0.0.1"]


def test_stdout_is_only_the_ca_bundle(generated: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, res = generated
    assert res.stdout.strip() == base64.b64encode((out / "ca.crt").read_bytes()).decode()
    assert len(res.stdout.splitlines()) == 1
    assert "wrote" in res.stderr and "hook.gpu.svc" in res.stderr


def test_chain_verifies_and_serves_tls(generated: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, _ = generated
    ca, leaf = cert(out / "ca.crt"), cert(out / "tls.crt")
    leaf.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert x509.oid.ExtendedKeyUsageOID.SERVER_AUTH in eku
    # and OpenSSL agrees: a real handshake in memory, verifying the name against the SANs
    for name in ("hook.gpu.svc", "localhost"):
        assert handshake(out, name) in ("TLSv1.2", "TLSv1.3"), name


def test_secret_manifest(generated: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, _ = generated
    secret = yaml.safe_load((out / "webhook-tls-secret.yaml").read_text())
    assert secret["kind"] == "Secret" and secret["type"] == "kubernetes.io/tls"
    assert secret["metadata"] == {
        "name": "gpu-scheduler-webhook-tls",
        "namespace": "gpu",
        "labels": {"app.kubernetes.io/name": "gpu-scheduler", "app.kubernetes.io/component": "webhook"},
    }
    for key, path in (("tls.crt", "tls.crt"), ("tls.key", "tls.key"), ("ca.crt", "ca.crt")):
        assert base64.b64decode(secret["data"][key]) == (out / path).read_bytes()


def test_refuses_to_overwrite_without_force(generated: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, _ = generated
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    res = run("--output-dir", str(out))
    assert_one_line_error(res, "refusing to overwrite", "--force", "--reissue")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_force_replaces_the_ca(tmp_path: Path) -> None:
    assert run("--output-dir", str(tmp_path)).returncode == 0
    old_ca = (tmp_path / "ca.crt").read_bytes()
    res = run("--output-dir", str(tmp_path), "--force")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "ca.crt").read_bytes() != old_ca


def test_reissue_keeps_the_ca_and_the_bundle(tmp_path: Path) -> None:
    first = run("--output-dir", str(tmp_path))
    assert first.returncode == 0
    ca_crt, ca_key = (tmp_path / "ca.crt").read_bytes(), (tmp_path / "ca.key").read_bytes()
    old_leaf = cert(tmp_path / "tls.crt")
    os.chmod(tmp_path / "tls.key", 0o644)  # a sloppy copy; re-issuing must tighten it again
    res = run("--output-dir", str(tmp_path), "--reissue", "--days", "30", "--dns", "extra.example")
    assert res.returncode == 0, res.stderr
    assert res.stdout == first.stdout  # same caBundle: webhook configurations need no change
    assert (tmp_path / "ca.crt").read_bytes() == ca_crt and (tmp_path / "ca.key").read_bytes() == ca_key
    leaf = cert(tmp_path / "tls.crt")
    assert leaf.serial_number != old_leaf.serial_number
    leaf.verify_directly_issued_by(cert(tmp_path / "ca.crt"))
    assert "extra.example" in sans(leaf)[0]
    assert 29 <= (leaf.not_valid_after_utc - leaf.not_valid_before_utc).days <= 30
    assert stat.S_IMODE((tmp_path / "tls.key").stat().st_mode) == 0o600


def test_reissue_without_a_ca_fails_clearly(tmp_path: Path) -> None:
    res = run("--output-dir", str(tmp_path), "--reissue")
    assert_one_line_error(res, "--reissue needs the existing CA", "ca.crt")
    res = run("--output-dir", str(tmp_path / "missing"), "--reissue")
    assert_one_line_error(res, "--reissue needs the existing CA", "ca.crt")


def test_reissue_refuses_a_mismatched_ca_key(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    assert run("--output-dir", str(a)).returncode == 0
    assert run("--output-dir", str(b)).returncode == 0
    (a / "ca.key").write_bytes((b / "ca.key").read_bytes())
    res = run("--output-dir", str(a), "--reissue")
    assert_one_line_error(res, "is not the key of")


def test_force_and_reissue_are_exclusive(tmp_path: Path) -> None:
    res = run("--output-dir", str(tmp_path), "--force", "--reissue")
    assert_one_line_error(res, "not allowed with")


@pytest.mark.parametrize(
    ("key_type", "kind", "size"),
    [
        ("ecdsa-p256", ec.EllipticCurvePrivateKey, 256),
        ("ecdsa-p384", ec.EllipticCurvePrivateKey, 384),
        ("rsa-2048", rsa.RSAPrivateKey, 2048),
    ],
)
def test_key_types(tmp_path: Path, key_type: str, kind: type, size: int) -> None:
    issued = gen.issue(tmp_path, key_type=key_type, ips=["::1"])
    assert isinstance(issued.key, kind) and issued.key.key_size == size
    assert isinstance(issued.ca_key, kind)
    issued.cert.verify_directly_issued_by(issued.ca_cert)
    assert sans(issued.cert)[1] == ["::1"]
    gen.write(tmp_path, issued, "s", "ns")
    loaded = serialization.load_pem_private_key((tmp_path / "tls.key").read_bytes(), password=None)
    assert loaded.public_key().public_numbers() == issued.key.public_key().public_numbers()


def test_rsa_key_type_from_the_command_line(tmp_path: Path) -> None:
    assert run("--output-dir", str(tmp_path), "--key-type", "rsa-2048").returncode == 0
    key = serialization.load_pem_private_key((tmp_path / "tls.key").read_bytes(), password=None)
    assert isinstance(key, rsa.RSAPrivateKey) and key.key_size == 2048
    ku = cert(tmp_path / "tls.crt").extensions.get_extension_for_class(x509.KeyUsage).value
    assert ku.key_encipherment and ku.digital_signature


def test_bad_ip_is_a_clear_error(tmp_path: Path) -> None:
    res = run("--output-dir", str(tmp_path), "--ip", "not-an-ip")
    assert_one_line_error(res, "--ip 'not-an-ip' is not an IP address")
    assert not tmp_path.joinpath("ca.crt").exists()


def test_serving_cert_never_outlives_its_ca(tmp_path: Path) -> None:
    # refused, neither the CA stretched nor the serving certificate shortened behind the user's back
    with pytest.raises(gen.CertError, match="--days 400 is longer than --ca-days 30"):
        gen.issue(tmp_path, days=400, ca_days=30)
    issued = gen.issue(tmp_path, days=30, ca_days=30)
    assert issued.cert.not_valid_after_utc <= issued.ca_cert.not_valid_after_utc
    assert (issued.cert.not_valid_after_utc - issued.cert.not_valid_before_utc).days >= 29


def test_service_dns_names() -> None:
    assert gen.service_dns_names("s", "n") == ["s", "s.n", "s.n.svc", "s.n.svc.cluster.local"]


def test_ca_bundle_round_trips() -> None:
    key = gen.generate_key("ecdsa-p256")
    ca = gen.make_ca(key, days=1)
    assert x509.load_pem_x509_certificate(base64.b64decode(gen.ca_bundle(ca))) == ca


# ---------------------------------------------------------------------------- files: links and the like

FILES = ("ca.crt", "ca.key", "tls.crt", "tls.key", "webhook-tls-secret.yaml")


def fresh(tmp_path: Path) -> Path:
    out = tmp_path / "certs"
    res = run("--output-dir", str(out))
    assert res.returncode == 0, res.stderr
    return out


def no_temp_files(out: Path) -> bool:
    return not [p for p in out.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("mode", ["--force", "--reissue"])
@pytest.mark.parametrize("name", FILES)
def test_a_symlinked_file_is_refused_and_its_target_untouched(tmp_path: Path, name: str, mode: str) -> None:
    out = fresh(tmp_path)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious, not a key\n")
    # ca.key with --reissue: the CA is only read, but a link there is refused all the same
    (out / name).unlink()
    (out / name).symlink_to(victim)
    before = snapshot(out)
    res = run("--output-dir", str(out), mode)
    assert_one_line_error(res, f"{out / name}", "symbolic link")
    assert victim.read_bytes() == b"precious, not a key\n"
    assert snapshot(out) == before  # nothing written, not even the other files


def test_a_dangling_symlink_is_not_created_through(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    out.mkdir()
    target = tmp_path / "elsewhere" / "stolen.key"
    target.parent.mkdir()
    (out / "tls.key").symlink_to(target)
    res = run("--output-dir", str(out))  # no flag at all: there was no existing *file*
    assert_one_line_error(res, "tls.key", "symbolic link")
    assert not target.exists()
    assert sorted(p.name for p in out.iterdir()) == ["tls.key"]


def test_a_directory_or_a_fifo_where_a_file_goes_is_refused(tmp_path: Path) -> None:
    out = fresh(tmp_path)
    (out / "tls.key").unlink()
    (out / "tls.key").mkdir()
    assert_one_line_error(run("--output-dir", str(out), "--force"), "tls.key", "a directory")
    (out / "tls.key").rmdir()
    os.mkfifo(out / "tls.key")
    # a FIFO would block a naive open(); the run must end (run() has a timeout) with a refusal
    assert_one_line_error(run("--output-dir", str(out), "--reissue"), "tls.key", "named pipe")
    (out / "tls.key").unlink()
    (out / "ca.key").unlink()
    os.mkfifo(out / "ca.key")
    assert_one_line_error(run("--output-dir", str(out), "--reissue"), "ca.key", "named pipe")
    assert no_temp_files(out)


def test_files_are_replaced_not_rewritten_in_place(tmp_path: Path) -> None:
    out = fresh(tmp_path)
    backup = tmp_path / "tls.key.backup"
    os.link(out / "tls.key", backup)  # a hard link shares the inode: writing in place would change it
    old = backup.read_bytes()
    assert run("--output-dir", str(out), "--reissue").returncode == 0
    assert backup.read_bytes() == old
    assert (out / "tls.key").read_bytes() != old
    assert (out / "tls.key").stat().st_ino != backup.stat().st_ino
    assert no_temp_files(out)


def test_modes_hold_whatever_the_umask(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    res = subprocess.run(
        ["sh", "-c", 'umask 077 && exec "$0" "$1" --output-dir "$2"', sys.executable, str(SCRIPT), str(out)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o700  # a directory the script made
    for name in FILES:
        want = 0o600 if name in ("ca.key", "tls.key", "webhook-tls-secret.yaml") else 0o644
        assert stat.S_IMODE((out / name).stat().st_mode) == want, name


def test_a_symlinked_output_dir_is_followed(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    res = run("--output-dir", str(tmp_path / "link"))
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in real.iterdir()) == sorted(FILES)
    cert(real / "tls.crt").verify_directly_issued_by(cert(real / "ca.crt"))


def unusable_output_dir(tmp_path: Path, kind: str) -> Path:
    if kind == "long-name":
        return tmp_path / ("x" * 300)
    if kind == "dangling-link":
        (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
        return tmp_path / "dangling"
    (tmp_path / "f").write_text("x")
    return tmp_path / "f" if kind == "a-file" else tmp_path / "f" / "certs"


@pytest.mark.parametrize(
    ("kind", "fragment"),
    [
        ("a-file", "exists and is not a directory"),
        ("under-a-file", "Not a directory"),
        ("dangling-link", "link to a missing directory"),
        ("long-name", "File name too long"),
    ],
)
def test_an_unusable_output_dir_is_one_line(tmp_path: Path, kind: str, fragment: str) -> None:
    out = unusable_output_dir(tmp_path, kind)
    assert_one_line_error(run("--output-dir", str(out)), str(out), fragment)


def test_a_failure_while_replacing_leaves_no_temporary_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real_replace = os.replace
    calls = []

    def flaky(*args: object, **kwargs: object) -> None:
        calls.append(args)
        if len(calls) == 2:
            raise OSError(5, "Input/output error")
        real_replace(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", flaky)
    assert gen.main(["--output-dir", str(tmp_path)]) == 2
    err = capsys.readouterr()
    assert err.out == "" and err.err.count("\n") == 1
    assert err.err.startswith("generate-webhook-certs: error: cannot replace ") and "ca.key" in err.err
    assert no_temp_files(tmp_path)


@pytest.mark.parametrize(
    ("exc", "line"),
    [
        (PermissionError(13, "Permission denied", "/some/where"), "/some/where: Permission denied"),
        (OSError(28, "No space left on device"), "No space left on device"),
        (RuntimeError("a bug"), "unexpected RuntimeError: a bug (please report this)"),
        (gen.CertError("two\nlines"), "two\\nlines"),
    ],
)
def test_the_top_level_guard(
    exc: BaseException, line: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def boom(*args: object, **kwargs: object) -> None:
        raise exc

    monkeypatch.setattr(certs_cli, "issue", boom)
    assert gen.main(["--output-dir", "unused"]) == 2
    err = capsys.readouterr()
    assert err.out == ""
    assert err.err == f"generate-webhook-certs: error: {line}\n"


# ---------------------------------------------------------------------------- the existing CA on --reissue


def encrypted_key(_: Path) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    )


@pytest.mark.parametrize(
    ("name", "content", "fragment"),
    [
        ("ca.crt", lambda out: b"garbage\n", "does not hold a PEM certificate"),
        ("ca.crt", lambda out: b"", "does not hold a PEM certificate"),
        (
            "ca.crt",
            lambda out: b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
            "does not hold a PEM certificate",
        ),
        ("ca.crt", lambda out: (out / "tls.crt").read_bytes(), "is not a CA certificate"),
        ("ca.crt", lambda out: b"x" * (2 << 20), "larger than"),
        ("ca.key", lambda out: b"garbage\n", "does not hold a PEM private key"),
        ("ca.key", lambda out: (out / "ca.crt").read_bytes(), "does not hold a PEM private key"),
        ("ca.key", encrypted_key, "is encrypted"),
        ("ca.key", lambda out: (out / "tls.key").read_bytes(), "is not the key of"),
        ("ca.key", None, "--reissue needs the existing CA"),
    ],
    ids=[
        "garbage-crt",
        "empty-crt",
        "bad-der-crt",
        "leaf-as-ca",
        "huge-crt",
        "garbage-key",
        "crt-as-key",
        "encrypted-key",
        "other-key",
        "missing-key",
    ],
)
def test_a_bad_ca_on_reissue_is_one_line(
    tmp_path: Path, name: str, content: Callable[[Path], bytes] | None, fragment: str
) -> None:
    out = fresh(tmp_path)
    if content is None:
        (out / name).unlink()
    else:
        (out / name).write_bytes(content(out))
    before = snapshot(out)
    line = assert_one_line_error(run("--output-dir", str(out), "--reissue"), fragment)
    assert name in line
    assert snapshot(out) == before


# ---------------------------------------------------------------------------- names and addresses

SERVICE_NAMES = ["hook", "hook.gpu", "hook.gpu.svc", "hook.gpu.svc.cluster.local"]
LABEL63 = "a" * 63
NAME253 = ".".join([LABEL63, LABEL63, LABEL63, "b" * 61])


@pytest.mark.parametrize(
    "name",
    [
        "localhost",
        "example.com",
        "*.example.com",
        "*.hook.gpu.svc",
        "a-b.c0.example",
        "0ne.example",
        "xn--bcher-kva.example",
        f"{LABEL63}.example",
        NAME253,
    ],
)
def test_valid_dns_names_end_up_in_the_certificate(tmp_path: Path, name: str) -> None:
    assert len(NAME253) == 253
    res = run("--output-dir", str(tmp_path), "--service", "hook", "--namespace", "gpu", "--dns", name)
    assert res.returncode == 0, res.stderr
    leaf = cert(tmp_path / "tls.crt")
    leaf.verify_directly_issued_by(cert(tmp_path / "ca.crt"))
    assert sans(leaf) == ([*SERVICE_NAMES, name], [])
    host = name.replace("*", "any", 1)  # a wildcard matches one label
    assert handshake(tmp_path, host) in ("TLSv1.2", "TLSv1.3"), host


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("*", "at least two labels after it"),
        ("*.com", "at least two labels after it"),
        ("*.", "no trailing dot"),
        ("a.*.b", "only as the whole left-most label"),
        ("f*o.com", "only as the whole left-most label"),
        ("*foo.example.com", "only as the whole left-most label"),
        ("**.example.com", "only as the whole left-most label"),
        ("*.*.example.com", "only as the whole left-most label"),
        ("bad name", "may hold only a-z, 0-9 and '-'"),
        ("a_b.example", "may hold only a-z, 0-9 and '-'"),
        ("-a.example", "may not start or end with '-'"),
        ("a-.example", "may not start or end with '-'"),
        ("", "cannot be empty"),
        ("a..b", "empty label"),
        (".a.example", "empty label"),
        ("a.example.", "no trailing dot"),
        ("Foo.example", "use 'foo.example'"),
        ("exämple.com", "only ASCII"),
        ("a" * 64 + ".example", "at most 63"),
        (NAME253 + "c", "at most 253"),
        ("10.0.0.1", "pass addresses with --ip"),
        ("foo.123", "pass addresses with --ip"),
        ("a\nb.example", "a\\nb.example"),
    ],
)
def test_invalid_dns_names_are_refused(tmp_path: Path, name: str, fragment: str) -> None:
    # --dns=NAME: argparse would take a NAME that starts with '-' for an option
    assert_one_line_error(run("--output-dir", str(tmp_path), f"--dns={name}"), "--dns ", fragment)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("addr", "want"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("::1", "::1"),
        ("2001:DB8::1", "2001:db8::1"),
        ("::ffff:10.0.0.1", "::ffff:a00:1"),
    ],
)
def test_valid_ips_end_up_in_the_certificate(tmp_path: Path, addr: str, want: str) -> None:
    res = run("--output-dir", str(tmp_path), "--ip", addr, "--ip", addr)  # and duplicates once
    assert res.returncode == 0, res.stderr
    assert sans(cert(tmp_path / "tls.crt"))[1] == [want]


@pytest.mark.parametrize(
    ("addr", "fragment"),
    [
        ("not-an-ip", "is not an IP address"),
        ("256.1.1.1", "is not an IP address"),
        ("1.2.3", "is not an IP address"),
        ("127.000.000.001", "is not an IP address"),
        (" 127.0.0.1", "is not an IP address"),
        ("", "is not an IP address"),
        ("0.0.0.0", "unspecified address"),
        ("::", "unspecified address"),
        ("fe80::1%eth0", "zone"),
    ],
)
def test_invalid_ips_are_refused(tmp_path: Path, addr: str, fragment: str) -> None:
    assert_one_line_error(run("--output-dir", str(tmp_path), f"--ip={addr}"), "--ip ", fragment)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("option", "value", "fragment"),
    [
        ("--service", "1hook", "not an RFC 1035 label"),
        ("--service", "Hook", "use 'hook'"),
        ("--service", "hook_1", "not an RFC 1035 label"),
        ("--service", "-hook", "not an RFC 1035 label"),
        ("--service", "hook-", "not an RFC 1035 label"),
        ("--service", "hook.gpu", "not an RFC 1035 label"),
        ("--service", "h" * 64, "not an RFC 1035 label"),
        ("--service", "", "not an RFC 1035 label"),
        ("--namespace", "Gpu", "use 'gpu'"),
        ("--namespace", "gpu.system", "not an RFC 1123 label"),
        ("--namespace", "-gpu", "not an RFC 1123 label"),
        ("--namespace", "g" * 64, "not an RFC 1123 label"),
        ("--namespace", "", "not an RFC 1123 label"),
        ("--secret-name", "Tls", "use 'tls'"),
        ("--secret-name", "a_b", "not an RFC 1123 subdomain"),
        ("--secret-name", "a..b", "not an RFC 1123 subdomain"),
        ("--secret-name", "-a", "not an RFC 1123 subdomain"),
        ("--secret-name", "s" * 254, "not an RFC 1123 subdomain"),
        ("--secret-name", "", "not an RFC 1123 subdomain"),
    ],
)
def test_invalid_kubernetes_names_are_refused(tmp_path: Path, option: str, value: str, fragment: str) -> None:
    assert_one_line_error(run("--output-dir", str(tmp_path), f"{option}={value}"), f"{option} ", fragment)
    assert list(tmp_path.iterdir()) == []


def test_longest_kubernetes_names_make_a_loadable_certificate(tmp_path: Path) -> None:
    service, namespace, secret = "s" + "v" * 62, "0" + "n" * 62, "x" * 253
    res = run(
        "--output-dir", str(tmp_path), "--service", service, "--namespace", namespace, "--secret-name", secret
    )
    assert res.returncode == 0, res.stderr
    leaf = cert(tmp_path / "tls.crt")
    assert sans(leaf)[0] == gen.service_dns_names(service, namespace)
    # <svc>.<ns>.svc does not fit a commonName's 64 characters; the Service name does
    assert leaf.subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)[0].value == service
    assert yaml.safe_load((tmp_path / "webhook-tls-secret.yaml").read_text())["metadata"]["name"] == secret


def test_common_name_is_the_service_name_in_the_cluster(
    generated: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    out, _ = generated
    leaf = cert(out / "tls.crt")
    assert leaf.subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)[0].value == "hook.gpu.svc"


# ---------------------------------------------------------------------------- validity


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--days", "0"), "--days 0 is out of range"),
        (("--days", "-1"), "--days -1 is out of range"),
        (("--days", "3651"), "--days 3651 is out of range"),
        (("--days", "10000000"), "--days 10000000 is out of range"),
        (("--days", "x"), "invalid int value"),
        (("--days", "1.5"), "invalid int value"),
        (("--ca-days", "0"), "--ca-days 0 is out of range"),
        (("--ca-days", "36501"), "--ca-days 36501 is out of range"),
        (("--ca-days", "99999999999"), "--ca-days 99999999999 is out of range"),
        (("--days", "400", "--ca-days", "30"), "--days 400 is longer than --ca-days 30"),
        (("--days", "10000000", "--reissue"), "--days 10000000 is out of range"),
    ],
)
def test_days_out_of_bounds(tmp_path: Path, args: tuple[str, ...], fragment: str) -> None:
    assert_one_line_error(run("--output-dir", str(tmp_path), *args), fragment)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("days", "ca_days"), [("1", "1"), ("3650", "3650"), ("3650", "36500")])
def test_days_at_the_bounds(tmp_path: Path, days: str, ca_days: str) -> None:
    res = run("--output-dir", str(tmp_path), "--days", days, "--ca-days", ca_days)
    assert res.returncode == 0, res.stderr
    leaf, ca = cert(tmp_path / "tls.crt"), cert(tmp_path / "ca.crt")
    backdate = gen.BACKDATE.total_seconds()
    assert (
        abs(
            (leaf.not_valid_after_utc - leaf.not_valid_before_utc).total_seconds()
            - int(days) * 86400
            - backdate
        )
        < 60
    )
    assert (
        abs(
            (ca.not_valid_after_utc - ca.not_valid_before_utc).total_seconds()
            - int(ca_days) * 86400
            - backdate
        )
        < 60
    )
    assert leaf.not_valid_after_utc <= ca.not_valid_after_utc


def test_reissue_may_not_outlive_the_existing_ca(tmp_path: Path) -> None:
    assert run("--output-dir", str(tmp_path), "--ca-days", "10", "--days", "5").returncode == 0
    before = snapshot(tmp_path)
    # the CA has 9 days and some hours left: 9 whole days fit, the default 365 do not
    assert_one_line_error(
        run("--output-dir", str(tmp_path), "--reissue"),
        "--days 365 would outlive the CA",
        "--days 9 or less",
        "--force",
    )
    assert snapshot(tmp_path) == before
    res = run("--output-dir", str(tmp_path), "--reissue", "--days", "9")
    assert res.returncode == 0, res.stderr
    assert cert(tmp_path / "tls.crt").not_valid_after_utc <= cert(tmp_path / "ca.crt").not_valid_after_utc


def test_help_states_the_rules() -> None:
    res = run("--help")
    assert res.returncode == 0 and res.stderr == ""
    for rule in (
        "*.example.com",
        "RFC 1035",
        "RFC 1123",
        "3650",
        "36500",
        "symbolic link",
        "exactly one line",
    ):
        assert rule in res.stdout, rule
