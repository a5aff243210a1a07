"""The release's pure parts: the OCI index over two archives (blobs and digests kept), an image's
files through its layers (whiteouts applied), the SPDX SBOM's packages, and the check of a
verified SBOM (localcluster/ocilayout.py, sbom.py, multiarch.py). The release itself, pushed,
signed and verified against a real registry: tests/node/test_release_registry.py."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from localcluster import ocilayout, sbom
from localcluster.multiarch import dockerfile_base, platform_digest, repository_of, sbom_problems
from localcluster.toolcache import REPO


def _tar(files: dict[str, bytes | None]) -> bytes:
    """A tar of ``files`` (None: a directory)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tf.addfile(info)
            else:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _blob(blobs: dict[str, bytes], data: bytes) -> dict[str, object]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[f"blobs/sha256/{digest[7:]}"] = data
    return {"digest": digest, "size": len(data)}


def oci_archive(path: Path, layers: list[dict[str, bytes | None]], arch: str) -> Path:
    """A one-image OCI archive as ``buildah push oci-archive:`` writes it (gzip layers)."""
    blobs: dict[str, bytes] = {}
    descs = [
        {
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            **_blob(blobs, gzip.compress(_tar(layer), mtime=0)),
        }
        for layer in layers
    ]
    config = {
        "mediaType": "application/vnd.oci.image.config.v1+json",
        **_blob(blobs, json.dumps({"architecture": arch}).encode()),
    }
    manifest = json.dumps(
        {"schemaVersion": 2, "mediaType": ocilayout.MANIFEST_MEDIA_TYPE, "config": config, "layers": descs}
    ).encode()
    mdesc = {"mediaType": ocilayout.MANIFEST_MEDIA_TYPE, **_blob(blobs, manifest)}
    index = json.dumps({"schemaVersion": 2, "manifests": [mdesc]}).encode()
    path.write_bytes(_tar({"oci-layout": b'{"imageLayoutVersion":"1.0.0"}', "index.json": index, **blobs}))
    return path


def test_the_index_keeps_each_platforms_manifest_and_blobs_byte_for_byte(tmp_path: Path) -> None:
    amd = oci_archive(tmp_path / "amd.tar", [{"bin/": None, "bin/x": b"amd64"}], "amd64")
    arm = oci_archive(tmp_path / "arm.tar", [{"bin/x": b"arm64"}], "arm64")
    digest, platforms = ocilayout.compose_index(
        tmp_path / "layout",
        {"linux/amd64": amd, "linux/arm64": arm},
        "1.2.3",
        {"org.opencontainers.image.version": "1.2.3"},
    )
    assert platforms == {
        "linux/amd64": ocilayout.archive_manifest(amd)["digest"],
        "linux/arm64": ocilayout.archive_manifest(arm)["digest"],
    }
    assert platforms["linux/amd64"] != platforms["linux/arm64"]
    layout = tmp_path / "layout"
    body = ocilayout.blob_path(layout, digest).read_bytes()
    assert "sha256:" + hashlib.sha256(body).hexdigest() == digest
    index = json.loads(body)
    assert index["mediaType"] == ocilayout.INDEX_MEDIA_TYPE
    assert [
        (m["platform"]["os"], m["platform"]["architecture"], m["digest"]) for m in index["manifests"]
    ] == [
        ("linux", "amd64", platforms["linux/amd64"]),
        ("linux", "arm64", platforms["linux/arm64"]),
    ]
    assert index["annotations"] == {"org.opencontainers.image.version": "1.2.3"}
    top = json.loads((layout / "index.json").read_text())
    assert top["manifests"][0]["digest"] == digest
    assert top["manifests"][0]["annotations"][ocilayout.REF_NAME] == "1.2.3"
    # Every blob of both archives is there, under its own digest.
    for blob in (layout / "blobs" / "sha256").iterdir():
        assert hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name


def test_two_images_for_one_platform_are_refused() -> None:
    desc = {"digest": "sha256:" + "a" * 64, "size": 1}
    with pytest.raises(ValueError, match="two images for linux/amd64"):
        ocilayout.index_document([(desc, "linux/amd64"), (desc, "linux/amd64")], {})


def test_files_through_the_layers_with_whiteouts(tmp_path: Path) -> None:
    archive = oci_archive(
        tmp_path / "img.tar",
        [
            {"etc/a": b"1", "etc/b": b"1", "opt/d/x": b"1", "opt/d/y": b"1"},
            {"etc/a": b"2", "etc/.wh.b": b"", "opt/d/.wh..wh..opq": b"", "opt/d/z": b"2"},
        ],
        "arm64",
    )
    assert ocilayout.read_files(archive, lambda n: True) == {"etc/a": b"2", "opt/d/z": b"2"}
    root = ocilayout.unpack_rootfs(archive, tmp_path / "root")
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) == ["etc/a", "opt/d/z"]


STATUS = """Package: python3.11-minimal
Status: install ok installed
Architecture: arm64
Version: 3.11.2-6+deb12u6
Description: a
 continued line: not a field

Package: removed-one
Status: deinstall ok config-files
Version: 1.0

Package: tzdata
Status: install ok installed
Architecture: all
Version: 2025b-0+deb12u1
"""


def test_dpkg_packages_are_the_installed_ones_with_their_purls() -> None:
    pkgs = sbom.dpkg_packages(STATUS)
    assert [(p.name, p.version, p.arch) for p in pkgs] == [
        ("python3.11-minimal", "3.11.2-6+deb12u6", "arm64"),
        ("tzdata", "2025b-0+deb12u1", "all"),
    ]
    assert pkgs[0].purl == "pkg:deb/debian/python3.11-minimal@3.11.2-6+deb12u6?arch=arm64"


def test_python_packages_and_the_spdx_document() -> None:
    pys = sbom.python_packages(
        [
            "Metadata-Version: 2.4\nName: kube_gpu_scheduler\nVersion: 0.2.0\nLicense-Expression: Apache-2.0\n\nbody",
            "Metadata-Version: 2.1\nName: kubernetes\nVersion: 37.0.2\n",
            "Metadata-Version: 2.1\nSummary: no name\n",
        ]
    )
    assert [p.purl for p in pys] == ["pkg:pypi/kube-gpu-scheduler@0.2.0", "pkg:pypi/kubernetes@37.0.2"]
    doc = sbom.document("r/gpu-scheduler@sha256:" + "b" * 64, "linux/arm64", pys, "2026-01-01T00:00:00Z")
    assert doc["spdxVersion"] == "SPDX-2.3"
    ids = [p["SPDXID"] for p in doc["packages"]]
    assert len(ids) == len(set(ids)) == 3
    contains = {r["relatedSpdxElement"] for r in doc["relationships"] if r["relationshipType"] == "CONTAINS"}
    assert contains == set(ids[1:])
    assert doc["packages"][1]["licenseDeclared"] == "Apache-2.0"
    # The check `make release` runs on the verified attestation's predicate.
    assert sbom_problems([{"predicate": doc}]) == []
    assert sbom_problems([{"predicate": {"packages": doc["packages"][:2]}}]) == [
        "the SBOM lists no kubernetes"
    ]
    assert len(sbom_problems([])) == 2


def test_a_bases_platform_image_by_digest() -> None:
    """CI's cross build: the runtime stage on the base index's arm64 image, by its digest."""
    index = {
        "manifests": [
            {"digest": "sha256:" + "1" * 64, "platform": {"architecture": "amd64", "os": "linux"}},
            {
                "digest": "sha256:" + "2" * 64,
                "platform": {"architecture": "arm64", "os": "linux", "variant": "v8"},
            },
            {"digest": "sha256:" + "3" * 64, "platform": {"architecture": "unknown", "os": "unknown"}},
        ]
    }
    assert platform_digest(index, "arm64") == "sha256:" + "2" * 64
    with pytest.raises(ValueError, match="0 images for linux/s390x"):
        platform_digest(index, "s390x")
    assert repository_of("python:3.11.14-slim-bookworm@sha256:" + "a" * 64) == "python"
    assert repository_of("127.0.0.1:5000/team/python:3.11") == "127.0.0.1:5000/team/python"
    assert repository_of("127.0.0.1:5000/python") == "127.0.0.1:5000/python"
    assert dockerfile_base(REPO / "Dockerfile").startswith("python:3.11.14-slim-bookworm@sha256:")


def test_each_architecture_has_its_own_base_image_and_archive() -> None:
    """make image's two archives: keyed apart (the arm64 one by its base too), and a new build of
    one architecture replaces only that architecture's older archive and image."""
    from localcluster import image

    amd, arm = image.image_for_tree(), image.image_for_tree("arm64")
    assert arm.ref.endswith("-arm64") and arm.archive.name.endswith("-arm64.oci.tar")
    assert amd.ref.rsplit("-", 1)[1] != "arm64" and amd.archive != arm.archive
    assert image.base_ref() != image.base_ref("arm64") and "-arm64-" in image.base_ref("arm64")
    assert image._arch_of(arm.archive.name.removesuffix(".oci.tar")) == "-arm64"
    assert image._arch_of(amd.archive.name.removesuffix(".oci.tar")) == ""
    assert image._arch_of(amd.ref) == "" and image._arch_of(arm.ref) == "-arm64"


def test_bytecode_written_into_the_tree_does_not_change_the_images_key() -> None:
    """Python writes .pyc files under kube_gpu_scheduler/ whenever the tests import a module; the
    build context leaves them out (.dockerignore), so the key must too, or the image a release
    pushes would not be the one the suite ran (a new key mid-run: a second build)."""
    from localcluster import image

    before = image.context_digest()
    stray = REPO / "kube_gpu_scheduler" / "__pycache__" / "zz_key_probe.cpython-311.pyc"
    loose = REPO / "kube_gpu_scheduler" / "zz_key_probe.pyc"
    stray.parent.mkdir(exist_ok=True)
    try:
        stray.write_bytes(b"\0not code")
        loose.write_bytes(b"\0not code")
        assert image.context_digest() == before
        assert not [f for f in image.context_files() if f.suffix == ".pyc" or "__pycache__" in f.parts]
    finally:
        stray.unlink(missing_ok=True)
        loose.unlink(missing_ok=True)
