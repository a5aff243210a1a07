"""One version, and the image a user installs is the one pushed with the chart.

One version (pyproject.toml) = both charts' ``version`` and ``appVersion`` = the release tag
without its ``v`` = what ``make release`` pushes (localcluster/publish.py): the image
``REGISTRY/gpu-scheduler:<version>`` and both charts, whose packaged values pin that image
by digest. CI's jobs are run here with a stand-in ``make`` that prints what it was asked.
Through a real registry and the real node: tests/node/test_release_registry.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from localcluster import publish
from tests.support.charts import CHARTS, render
from tests.support.tools import load_tool

REPO = Path(__file__).resolve().parents[3]
DIGEST = "sha256:" + "0123456789abcdef" * 4


def release_check() -> ModuleType:
    return load_tool("release_check")


VERSION = release_check().package_version()


def chart_meta(chart: Path) -> dict[str, Any]:
    return dict(yaml.safe_load((chart / "Chart.yaml").read_text()))


def registry_image() -> str:
    """$CI_REGISTRY_IMAGE of the project the charts name as their home (gitlab.com/OWNER/NAME)."""
    homes = {chart_meta(c)["home"] for c in CHARTS}
    (home,) = homes
    assert home.startswith("https://gitlab.com/"), home
    return "registry.gitlab.com/" + home.removeprefix("https://gitlab.com/").lower()


def run_job(name: str, tmp_path: Path, **ci_env: str) -> list[list[str]]:
    """Run CI job ``name``'s script with a stand-in ``make`` that prints its arguments, one
    invocation per line: what the job asks make for."""
    job = yaml.safe_load((REPO / ".gitlab-ci.yml").read_text())[name]
    stub_dir = tmp_path / f"bin-{name}"
    stub_dir.mkdir(exist_ok=True)
    stub = stub_dir / "make"
    stub.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\037" "$a"; done; echo\n')
    stub.chmod(0o755)
    env = {
        "PATH": f"{stub_dir}{os.pathsep}{os.environ['PATH']}",
        "CI_REGISTRY": "registry.gitlab.com",
        "CI_REGISTRY_IMAGE": registry_image(),
        "CI_PROJECT_DIR": str(REPO),
        "CI_COMMIT_SHA": "0123456789abcdef0123456789abcdef01234567",
        "CI_COMMIT_SHORT_SHA": "01234567",
        "CI_DEFAULT_BRANCH": "main",
        **ci_env,
    }
    res = subprocess.run(
        ["sh", "-e", "-c", "\n".join(job["script"])],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    return [line.split("\037")[:-1] for line in res.stdout.splitlines()]


def default_images(chart: Path, values: dict[str, Any] | None = None) -> set[str]:
    """Every container image (init containers and helm test pods included) of a render."""
    images: set[str] = set()
    for doc in render(chart, values=values):
        spec = doc.get("spec") or {}
        pod = (
            spec
            if doc["kind"] == "Pod"
            else (spec.get("jobTemplate", {}).get("spec") or spec).get("template", {}).get("spec")
        )
        for c in [*(pod or {}).get("initContainers", []), *(pod or {}).get("containers", [])]:
            images.add(c["image"])
    return images


def test_one_version_everywhere() -> None:
    assert release_check().problems() == []
    for chart in CHARTS:
        assert str(chart_meta(chart)["appVersion"]) == VERSION, chart.name
        assert str(chart_meta(chart)["version"]) == VERSION, chart.name
    assert publish.version_problems(REPO, VERSION) == []
    assert publish.version_problems(REPO, "9.9.9") != []


def test_a_release_tag_runs_make_release_for_its_version(tmp_path: Path) -> None:
    (call,) = run_job("release", tmp_path, CI_COMMIT_TAG=f"v{VERSION}")
    assert call == ["release", f"VERSION={VERSION}", f"REGISTRY={registry_image()}"]
    # What that pushes is what the charts install by default (repository) and pin (digest).
    image = publish.image_repository(registry_image())
    assert image == f"{registry_image()}/gpu-scheduler"
    for chart in CHARTS:
        assert default_images(chart) == {f"{image}:{VERSION}"}, chart.name
    assert publish.chart_repository(registry_image()) == f"oci://{registry_image()}/charts"


def test_branch_pipelines_push_the_commit_and_main_latest(tmp_path: Path) -> None:
    main = run_job("build-image", tmp_path, CI_COMMIT_BRANCH="main")
    assert main == [["image-push", f"REGISTRY={registry_image()}", "IMAGE_TAGS=01234567 latest"]]
    feature = run_job("build-image", tmp_path, CI_COMMIT_BRANCH="feature")
    assert feature == [["image-push", f"REGISTRY={registry_image()}", "IMAGE_TAGS=01234567"]]


def test_a_released_chart_pins_its_image_by_digest(tmp_path: Path) -> None:
    """What package_chart writes into each chart: every container of every render is
    REGISTRY/gpu-scheduler@<digest>, and Artifact Hub's images annotation names it."""
    repository = "127.0.0.1:5000/team/gpu-scheduler"
    for chart in CHARTS:
        copy = tmp_path / chart.name
        shutil.copytree(chart, copy)
        values = copy / "values.yaml"
        before = values.read_text()
        after = publish.pin_image(before, repository, DIGEST, VERSION)
        values.write_text(after)
        # Only the two lines change; comments and every other value stay as written.
        changed = [(a, b) for a, b in zip(before.splitlines(), after.splitlines(), strict=True) if a != b]
        assert [b.strip() for _, b in changed] == [f'repository: "{repository}"', f'digest: "{DIGEST}"']
        assert default_images(copy) == {f"{repository}@{DIGEST}"}, chart.name
        meta = copy / "Chart.yaml"
        meta.write_text(publish.annotate_images(meta.read_text(), f"{repository}:{VERSION}@{DIGEST}"))
        images = yaml.safe_load(yaml.safe_load(meta.read_text())["annotations"]["artifacthub.io/images"])
        assert images == [{"name": "gpu-scheduler", "image": f"{repository}:{VERSION}@{DIGEST}"}]


def test_a_chart_older_than_image_digest_is_pinned_through_its_tag() -> None:
    """0.1.0's values had no image.digest (its schema refuses one): the release pins the tag."""
    old = 'nameOverride: ""\nimage:\n  # -- repo\n  repository: r.example/x\n  tag: ""\n  pullPolicy: IfNotPresent\n\nother: 1\n'
    pinned = yaml.safe_load(publish.pin_image(old, "127.0.0.1:5000/gpu-scheduler", DIGEST, "0.1.0"))
    assert pinned["image"] == {
        "repository": "127.0.0.1:5000/gpu-scheduler",
        "tag": f"0.1.0@{DIGEST}",
        "pullPolicy": "IfNotPresent",
    }
    assert pinned["other"] == 1
    with pytest.raises(ValueError):
        publish.pin_image(old, "r", "sha256:short", "0.1.0")


@pytest.mark.parametrize(
    ("registry", "plain"),
    [
        ("127.0.0.1:5000", True),
        ("localhost:5000/team", True),
        ("[::1]:5000", True),
        ("registry.gitlab.com/evgenii19/gpu-scheduler", False),
        ("ghcr.io", False),
    ],
)
def test_a_loopback_registry_is_plain_http(registry: str, plain: bool) -> None:
    assert publish.is_loopback(registry) is plain


def test_release_check_refuses_disagreement(tmp_path: Path) -> None:
    rc = release_check()
    assert rc.problems(VERSION) != []  # no leading v
    assert (
        f"release tag 'v999.0.0' is not 'v{VERSION}' (pyproject.toml version and the charts' appVersion)"
        in (rc.problems("v999.0.0"))
    )
    # A chart left behind on the old version is named, and a tag needs its CHANGELOG section.
    copy = tmp_path / "repo"
    copy.mkdir()
    for name in ("pyproject.toml", "CHANGELOG.md"):
        shutil.copy(REPO / name, copy / name)
    for chart in CHARTS:
        (copy / chart.name).mkdir()
        shutil.copy(chart / "Chart.yaml", copy / chart.name / "Chart.yaml")
    bumped = (copy / "pyproject.toml").read_text().replace(f'version = "{VERSION}"', 'version = "9.9.9"', 1)
    (copy / "pyproject.toml").write_text(bumped)
    rc.REPO = copy
    found = rc.problems("v9.9.9")
    assert found == [
        line
        for c in CHARTS
        for line in (
            f"{c.name}/Chart.yaml: appVersion is '{VERSION}', pyproject.toml version is '9.9.9'",
            f"{c.name}/Chart.yaml: version is '{VERSION}', pyproject.toml version is '9.9.9'",
        )
    ] + ["CHANGELOG.md has no section '## 9.9.9' (rename '## Unreleased' when you tag)"]
    res = subprocess.run(
        [sys.executable, str(REPO / "tools" / "release_check.py"), "v999.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 1 and res.stderr.startswith("release-check: release tag 'v999.0.0'")


@pytest.mark.parametrize("target", ["release-check"])
def test_ci_runs_the_release_check_on_tags(target: str) -> None:
    ci = yaml.safe_load((REPO / ".gitlab-ci.yml").read_text())
    (job,) = [j for j in ci.values() if isinstance(j, dict) and any(target in s for s in j.get("script", []))]
    assert job["stage"] == "lint"  # fails the pipeline before the release job pushes anything
    assert job["rules"] == [{"if": "$CI_COMMIT_TAG"}]
    assert 'RELEASE_TAG="$CI_COMMIT_TAG"' in job["script"][0]


def test_make_release_needs_a_version_and_a_registry() -> None:
    res = subprocess.run(
        ["make", "-n", "release", "VERSION=1.2.3", "REGISTRY=127.0.0.1:5000"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert '-m localcluster.publish --version "1.2.3" --registry "127.0.0.1:5000"' in res.stdout


def test_the_readme_installs_from_the_registry_first() -> None:
    """README "Install": the first helm install is the released chart, from the registry the
    release job pushes to, at this version."""
    readme = (REPO / "README.md").read_text()
    install = readme[readme.index("## Install") :]
    first = next(line for line in install.splitlines() if "helm install" in line)
    chart = f"{publish.chart_repository(registry_image())}/gpu-scheduler"
    assert f"helm install gpu-scheduler {chart}" in first, first
    block = install[install.index(first) :].split("```", 1)[0]
    assert f"--version {VERSION}" in block
