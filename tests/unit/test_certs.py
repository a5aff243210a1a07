"""generate-webhook-certs.py: run as users run it (a subprocess) and imported for its functions."""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import os
import ssl
import stat
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

SCRIPT = Path(__file__).resolve().parents[2] / "generate-webhook-certs.py"


def load_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("generate_webhook_certs", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


gen = load_module()


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=False)


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
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(out / "tls.crt", out / "tls.key")
    client = ssl.create_default_context(cafile=str(out / "ca.crt"))
    for name in ("hook.gpu.svc", "localhost"):
        c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
        c = client.wrap_bio(c_in, c_out, server_hostname=name)
        s = server.wrap_bio(s_in, s_out, server_side=True)
        for _ in range(10):
            for side in (c, s):
                with contextlib.suppress(ssl.SSLWantReadError):
                    side.do_handshake()
            s_in.write(c_out.read())
            c_in.write(s_out.read())
        assert c.version() in ("TLSv1.2", "TLSv1.3"), name


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
    assert res.returncode == 1
    assert "refusing to overwrite" in res.stderr and "--force" in res.stderr and "--reissue" in res.stderr
    assert res.stdout == ""
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
    assert res.returncode == 1
    assert "--reissue needs the existing CA" in res.stderr and "ca.crt" in res.stderr


def test_reissue_refuses_a_mismatched_ca_key(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    assert run("--output-dir", str(a)).returncode == 0
    assert run("--output-dir", str(b)).returncode == 0
    (a / "ca.key").write_bytes((b / "ca.key").read_bytes())
    res = run("--output-dir", str(a), "--reissue")
    assert res.returncode == 1 and "is not the key of" in res.stderr


def test_force_and_reissue_are_exclusive(tmp_path: Path) -> None:
    res = run("--output-dir", str(tmp_path), "--force", "--reissue")
    assert res.returncode == 2 and "not allowed with" in res.stderr


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
    assert res.returncode == 1 and "--ip 'not-an-ip' is not an IP address" in res.stderr
    assert not tmp_path.joinpath("ca.crt").exists()


def test_serving_cert_never_outlives_its_ca(tmp_path: Path) -> None:
    issued = gen.issue(tmp_path, days=400, ca_days=30)
    # the CA is stretched to the serving certificate's validity rather than the other way round
    assert issued.cert.not_valid_after_utc <= issued.ca_cert.not_valid_after_utc
    assert (issued.cert.not_valid_after_utc - issued.cert.not_valid_before_utc).days >= 399


def test_service_dns_names() -> None:
    assert gen.service_dns_names("s", "n") == ["s", "s.n", "s.n.svc", "s.n.svc.cluster.local"]


def test_ca_bundle_round_trips() -> None:
    key = gen.generate_key("ecdsa-p256")
    ca = gen.make_ca(key, days=1)
    assert x509.load_pem_x509_certificate(base64.b64decode(gen.ca_bundle(ca))) == ca
