"""The image's software bill of materials: an SPDX 2.3 JSON document per architecture.

What it lists is read from the image itself (:func:`localcluster.ocilayout.read_files`): the Debian
packages of dpkg's database (``var/lib/dpkg/status``) and the Python distributions of the venv
(``opt/venv/lib/python*/site-packages/*.dist-info/METADATA``), each with its package URL
(``pkg:deb/debian/...``, ``pkg:pypi/...``), so scanners match them against advisories. `make
release` attests each document to its image with cosign (``--type spdxjson``; localcluster/cosign.py).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path
from typing import Any

from localcluster.ocilayout import read_files

STATUS = "var/lib/dpkg/status"
DIST_INFO = re.compile(r"^opt/venv/lib/python[\d.]+/site-packages/[^/]+\.dist-info/METADATA$")
NAMESPACE = "https://gitlab.com/evgenii19/gpu-scheduler/spdx"


@dataclass(frozen=True)
class Package:
    kind: str  # "deb" or "pypi"
    name: str
    version: str
    arch: str = ""
    license: str = ""

    @property
    def purl(self) -> str:
        if self.kind == "deb":
            return f"pkg:deb/debian/{self.name}@{self.version}?arch={self.arch}"
        return f"pkg:pypi/{normalize(self.name)}@{self.version}"


def normalize(name: str) -> str:
    """PEP 503's normalized project name (pkg:pypi wants it)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def dpkg_packages(status: str) -> list[Package]:
    """The installed packages of a dpkg status file."""
    out = []
    for stanza in re.split(r"\n\s*\n", status):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line and not line[0].isspace() and ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if "Package" in fields and fields.get("Status", "").endswith(" installed"):
            out.append(
                Package("deb", fields["Package"], fields.get("Version", ""), fields.get("Architecture", ""))
            )
    return sorted(out, key=lambda p: p.name)


def python_packages(metadata: list[str]) -> list[Package]:
    """The distributions of their METADATA files' texts."""
    out = []
    for text in metadata:
        headers = HeaderParser().parsestr(text, headersonly=True)
        if headers.get("Name") and headers.get("Version"):
            lic = headers.get("License-Expression") or ""
            out.append(Package("pypi", str(headers["Name"]), str(headers["Version"]), license=str(lic)))
    return sorted(out, key=lambda p: normalize(p.name))


def spdx_id(p: Package) -> str:
    return "SPDXRef-" + re.sub(r"[^A-Za-z0-9.-]", "-", f"{p.kind}-{p.name}-{p.version}")


def document(image: str, platform: str, packages: list[Package], created: str) -> dict[str, Any]:
    """An SPDX 2.3 document: the image (``image``, by digest) contains each of ``packages``."""
    root = "SPDXRef-image"
    spdx_packages: list[dict[str, Any]] = [
        {
            "SPDXID": root,
            "name": image.rsplit("@", 1)[0],
            "versionInfo": image.rsplit("@", 1)[-1],
            "downloadLocation": "NOASSERTION",
            "primaryPackagePurpose": "CONTAINER",
            "comment": f"platform {platform}",
        }
    ]
    for p in packages:
        spdx_packages.append(
            {
                "SPDXID": spdx_id(p),
                "name": p.name,
                "versionInfo": p.version,
                "downloadLocation": "NOASSERTION",
                "licenseDeclared": p.license or "NOASSERTION",
                "externalRefs": [
                    {
                        "referenceCategory": "PACKAGE-MANAGER",
                        "referenceType": "purl",
                        "referenceLocator": p.purl,
                    }
                ],
            }
        )
    return {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": f"{image} {platform}",
        "documentNamespace": f"{NAMESPACE}/{uuid.uuid5(uuid.NAMESPACE_URL, image + platform)}",
        "creationInfo": {"created": created, "creators": ["Tool: gpu-scheduler localcluster/sbom.py"]},
        "packages": spdx_packages,
        "relationships": [
            {"spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES", "relatedSpdxElement": root}
        ]
        + [
            {"spdxElementId": root, "relationshipType": "CONTAINS", "relatedSpdxElement": spdx_id(p)}
            for p in packages
        ],
    }


def image_packages(archive: Path) -> list[Package]:
    """The Debian and Python packages in the image of an OCI archive."""
    files = read_files(archive, lambda name: name == STATUS or bool(DIST_INFO.match(name)))
    debs = dpkg_packages(files.pop(STATUS, b"").decode())
    return debs + python_packages([v.decode(errors="replace") for v in files.values()])
