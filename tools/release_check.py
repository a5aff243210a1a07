#!/usr/bin/env python3
"""One version everywhere a release names it: pyproject.toml, both charts' version and
appVersion, the git tag, the CHANGELOG.

    tools/release_check.py            # prints the version; exit 1 when the files disagree
    tools/release_check.py v0.2.0     # also: the tag is v<version>, CHANGELOG.md has "## <version>"

A release tag vX.Y.Z makes CI run `make release VERSION=X.Y.Z` (.gitlab-ci.yml, release):
the image tag X.Y.Z, which is each chart's appVersion, and both charts as version X.Y.Z.
`make release` runs this check first (localcluster/publish.py). Standard library only (CI
runs it before any virtualenv exists). One line on stderr per disagreement.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHARTS = ("gpu-scheduler-chart", "gpu-scheduler-check-chart")


def package_version() -> str:
    return str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


def chart_field(chart: str, field: str) -> str | None:
    """A top-level scalar of ``chart``/Chart.yaml (quoted or not): ``version``, ``appVersion``."""
    text = (REPO / chart / "Chart.yaml").read_text()
    m = re.search(rf"""^{field}:\s*["']?([^"'\s#]+)["']?\s*(?:#.*)?$""", text, re.M)
    return m.group(1) if m else None


def app_version(chart: str) -> str | None:
    """``appVersion`` of ``chart``/Chart.yaml."""
    return chart_field(chart, "appVersion")


def changelog_has(version: str) -> bool:
    """CHANGELOG.md has a section for ``version`` (a ``## <version>`` heading)."""
    text = (REPO / "CHANGELOG.md").read_text()
    return re.search(rf"^## {re.escape(version)}(\s|$)", text, re.M) is not None


def image_tag_for(tag: str) -> str:
    """The image tag CI pushes for the git tag ``tag`` (build-image: ``${CI_COMMIT_TAG#v}``)."""
    return tag[1:] if tag.startswith("v") else tag


def problems(tag: str | None = None) -> list[str]:
    """Every disagreement: each chart's appVersion and version against pyproject.toml's version;
    with a release ``tag``, also the tag and CHANGELOG.md's section for the version."""
    version = package_version()
    out = []
    for chart in CHARTS:
        found = app_version(chart)
        if found != version:
            out.append(f"{chart}/Chart.yaml: appVersion is {found!r}, pyproject.toml version is {version!r}")
        chart_version = chart_field(chart, "version")
        if chart_version != version:
            out.append(
                f"{chart}/Chart.yaml: version is {chart_version!r}, pyproject.toml version is {version!r}"
            )
    if tag is not None and tag != f"v{version}":
        out.append(
            f"release tag {tag!r} is not 'v{version}' (pyproject.toml version and the charts' appVersion)"
        )
    if tag is not None and not changelog_has(version):
        out.append(f"CHANGELOG.md has no section '## {version}' (rename '## Unreleased' when you tag)")
    return out


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        print("usage: tools/release_check.py [RELEASE_TAG]", file=sys.stderr)
        return 2
    found = problems(argv[0] if argv else None)
    for line in found:
        print(f"release-check: {line}", file=sys.stderr)
    if not found:
        print(package_version())
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
