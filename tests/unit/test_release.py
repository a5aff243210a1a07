"""The image a user installs exists: for a release tag, CI pushes exactly the image the charts install by default.

One version (pyproject.toml) = both charts' appVersion = the release tag without its
``v`` = the image tag CI's build-image job pushes (its real shell script is run here
with a stand-in for kaniko) = the image every container of both charts renders with
by default (``helm template``).
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

from tests.support.charts import CHARTS, render
from tests.support.tools import load_tool

REPO = Path(__file__).resolve().parents[2]


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


def build_job() -> dict[str, Any]:
    ci = yaml.safe_load((REPO / ".gitlab-ci.yml").read_text())
    (job,) = [
        j for j in ci.values() if isinstance(j, dict) and "/kaniko/executor" in "\n".join(j.get("script", []))
    ]
    return dict(job)


def pushed(tmp_path: Path, **ci_env: str) -> list[str]:
    """Run build-image's script (kaniko replaced by a stub that prints its --destination values)."""
    job = build_job()
    kaniko = tmp_path / "kaniko"
    kaniko.mkdir(exist_ok=True)
    stub = kaniko / "executor"
    stub.write_text('#!/bin/sh\nwhile [ $# -gt 0 ]; do [ "$1" = --destination ] && echo "$2"; shift; done\n')
    stub.chmod(0o755)
    script = "\n".join(job["script"]).replace("/kaniko/", f"{kaniko}/")
    variables = "\n".join(f'export {k}="{v}"' for k, v in (job.get("variables") or {}).items())
    env = {
        "PATH": os.environ["PATH"],
        "CI_REGISTRY": "registry.gitlab.com",
        "CI_REGISTRY_IMAGE": registry_image(),
        "CI_REGISTRY_USER": "gitlab-ci-token",
        "CI_REGISTRY_PASSWORD": "x",
        "CI_PROJECT_DIR": str(REPO),
        "CI_COMMIT_SHA": "0123456789abcdef0123456789abcdef01234567",
        "CI_COMMIT_SHORT_SHA": "01234567",
        "CI_DEFAULT_BRANCH": "main",
        **ci_env,
    }
    res = subprocess.run(
        ["sh", "-e", "-c", variables + "\n" + script],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout.split()


def default_images(chart: Path) -> set[str]:
    """Every container image (init containers and helm test pods included) of a default render."""
    images: set[str] = set()
    for doc in render(chart):
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


def test_a_release_tag_pushes_the_image_the_charts_install(tmp_path: Path) -> None:
    tag = f"v{VERSION}"
    assert release_check().problems(tag) == []
    destinations = pushed(tmp_path, CI_COMMIT_TAG=tag)
    image = f"{registry_image()}/gpu-scheduler"
    assert destinations == [f"{image}:01234567", f"{image}:{VERSION}"]
    for chart in CHARTS:
        assert default_images(chart) == {f"{image}:{VERSION}"}, chart.name


def test_branch_pipelines_push_no_release_tag(tmp_path: Path) -> None:
    image = f"{registry_image()}/gpu-scheduler"
    assert pushed(tmp_path, CI_COMMIT_BRANCH="main") == [f"{image}:01234567", f"{image}:latest"]
    assert pushed(tmp_path, CI_COMMIT_BRANCH="feature") == [f"{image}:01234567"]


def test_release_check_refuses_disagreement(tmp_path: Path) -> None:
    rc = release_check()
    assert rc.problems("0.1.0" if VERSION == "0.1.0" else VERSION) != []  # no leading v
    assert rc.problems("v999.0.0") == [
        f"release tag 'v999.0.0' is not 'v{VERSION}' (pyproject.toml version and the charts' appVersion)"
    ]
    # A chart left behind on the old appVersion is named.
    copy = tmp_path / "repo"
    copy.mkdir()
    shutil.copy(REPO / "pyproject.toml", copy / "pyproject.toml")
    for chart in CHARTS:
        (copy / chart.name).mkdir()
        shutil.copy(chart / "Chart.yaml", copy / chart.name / "Chart.yaml")
    bumped = (copy / "pyproject.toml").read_text().replace(f'version = "{VERSION}"', 'version = "9.9.9"', 1)
    (copy / "pyproject.toml").write_text(bumped)
    rc.REPO = copy
    found = rc.problems("v9.9.9")
    assert found == [
        f"{c.name}/Chart.yaml: appVersion is '{VERSION}', pyproject.toml version is '9.9.9'" for c in CHARTS
    ]
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
    assert job["stage"] == "lint"  # fails the pipeline before build-image pushes anything
    assert job["rules"] == [{"if": "$CI_COMMIT_TAG"}]
    assert 'RELEASE_TAG="$CI_COMMIT_TAG"' in job["script"][0]
