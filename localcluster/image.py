"""``make image``: the project's image, built from the Dockerfile as it is, without Docker.

1. A Debian ``minbase`` root filesystem with Python (mmdebstrap, from Debian's mirror as apt
   is configured here), cached outside the checkout and keyed by suite and package list,
   becomes a local base image (``buildah from scratch`` + the tarball).
2. ``buildah bud --isolation chroot --build-arg PYTHON_IMAGE=<that base>`` builds the
   unmodified Dockerfile (the host's CA bundle is mounted into the build's RUN steps, so pip
   reaches the package index through this machine's TLS inspection; nothing of it stays in
   the image).
3. ``buildah push`` writes an OCI archive, which the real node's containerd imports
   (localcluster/node.py); the charts then run it with ``pullPolicy: Never``. `make release`
   pushes that very archive (localcluster/multiarch.py), so users install the digest tested.

``build(arch="arm64")``: the same Dockerfile cross-built for arm64 (no emulation: the build stage
is the amd64 base, which installs the aarch64 wheels; the runtime stage runs nothing) on an arm64
base made by mmdebstrap's ``extract`` variant (its maintainer scripts cannot run here: no
binfmt_misc), which :data:`FOREIGN_HOOKS` complete as dpkg would have: the package database,
the users, the CA bundle and the standard library's byte code (compiled by the arm64 Python under
qemu-user when qemu-aarch64-static is there).

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
# The extract variant installs only what it is given (and their dependencies): what minbase
# brings that the image needs besides, the users and the C++ runtime of the manylinux wheels
# (greenlet, gevent's).
FOREIGN_EXTRA_PACKAGES = ("base-passwd", "libgcc-s1", "libstdc++6")
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
NATIVE_ARCH = "amd64"
# Debian's architecture names and QEMU's, for the foreign bases.
QEMU_ARCH = {"arm64": "aarch64"}
# mmdebstrap --variant=extract only unpacks (and runs no customize hook): these extract hooks (run on the host, "$1" is the
# root) do what the packages' maintainer scripts do that the image needs.
FOREIGN_HOOKS = (
    # dpkg's database (SBOM tools and scanners read it): each unpacked .deb as installed.
    'for d in "$1"/var/cache/apt/archives/*.deb; do dpkg-deb -f "$d"; '
    'echo "Status: install ok installed"; echo; done > "$1/var/lib/dpkg/status"',
    # base-passwd's postinst: the system users and groups.
    'cp "$1/usr/share/base-passwd/passwd.master" "$1/etc/passwd"; '
    'cp "$1/usr/share/base-passwd/group.master" "$1/etc/group"',
    # update-ca-certificates: the bundle.
    'cat "$1"/usr/share/ca-certificates/mozilla/*.crt > "$1/etc/ssl/certs/ca-certificates.crt"',
    # py3compile: the standard library's byte code, by the target's own Python.
    'q=$(command -v "qemu-$QEMU_ARCH-static" || true); if [ -n "$q" ]; then '
    '"$q" -L "$1" "$1/usr/bin/python3" -m compileall -q -j 0 -s "$1" -p / "$1/usr/lib/python3.11" >/dev/null; fi',
)
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# vfs would copy every layer: overlay is what buildah uses on these hosts.
STORAGE_DRIVER = os.environ.get("GPU_SCHEDULER_BUILDAH_DRIVER", "overlay")


def cache_dir() -> Path:
    env = os.environ.get("GPU_SCHEDULER_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpu-scheduler"


def _in_context(f: Path) -> bool:
    """What .dockerignore lets into the build context: no bytecode (Python writes it into the tree
    whenever a module is imported, so it must not change the image's key mid-run)."""
    return f.is_file() and "__pycache__" not in f.parts and f.suffix not in (".pyc", ".pyo")


def context_files() -> list[Path]:
    out: list[Path] = []
    for entry in CONTEXT:
        p = REPO / entry
        if p.is_dir():
            out += sorted(f for f in p.rglob("*") if _in_context(f))
        elif p.exists():
            out.append(p)
    # Files the Dockerfile copies from other folders (the dependency lock) join the digest too.
    for extra in dockerfile_copy_sources():
        p = REPO / extra
        if p.is_dir():
            out += sorted(f for f in p.rglob("*") if _in_context(f))
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


def base_ref(arch: str = NATIVE_ARCH) -> str:
    """The local Python base image's reference: keyed by the Debian suite and the package list
    (and, for another architecture, by it and by the hooks that complete its root)."""
    suite = versions().get("IMAGE_DEBIAN_SUITE", "bookworm")
    if arch == NATIVE_ARCH:
        key = hashlib.sha256(f"{suite} {' '.join(BASE_PACKAGES)}".encode()).hexdigest()[:10]
        return f"{REPOSITORY}/python-base:{suite}-{key}"
    spec = f"{suite} {arch} {' '.join(BASE_PACKAGES + FOREIGN_EXTRA_PACKAGES)} {FOREIGN_HOOKS}"
    return f"{REPOSITORY}/python-base:{suite}-{arch}-{hashlib.sha256(spec.encode()).hexdigest()[:10]}"


def context_digest(arch: str = NATIVE_ARCH) -> str:
    """The image's key: its build context and its base (a tag names one image, never two)."""
    h = hashlib.sha256(base_ref().encode() + b"\0")
    if arch != NATIVE_ARCH:
        h.update(base_ref(arch).encode() + b"\0")
    for f in context_files():
        h.update(str(f.relative_to(REPO)).encode() + b"\0")
        h.update(f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


@dataclass(frozen=True)
class Image:
    ref: str
    archive: Path


def image_for_tree(arch: str = NATIVE_ARCH) -> Image:
    tag = f"dev-{context_digest(arch)}" + ("" if arch == NATIVE_ARCH else f"-{arch}")
    return Image(f"{REPOSITORY}:{tag}", OUT_DIR / f"gpu-scheduler-{tag}.oci.tar")


def tree_version() -> str:
    """pyproject.toml's version: the image's org.opencontainers.image.version label."""
    import tomllib

    return str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


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


def base_image(arch: str = NATIVE_ARCH) -> str:
    """The local Python base (mmdebstrap minbase; another architecture: extract and the hooks),
    built once per suite and package list."""
    ref = base_ref(arch)
    suite = versions().get("IMAGE_DEBIAN_SUITE", "bookworm")
    if buildah("inspect", "--type", "image", ref, check=False).returncode == 0:
        return ref
    tar = cache_dir() / "image-base" / f"{ref.rsplit(':', 1)[1]}.tar"
    if not tar.exists():
        if shutil.which("mmdebstrap") is None:
            raise FileNotFoundError("mmdebstrap is missing: run `tools/provision.sh node`")
        tar.parent.mkdir(parents=True, exist_ok=True)
        tmp = tar.with_suffix(".tmp.tar")
        argv = ["mmdebstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}"]
        env = None
        if arch != NATIVE_ARCH:
            packages = BASE_PACKAGES + FOREIGN_EXTRA_PACKAGES
            argv = [
                "mmdebstrap",
                "--variant=extract",
                f"--architectures={arch}",
                f"--include={','.join(packages)}",
            ]
            argv += [f"--extract-hook={hook}" for hook in FOREIGN_HOOKS]
            env = {**os.environ, "QEMU_ARCH": QEMU_ARCH.get(arch, arch)}
        say(f"{' '.join(argv[:3])} {suite} with {','.join(BASE_PACKAGES)} (about a minute)")
        res = subprocess.run(
            [*argv, suite, str(tmp)], capture_output=True, text=True, check=False, timeout=1800, env=env
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
            "--arch",
            arch,
            "--os",
            "linux",
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


def cross_build_args(arch: str) -> dict[str, str]:
    """The build arguments of a cross build for ``arch`` on the local bases."""
    return {"TARGETARCH": arch, "BUILDARCH": NATIVE_ARCH, "BUILD_PYTHON_IMAGE": base_image()}


def build(force: bool = False, arch: str = NATIVE_ARCH) -> Image:
    """Build the image of the current tree for ``arch`` (or reuse its archive) and return it."""
    image = image_for_tree(arch)
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
    base = base_image(arch)
    mounts = []
    if HOST_CA_BUNDLE.exists():
        mounts = ["-v", f"{HOST_CA_BUNDLE}:/etc/ssl/certs/ca-certificates.crt:ro"]
    cross: list[str] = []
    if arch != NATIVE_ARCH:
        # The build stage on this machine's base; the runtime stage on the target's. Not
        # --platform: buildah 1.28 (Debian 12) then looks up the runtime stage's base for the
        # build stage's FROM --platform, and finds none; both bases are single-platform images.
        cross = [f"--build-arg={k}={v}" for k, v in cross_build_args(arch).items()]
    say(f"buildah bud {image.ref} from the Dockerfile (PYTHON_IMAGE={base})")
    buildah(
        "bud",
        "--isolation",
        "chroot",
        "--layers=false",
        "-q",
        "--build-arg",
        f"PYTHON_IMAGE={base}",
        *cross,
        "--label",
        f"org.opencontainers.image.version={tree_version()}",
        *mounts,
        "-t",
        image.ref,
        "-f",
        str(REPO / "Dockerfile"),
        str(REPO),
    )
    _write_archive(image)
    suffix = "" if arch == NATIVE_ARCH else f"-{arch}"
    for line in buildah("images", "--format", "{{.Name}}:{{.Tag}}").stdout.splitlines():
        if line.startswith(f"{REPOSITORY}:dev-") and line != image.ref and _arch_of(line) == suffix:
            buildah("rmi", line, check=False)
    say(f"built {image.ref} in {time.monotonic() - start:.0f}s: {image.archive.relative_to(REPO)}")
    return image


def _write_archive(image: Image) -> None:
    """``buildah push`` the image to its OCI archive; the older trees' archives go."""
    image.archive.parent.mkdir(parents=True, exist_ok=True)
    tmp = image.archive.with_suffix(".tmp")
    buildah("push", "-q", image.ref, f"oci-archive:{tmp}:{image.ref}")
    tmp.replace(image.archive)
    mine = _arch_of(image.archive.name.removesuffix(".oci.tar"))
    for old in image.archive.parent.glob("gpu-scheduler-*.oci.tar"):
        if old != image.archive and _arch_of(old.name.removesuffix(".oci.tar")) == mine:
            old.unlink()


def _arch_of(name: str) -> str:
    """``-arm64`` of ``...dev-<digest>-arm64``; ``""`` for the native image."""
    last = name.rsplit("-", 1)[-1]
    return f"-{last}" if last in QEMU_ARCH else ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m localcluster.image", description=__doc__.split("\n")[0])
    ap.add_argument("--force", action="store_true", help="rebuild even when the archive of this tree exists")
    ap.add_argument("--print-ref", action="store_true", help="print the image reference and archive path")
    ap.add_argument("--arch", default=NATIVE_ARCH, help="amd64 (this machine's) or arm64 (cross-built)")
    args = ap.parse_args(argv)
    image = build(force=args.force, arch=args.arch)
    if args.print_ref:
        print(image.ref)
        print(image.archive)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
