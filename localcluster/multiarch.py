"""The release's image: linux/amd64 and linux/arm64 under one OCI image index, with an SBOM per
platform and a signature, pushed and verified back (`make release`, localcluster/publish.py).

1. The amd64 image is `make image`'s very archive (localcluster/image.py: built, or reused when
   this tree built it already), so the digest users install is the one `make test` ran; the
   arm64 image is the same Dockerfile cross-built (``image.build(arch="arm64")``). With another
   base (``--base dockerfile``: CI), both are built by buildah from that base, per platform.
2. :func:`localcluster.ocilayout.compose_index` puts both archives under one index, blob for blob;
   ``skopeo copy --all --preserve-digests`` pushes it as it is (a recompressed layer would fail
   the copy, not change a digest).
3. Per platform an SPDX SBOM (localcluster/sbom.py) attested with cosign; the index signed
   (localcluster/cosign.py); then both verified back from the registry with the public key, and
   the release fails if either does not verify or an SBOM misses the product's packages.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from localcluster import cosign, ocilayout, sbom
from localcluster import image as img
from localcluster.toolcache import REPO

ARCHES = ("amd64", "arm64")
SBOM_TYPE = "spdxjson"
# What every platform's SBOM must list (checked on the verified attestation).
REQUIRED_PACKAGES = ("kube-gpu-scheduler", "kubernetes")


def say(msg: str) -> None:
    print(f"[release] {msg}", file=sys.stderr, flush=True)


@dataclass
class Pushed:
    digest: str  # the index
    platforms: dict[str, str]  # "linux/amd64" -> its manifest digest
    sboms: dict[str, str] = field(default_factory=dict)  # platform -> SBOM file
    archives: dict[str, str] = field(default_factory=dict)  # platform -> OCI archive pushed
    public_key: str = ""


def archives_for_tree(source: Path, python_image: str | None, work: Path) -> dict[str, Path]:
    """{platform: OCI archive} of ``source``'s image for each of :data:`ARCHES`."""
    if source.resolve() == REPO.resolve() and python_image is None:
        return {f"linux/{arch}": img.build(arch=arch).archive for arch in ARCHES}
    if python_image == "dockerfile":
        python_image = dockerfile_base(source / "Dockerfile")
    if python_image is not None and "@" in python_image:
        # name:tag@digest as name@digest: Debian's buildah and skopeo refuse both at once.
        python_image = f"{repository_of(python_image)}@{python_image.split('@', 1)[1]}"
    out = {}
    for arch in ARCHES:
        ref = f"localhost/gpu-scheduler:release-build-{arch}"
        args = ["bud", "--isolation", "chroot", "--layers=false", "-q"]
        if python_image is None:  # the local bases: one per platform (as `make image`)
            args += ["--build-arg", f"PYTHON_IMAGE={img.base_image(arch)}"]
            if arch != img.NATIVE_ARCH:
                args += [f"--build-arg={k}={v}" for k, v in img.cross_build_args(arch).items()]
        elif arch == img.NATIVE_ARCH:
            args += ["--build-arg", f"PYTHON_IMAGE={python_image}"]
        else:
            # A registry's multi-platform base (CI): the runtime stage on its arm64 image, by
            # digest; the build stage on the index (this machine's platform). Not --platform:
            # see localcluster/image.py cross_build_args.
            args += [
                f"--build-arg=PYTHON_IMAGE={platform_ref(python_image, arch)}",
                f"--build-arg=BUILD_PYTHON_IMAGE={python_image}",
                f"--build-arg=TARGETARCH={arch}",
                f"--build-arg=BUILDARCH={img.NATIVE_ARCH}",
            ]
        if img.HOST_CA_BUNDLE.exists():
            args += ["-v", f"{img.HOST_CA_BUNDLE}:/etc/ssl/certs/ca-certificates.crt:ro"]
        say(f"buildah bud {ref} (linux/{arch}) from {source}/Dockerfile")
        img.buildah(*args, "-t", ref, "-f", str(source / "Dockerfile"), str(source), timeout=3600)
        archive = work / f"image-{arch}.oci.tar"
        img.buildah("push", "-q", ref, f"oci-archive:{archive}:{ref}", timeout=1800)
        img.buildah("rmi", ref, check=False)
        out[f"linux/{arch}"] = archive
    return out


def dockerfile_base(dockerfile: Path) -> str:
    """The Dockerfile's default ``PYTHON_IMAGE``."""
    m = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", dockerfile.read_text(), re.M)
    if not m:
        raise ValueError(f"{dockerfile} has no default PYTHON_IMAGE")
    return m.group(1)


def platform_digest(index: dict[str, Any], arch: str, os_name: str = "linux") -> str:
    """The manifest digest of ``os_name/arch`` in an image index (an OCI index or a Docker list)."""
    found = [
        m["digest"]
        for m in index.get("manifests", [])
        if m.get("platform", {}).get("architecture") == arch and m.get("platform", {}).get("os") == os_name
    ]
    if len(found) != 1:
        raise ValueError(f"the index has {len(found)} images for {os_name}/{arch}")
    return str(found[0])


def platform_ref(ref: str, arch: str) -> str:
    """``ref``'s image for ``arch``, by digest (``skopeo inspect --raw`` of its index)."""
    host = ref.split("/", 1)[0].rsplit(":", 1)[0] if "/" in ref else ""
    tls = ["--tls-verify=false"] if host in ("127.0.0.1", "localhost", "[::1]") else []  # loopback: HTTP
    res = subprocess.run(
        [skopeo(), "inspect", *tls, "--raw", f"docker://{ref}"],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    if res.returncode != 0:
        raise RuntimeError(f"skopeo inspect {ref} failed:\n{res.stderr[-2000:]}")
    return f"{repository_of(ref)}@{platform_digest(json.loads(res.stdout), arch)}"


def repository_of(ref: str) -> str:
    """``host:5000/repo`` of ``host:5000/repo:tag@sha256:...`` (the name without tag or digest)."""
    name = ref.split("@", 1)[0]
    head, _, last = name.rpartition("/")
    return f"{head}/{last.split(':', 1)[0]}" if head else last.split(":", 1)[0]


def skopeo() -> str:
    exe = shutil.which("skopeo")
    if exe is None:
        raise FileNotFoundError("skopeo is missing: run `tools/provision.sh host` (Debian package skopeo)")
    return exe


def skopeo_push(layout: Path, tag: str, dest: str, plain_http: bool) -> None:
    res = subprocess.run(
        [
            skopeo(), "copy", "--all", "--preserve-digests", "--quiet",
            f"--dest-tls-verify={'false' if plain_http else 'true'}",
            f"oci:{layout}:{tag}", f"docker://{dest}",
        ],
        capture_output=True, text=True, check=False, timeout=1800,
    )  # fmt: skip
    if res.returncode != 0:
        raise RuntimeError(f"skopeo copy {layout} {dest} failed ({res.returncode}):\n{res.stderr[-3000:]}")


def sbom_problems(statements: list[dict[str, object]]) -> list[str]:
    """What the verified SBOM statements lack: an SPDX predicate listing :data:`REQUIRED_PACKAGES`."""
    names: set[str] = set()
    for st in statements:
        predicate = st.get("predicate")
        if isinstance(predicate, dict):
            names |= {sbom.normalize(str(p.get("name", ""))) for p in predicate.get("packages", [])}
    return [f"the SBOM lists no {name}" for name in REQUIRED_PACKAGES if name not in names]


def push_release_image(
    repository: str,
    version: str,
    plain_http: bool,
    work: Path,
    *,
    source: Path = REPO,
    python_image: str | None = None,
    revision: str | None = None,
    key: cosign.Key | None = None,
) -> Pushed:
    """Build (or reuse) both platforms' images, push them as ``repository:version``, attest the
    SBOMs, sign the index and verify both back."""
    start = time.monotonic()
    work.mkdir(parents=True, exist_ok=True)
    archives = archives_for_tree(source, python_image, work)
    annotations = {"org.opencontainers.image.version": version}
    if revision:
        annotations["org.opencontainers.image.revision"] = revision
    layout = work / "oci-layout"
    digest, platforms = ocilayout.compose_index(layout, archives, version, annotations)
    say(f"pushing {repository}:{version}: index {digest} over {json.dumps(platforms)}")
    skopeo_push(layout, version, f"{repository}:{version}", plain_http)
    shutil.rmtree(layout)
    key = key or cosign.release_key()
    pushed = Pushed(
        digest, platforms, archives={p: str(a) for p, a in archives.items()}, public_key=str(key.public)
    )
    created = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for platform, manifest in platforms.items():
        doc = sbom.document(
            f"{repository}@{manifest}", platform, sbom.image_packages(archives[platform]), created
        )
        path = work / f"sbom-{platform.replace('/', '-')}.spdx.json"
        path.write_text(json.dumps(doc, indent=1) + "\n")
        pushed.sboms[platform] = str(path)
        cosign.attest(f"{repository}@{manifest}", path, SBOM_TYPE, key, plain_http, work)
    cosign.sign(f"{repository}@{digest}", key, plain_http, work)
    verify(repository, pushed, key.public, plain_http)
    say(f"signed, attested and verified in {time.monotonic() - start:.0f}s (public key: {key.public})")
    return pushed


def verify(repository: str, pushed: Pushed, public: Path, plain_http: bool) -> None:
    """The signature of the index and each platform's SBOM attestation, read back from the
    registry and checked with ``public``; raises on the first that does not verify."""
    cosign.verify(f"{repository}@{pushed.digest}", public, plain_http)
    for platform, manifest in pushed.platforms.items():
        statements = cosign.verify_attestation(f"{repository}@{manifest}", public, SBOM_TYPE, plain_http)
        problems = sbom_problems(statements)
        if problems:
            raise RuntimeError(f"{platform}: " + "; ".join(problems))
