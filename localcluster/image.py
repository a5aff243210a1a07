"""``make image``: the project's image, built from the Dockerfile as it is, without Docker.

1. A Debian ``minbase`` root filesystem with Python (mmdebstrap, from Debian's mirror as apt
   is configured here), cached outside the checkout and keyed by suite and package list,
   becomes a local base image (``buildah from scratch`` + the tarball).
2. ``buildah bud --isolation chroot --build-arg PYTHON_IMAGE=<that base>`` builds the
   unmodified Dockerfile (the host's CA bundle is mounted into the build's RUN steps, so pip
   reaches the package index through this machine's TLS inspection; nothing of it stays in
   the image).
3. ``buildah push`` writes an OCI archive, which the real node's containerd imports
   (localcluster/node.py); the charts then run it with ``pullPolicy: Never``.

The image's tag is a digest of its build context (the Dockerfile and every file it copies) and
of its base's name, so an unchanged tree reuses the archive, another checkout of a tree built
already writes its archive from buildah's storage, and a changed one builds a new image.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from localcluster.toolcache import REPO, versions

REPOSITORY = "localhost/gpu-scheduler"
BASE_PACKAGES = (
    "python3",
    "python3-venv",
    "python3-pip",
    "python-is-python3",
    "ca-certificates",
    "netbase",
    "tzdata",
)
# What the Dockerfile copies (tests/unit/test_image.py checks this against its COPY lines).
CONTEXT = (
    "Dockerfile",
    ".dockerignore",
    "pyproject.toml",
    "README.md",
    "LICENSE",
    "kube_gpu_scheduler",
)
OUT_DIR = REPO / "build" / "image"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# vfs would copy every layer: overlay is what buildah uses on these hosts.
STORAGE_DRIVER = os.environ.get("GPU_SCHEDULER_BUILDAH_DRIVER", "overlay")


def cache_dir() -> Path:
    env = os.environ.get("GPU_SCHEDULER_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpu-scheduler"


def context_files() -> list[Path]:
    out: list[Path] = []
    for entry in CONTEXT:
        p = REPO / entry
        if p.is_dir():
            out += sorted(
                f
                for f in p.rglob("*")
                if f.is_file() and "__pycache__" not in f.parts and f.suffix not in (".pyc", ".pyo")
            )
        elif p.exists():
            out.append(p)
    # Files the Dockerfile copies from other folders (the dependency lock) join the digest too.
    for extra in dockerfile_copy_sources():
        p = REPO / extra
        if p.is_dir():
            out += sorted(f for f in p.rglob("*") if f.is_file())
        elif p.is_file() and p not in out:
            out.append(p)
    return sorted(set(out))


def dockerfile_copy_sources(text: str | None = None) -> list[str]:
    """The build-context paths named by the Dockerfile's COPY lines (not ``COPY --from``)."""
    text = text if text is not None else (REPO / "Dockerfile").read_text()
    out: list[str] = []
    for raw in text.splitlines():
        parts = raw.split()
        if not parts or parts[0].upper() != "COPY" or any(p.startswith("--from") for p in parts):
            continue
        args = [p for p in parts[1:] if not p.startswith("--")]
        out += [a.rstrip("/") for a in args[:-1]]
    return out


def base_ref() -> str:
    """The local Python base image's reference: keyed by the Debian suite and the package list."""
    suite = versions().get("IMAGE_DEBIAN_SUITE", "bookworm")
    key = hashlib.sha256(f"{suite} {' '.join(BASE_PACKAGES)}".encode()).hexdigest()[:10]
    return f"{REPOSITORY}/python-base:{suite}-{key}"


def context_digest() -> str:
    """The image's key: its build context and its base (a tag names one image, never two)."""
    h = hashlib.sha256(base_ref().encode() + b"\0")
    for f in context_files():
        h.update(str(f.relative_to(REPO)).encode() + b"\0")
        h.update(f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


@dataclass(frozen=True)
class Image:
    ref: str
    archive: Path


def image_for_tree() -> Image:
    tag = f"dev-{context_digest()}"
    return Image(f"{REPOSITORY}:{tag}", OUT_DIR / f"gpu-scheduler-{tag}.oci.tar")


def say(msg: str) -> None:
    print(f"[image] {msg}", file=sys.stderr, flush=True)


def buildah(*args: str, check: bool = True, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("buildah")
    if exe is None:
        raise FileNotFoundError("buildah is missing: run `tools/provision.sh node` (Debian package buildah)")
    res = subprocess.run(
        [exe, f"--storage-driver={STORAGE_DRIVER}", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )
    if check and res.returncode != 0:
        raise RuntimeError(
            f"buildah {' '.join(args[:3])} ... failed ({res.returncode}):\n{res.stderr[-4000:]}"
        )
    return res


def base_image() -> str:
    """The local Python base (mmdebstrap minbase), built once per suite and package list."""
    ref = base_ref()
    suite = versions().get("IMAGE_DEBIAN_SUITE", "bookworm")
    if buildah("inspect", "--type", "image", ref, check=False).returncode == 0:
        return ref
    tar = cache_dir() / "image-base" / f"{ref.rsplit(':', 1)[1]}.tar"
    if not tar.exists():
        if shutil.which("mmdebstrap") is None:
            raise FileNotFoundError("mmdebstrap is missing: run `tools/provision.sh node`")
        tar.parent.mkdir(parents=True, exist_ok=True)
        tmp = tar.with_suffix(".tmp.tar")
        say(f"mmdebstrap --variant=minbase {suite} with {','.join(BASE_PACKAGES)} (about a minute)")
        res = subprocess.run(
            ["mmdebstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", suite, str(tmp)],
            capture_output=True,
            text=True,
            check=False,
            timeout=1800,
        )
        if res.returncode != 0:
            raise RuntimeError(f"mmdebstrap failed ({res.returncode}):\n{res.stderr[-4000:]}")
        tmp.replace(tar)
    say(f"importing the base {ref}")
    ctr = buildah("from", "scratch").stdout.strip()
    try:
        buildah("add", ctr, str(tar), "/")
        buildah(
            "config",
            "--env",
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "--env",
            "LANG=C.UTF-8",
            "--cmd",
            '["python3"]',
            ctr,
        )
        buildah("commit", "-q", ctr, ref)
    finally:
        buildah("rm", ctr, check=False)
    return ref


def build(force: bool = False) -> Image:
    """Build the image of the current tree (or reuse its archive) and return it."""
    image = image_for_tree()
    if image.archive.exists() and not force:
        say(f"{image.ref} is up to date ({image.archive.relative_to(REPO)})")
        return image
    start = time.monotonic()
    if not force and buildah("inspect", "--type", "image", image.ref, check=False).returncode == 0:
        # Built already from this very context (another checkout of the same tree: CI's clean
        # clone): only its archive is written.
        _write_archive(image)
        say(
            f"{image.ref} was built already: wrote {image.archive.relative_to(REPO)} in {time.monotonic() - start:.0f}s"
        )
        return image
    base = base_image()
    mounts = []
    if HOST_CA_BUNDLE.exists():
        mounts = ["-v", f"{HOST_CA_BUNDLE}:/etc/ssl/certs/ca-certificates.crt:ro"]
    say(f"buildah bud {image.ref} from the Dockerfile (PYTHON_IMAGE={base})")
    buildah(
        "bud",
        "--isolation",
        "chroot",
        "--layers=false",
        "-q",
        "--build-arg",
        f"PYTHON_IMAGE={base}",
        *mounts,
        "-t",
        image.ref,
        "-f",
        str(REPO / "Dockerfile"),
        str(REPO),
    )
    _write_archive(image)
    for line in buildah("images", "--format", "{{.Name}}:{{.Tag}}").stdout.splitlines():
        if line.startswith(f"{REPOSITORY}:dev-") and line != image.ref:
            buildah("rmi", line, check=False)
    say(f"built {image.ref} in {time.monotonic() - start:.0f}s: {image.archive.relative_to(REPO)}")
    return image


def _write_archive(image: Image) -> None:
    """``buildah push`` the image to its OCI archive; the older trees' archives go."""
    image.archive.parent.mkdir(parents=True, exist_ok=True)
    tmp = image.archive.with_suffix(".tmp")
    buildah("push", "-q", image.ref, f"oci-archive:{tmp}:{image.ref}")
    tmp.replace(image.archive)
    for old in image.archive.parent.glob("gpu-scheduler-*.oci.tar"):
        if old != image.archive:
            old.unlink()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m localcluster.image", description=__doc__.split("\n")[0])
    ap.add_argument("--force", action="store_true", help="rebuild even when the archive of this tree exists")
    ap.add_argument("--print-ref", action="store_true", help="print the image reference and archive path")
    args = ap.parse_args(argv)
    image = build(force=args.force)
    if args.print_ref:
        print(image.ref)
        print(image.archive)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
