"""OCI image layouts and archives (the OCI image spec's on-disk form), read and composed in Python.

- :func:`archive_manifest`: the manifest descriptor of a one-image OCI archive (``buildah push
  oci-archive:``): its digest is the image's, the one a registry stores for it byte for byte.
- :func:`compose_index`: one layout holding several such images under an image index (the
  multi-architecture image), written without re-encoding a blob, so each platform's manifest
  keeps its digest.
- :func:`read_files` and :func:`unpack_rootfs`: an image's files, through its layers in order
  (whiteouts applied), for the SBOM and for running the arm64 image's Python under qemu-user.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
REF_NAME = "org.opencontainers.image.ref.name"


def blob_path(layout: Path, digest: str) -> Path:
    algo, hexdigest = digest.split(":", 1)
    return layout / "blobs" / algo / hexdigest


def _archive_member(archive: Path, name: str) -> bytes:
    with tarfile.open(archive) as tf:
        for member in tf.getmembers():
            if member.isfile() and member.name.removeprefix("./") == name:
                f = tf.extractfile(member)
                assert f is not None
                return f.read()
    raise FileNotFoundError(f"{archive} has no {name}")


def archive_manifest(archive: Path) -> dict[str, Any]:
    """The one manifest descriptor of an OCI archive's index.json (``digest``, ``size``, ...)."""
    index = json.loads(_archive_member(archive, "index.json"))
    manifests = [
        m for m in index["manifests"] if m.get("mediaType", MANIFEST_MEDIA_TYPE) == MANIFEST_MEDIA_TYPE
    ]
    if len(manifests) != 1:
        raise ValueError(f"{archive}: {len(manifests)} image manifests, not one")
    return dict(manifests[0])


def index_document(entries: list[tuple[dict[str, Any], str]], annotations: dict[str, str]) -> bytes:
    """An OCI image index over ``(manifest descriptor, "os/arch")`` entries, as canonical JSON."""
    seen: set[str] = set()
    manifests = []
    for desc, platform in entries:
        os_name, arch = platform.split("/", 1)
        if platform in seen:
            raise ValueError(f"two images for {platform}")
        seen.add(platform)
        manifests.append(
            {
                "mediaType": MANIFEST_MEDIA_TYPE,
                "digest": desc["digest"],
                "size": desc["size"],
                "platform": {"architecture": arch, "os": os_name},
            }
        )
    doc: dict[str, Any] = {"schemaVersion": 2, "mediaType": INDEX_MEDIA_TYPE, "manifests": manifests}
    if annotations:
        doc["annotations"] = dict(sorted(annotations.items()))
    return json.dumps(doc, separators=(",", ":")).encode()


def compose_index(
    layout: Path, images: dict[str, Path], tag: str, annotations: dict[str, str] | None = None
) -> tuple[str, dict[str, str]]:
    """Write an OCI layout at ``layout`` holding each archive of ``images`` ({"linux/amd64":
    archive, ...}) under one image index tagged ``tag``: (the index digest, {platform: manifest
    digest}). Blobs are copied as they are."""
    if layout.exists():
        shutil.rmtree(layout)
    (layout / "blobs" / "sha256").mkdir(parents=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    entries: list[tuple[dict[str, Any], str]] = []
    for platform, archive in images.items():
        entries.append((archive_manifest(archive), platform))
        with tarfile.open(archive) as tf:
            for member in tf.getmembers():
                name = member.name.removeprefix("./")
                if member.isfile() and name.startswith("blobs/"):
                    dest = layout / name
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    src = tf.extractfile(member)
                    assert src is not None
                    with dest.open("wb") as out:
                        shutil.copyfileobj(src, out)
    body = index_document(entries, annotations or {})
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    blob_path(layout, digest).write_bytes(body)
    top = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": INDEX_MEDIA_TYPE,
                "digest": digest,
                "size": len(body),
                "annotations": {REF_NAME: tag},
            }
        ],
    }
    (layout / "index.json").write_text(json.dumps(top))
    return digest, {platform: desc["digest"] for desc, platform in entries}


# ---------------------------------------------------------------- an image's files
def _layers(archive: Path) -> Iterator[tarfile.TarFile]:
    """The image's layer tars, lowest first."""
    with tarfile.open(archive) as outer:
        members = {m.name.removeprefix("./"): m for m in outer.getmembers() if m.isfile()}

        def blob(digest: str) -> bytes:
            f = outer.extractfile(members[f"blobs/{digest.replace(':', '/')}"])
            assert f is not None
            return f.read()

        manifest = json.loads(blob(archive_manifest(archive)["digest"]))
        for layer in manifest["layers"]:
            data = blob(layer["digest"])
            if data[:2] == b"\x1f\x8b":
                data = gzip.decompress(data)
            with tarfile.open(fileobj=io.BytesIO(data)) as tf:
                yield tf


def _whiteout(name: str) -> tuple[str, bool] | None:
    """(the path a whiteout entry removes, whether it is opaque), or None for a plain entry."""
    head, _, base = name.rpartition("/")
    if base == ".wh..wh..opq":
        return head, True
    if base.startswith(".wh."):
        return (f"{head}/{base[4:]}" if head else base[4:]), False
    return None


def read_files(archive: Path, wanted: Callable[[str], bool]) -> dict[str, bytes]:
    """The regular files of the image whose path (no leading slash) ``wanted`` accepts, as the
    container sees them (later layers win; a layer's whiteouts remove from the layers below)."""
    files: dict[str, bytes] = {}
    for tf in _layers(archive):
        members = tf.getmembers()
        for member in members:
            wo = _whiteout(member.name.removeprefix("./").rstrip("/"))
            if wo is not None:
                path, opaque = wo
                for key in [k for k in files if k.startswith(path + "/") or (k == path and not opaque)]:
                    del files[key]
        for member in members:
            name = member.name.removeprefix("./").rstrip("/")
            if _whiteout(name) is None and member.isfile() and wanted(name):
                f = tf.extractfile(member)
                assert f is not None
                files[name] = f.read()
    return files


def unpack_rootfs(archive: Path, dest: Path) -> Path:
    """The image's root filesystem unpacked at ``dest``, absolute symlinks made relative to it
    (so a host process under qemu-user ``-L dest`` follows them inside the image)."""
    dest.mkdir(parents=True, exist_ok=True)
    for tf in _layers(archive):
        members = tf.getmembers()
        for member in members:
            wo = _whiteout(member.name.removeprefix("./").rstrip("/"))
            if wo is None:
                continue
            target = dest / wo[0]
            if wo[1]:
                for child in target.iterdir() if target.is_dir() and not target.is_symlink() else []:
                    _remove(child)
            else:
                _remove(target)
        for member in members:
            name = member.name.removeprefix("./").rstrip("/")
            if _whiteout(name) is not None or member.isdev() or not name:
                continue
            if not member.isdir():
                _remove(dest / name)
            tf.extract(member, dest, numeric_owner=True, filter="fully_trusted")
    for root, dirs, files in os.walk(dest):
        for entry in dirs + files:
            p = Path(root) / entry
            if p.is_symlink() and os.readlink(p).startswith("/"):
                target = dest / os.readlink(p).lstrip("/")
                p.unlink()
                p.symlink_to(os.path.relpath(target, p.parent))
    return dest


def _remove(p: Path) -> None:
    if p.is_symlink() or p.is_file():
        p.unlink()
    elif p.is_dir():
        shutil.rmtree(p)
