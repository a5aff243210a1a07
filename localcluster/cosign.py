"""Signing and attesting a release's image with cosign and a key, and verifying both back.

- The key: ``COSIGN_KEY`` (a key file, or any reference cosign takes: ``k8s://ns/secret``,
  ``awskms://...``) with ``COSIGN_PASSWORD``, and the public key users verify with in
  ``COSIGN_PUBLIC_KEY`` (a file); without them, a key pair generated once into
  ``build/release-keys/`` (ignored by git: a local key for local registries and the tests).
- :func:`sign`: the image index (``cosign sign``); :func:`attest`: an SPDX SBOM as an in-toto
  attestation of one platform's image (``cosign attest --type spdxjson``). Both are pushed to
  the registry beside the image (Sigstore bundles, as OCI referrers).
- :func:`verify` and :func:`verify_attestation`: read back from the registry and checked with
  the public key (``cosign verify``, ``cosign verify-attestation``); a failure raises.

No transparency log and no Fulcio (keyless signing needs the internet): the signing config names
no service, and verification is offline with the key (``--insecure-ignore-tlog``). A loopback
registry is spoken to over plain HTTP (``--allow-http-registry``), only there.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localcluster.toolcache import REPO

KEY_DIR = REPO / "build" / "release-keys"
# A signing config with no service: no transparency log, no timestamp authority, no Fulcio.
SIGNING_CONFIG = {
    "mediaType": "application/vnd.dev.sigstore.signingconfig.v0.2+json",
    "caUrls": [],
    "oidcUrls": [],
    "rekorTlogUrls": [],
    "tsaUrls": [],
    "rekorTlogConfig": {"selector": "ANY"},
    "tsaConfig": {"selector": "ANY"},
}


@dataclass(frozen=True)
class Key:
    private: str  # a file or a cosign key reference
    public: Path
    password: str


def cosign_bin() -> str:
    found = shutil.which("cosign")
    if found:
        return found
    from localcluster.toolcache import tool

    return str(tool("cosign"))


def run(args: list[str], password: str = "", timeout: float = 300) -> str:
    env = {**os.environ, "COSIGN_PASSWORD": password, "COSIGN_YES": "true"}
    res = subprocess.run(
        [cosign_bin(), *args], capture_output=True, text=True, check=False, timeout=timeout, env=env
    )
    if res.returncode != 0:
        raise RuntimeError(
            f"cosign {' '.join(args[:2])} ... failed ({res.returncode}):\n{res.stderr[-3000:]}"
        )
    return res.stdout


def generate_key(folder: Path, password: str) -> Key:
    """A new key pair in ``folder`` (cosign.key, encrypted with ``password``; cosign.pub)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("cosign.key", "cosign.pub"):
        (folder / name).unlink(missing_ok=True)
    res = subprocess.run(
        [cosign_bin(), "generate-key-pair", "--output-key-prefix", str(folder / "cosign")],
        capture_output=True, text=True, check=False, timeout=120,
        env={**os.environ, "COSIGN_PASSWORD": password},
    )  # fmt: skip
    if res.returncode != 0:
        raise RuntimeError(f"cosign generate-key-pair failed:\n{res.stderr[-2000:]}")
    (folder / "cosign.key").chmod(0o600)
    return Key(str(folder / "cosign.key"), folder / "cosign.pub", password)


def release_key(folder: Path = KEY_DIR) -> Key:
    """The user's key (COSIGN_KEY, COSIGN_PASSWORD, COSIGN_PUBLIC_KEY), or the local one,
    generated on first use."""
    if os.environ.get("COSIGN_KEY"):
        public = os.environ.get("COSIGN_PUBLIC_KEY")
        if not public:
            raise SystemExit("release: COSIGN_KEY is set but COSIGN_PUBLIC_KEY (its public key file) is not")
        return Key(os.environ["COSIGN_KEY"], Path(public), os.environ.get("COSIGN_PASSWORD", ""))
    password_file = folder / "password"
    if (folder / "cosign.key").is_file() and password_file.is_file():
        return Key(str(folder / "cosign.key"), folder / "cosign.pub", password_file.read_text().strip())
    folder.mkdir(parents=True, exist_ok=True)
    password = secrets.token_urlsafe(24)
    password_file.write_text(password + "\n")
    password_file.chmod(0o600)
    return generate_key(folder, password)


def registry_flags(plain_http: bool) -> list[str]:
    return ["--allow-http-registry", "--allow-insecure-registry"] if plain_http else []


def _signing_config(folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "signing-config.json"
    path.write_text(json.dumps(SIGNING_CONFIG))
    return str(path)


def sign(ref: str, key: Key, plain_http: bool, work: Path) -> None:
    """Sign ``ref`` (by digest) and push the signature beside it."""
    run(
        [
            "sign",
            "--key",
            key.private,
            "--signing-config",
            _signing_config(work),
            *registry_flags(plain_http),
            ref,
        ],
        key.password,
    )


def attest(ref: str, predicate: Path, predicate_type: str, key: Key, plain_http: bool, work: Path) -> None:
    """Attest ``predicate`` (an SBOM) of ``ref`` (by digest), pushed beside it."""
    run(
        [
            "attest", "--key", key.private, "--type", predicate_type, "--predicate", str(predicate),
            "--signing-config", _signing_config(work), *registry_flags(plain_http), ref,
        ],
        key.password,
    )  # fmt: skip


def verify(ref: str, public: Path, plain_http: bool) -> list[dict[str, Any]]:
    """``cosign verify`` of ``ref`` with ``public``: the verified signatures' payloads."""
    out = run(["verify", "--key", str(public), "--insecure-ignore-tlog", *registry_flags(plain_http), ref])
    payloads: list[dict[str, Any]] = []
    for line in out.splitlines():
        if line.strip().startswith(("{", "[")):
            doc = json.loads(line)
            payloads += doc if isinstance(doc, list) else [doc]
    return payloads


def verify_attestation(ref: str, public: Path, predicate_type: str, plain_http: bool) -> list[dict[str, Any]]:
    """``cosign verify-attestation`` of ``ref``: the verified in-toto statements."""
    out = run(
        [
            "verify-attestation", "--key", str(public), "--type", predicate_type, "--insecure-ignore-tlog",
            *registry_flags(plain_http), ref,
        ]
    )  # fmt: skip
    statements = []
    for line in out.splitlines():
        if line.strip().startswith("{"):
            envelope = json.loads(line)
            payload = envelope.get("payload")
            statements.append(json.loads(base64.b64decode(payload)) if payload else envelope)
    return statements
