""".gitlab-ci.yml: valid for GitLab's CI schema, and every job runs a make target that exists."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
CI = REPO / ".gitlab-ci.yml"
KEYWORDS = {
    "stages",
    "variables",
    "default",
    "workflow",
    "include",
    "image",
    "services",
    "cache",
    "before_script",
    "after_script",
    "pages",
}


def ci() -> dict[str, Any]:
    data = yaml.safe_load(CI.read_text())
    assert isinstance(data, dict)
    return data


def jobs() -> dict[str, dict[str, Any]]:
    return {
        k: v for k, v in ci().items() if k not in KEYWORDS and not k.startswith(".") and isinstance(v, dict)
    }


def make_targets() -> set[str]:
    """Targets make knows (Makefile + the mk/*.mk it includes), from its database."""
    res = subprocess.run(
        ["make", "-pRrq", "-f", "Makefile", ":"],
        cwd=REPO,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    targets = set()
    for line in res.stdout.splitlines():
        m = re.match(r"^([A-Za-z0-9][\w.-]*):(?!=)", line)
        if m:
            targets.add(m.group(1))
    return targets


def test_valid_against_gitlab_ci_schema() -> None:
    exe = shutil.which("check-jsonschema", path=str(Path(sys.executable).parent)) or shutil.which(
        "check-jsonschema"
    )
    if not exe:
        pytest.skip("check-jsonschema is not installed")
    res = subprocess.run(
        [exe, "--builtin-schema", "vendor.gitlab-ci", str(CI)], check=False, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_stages() -> None:
    assert ci()["stages"] == ["lint", "test", "build", "deploy"]
    stages = {name: job["stage"] for name, job in jobs().items()}
    assert set(stages.values()) == {"lint", "test", "build", "deploy"}


def test_every_make_target_a_job_calls_exists() -> None:
    targets = make_targets()
    assert {"lint", "test", "venv", "tools"} <= targets
    called: set[str] = set()
    for name, job in jobs().items():
        for line in job["script"]:
            # Targets only: a VAR=value argument (make release-check RELEASE_TAG=...) is not one.
            for m in re.finditer(r"\bmake\s+((?:[\w-]+(?![\w=-])\s*)+)", line):
                for target in m.group(1).split():
                    assert target in targets, f"job {name}: make {target} is not a target"
                    called.add(target)
    assert {
        "lint",
        "yamllint",
        "hadolint",
        "chart-lint",
        "test",
        "package",
        "deploy-hint",
        "release-check",
        "image-push",
        "release",
    } <= called


def test_every_job_runs_make() -> None:
    for name, job in jobs().items():
        script = "\n".join(job["script"])
        assert re.search(r"\bmake\s+\w", script), f"job {name} does not call a make target"


def test_images_are_built_with_buildah_not_kaniko() -> None:
    """kaniko was archived upstream (2025): the image jobs build with buildah (Debian's), through
    the same make targets a maintainer runs (mk/release.mk); what each pushes is run for real
    in tests/unit/chart/test_release.py."""
    text = CI.read_text()
    assert "kaniko" not in text.lower()
    build, release = jobs()["build-image"], jobs()["release"]
    for job in (build, release):
        assert "buildah" in " ".join(job["before_script"])
        assert job["variables"]["IMAGE_BASE"] == "dockerfile"
        assert job["variables"]["GPU_SCHEDULER_BUILDAH_DRIVER"] == "vfs"
        assert job["variables"]["RELEASE_REGISTRY_PASSWORD"] == "$CI_REGISTRY_PASSWORD"
    assert build["stage"] == "build" and "make image-push" in "\n".join(build["script"])
    assert release["stage"] == "deploy" and release["rules"] == [{"if": "$CI_COMMIT_TAG"}]
    assert release["script"] == ['make release VERSION="${CI_COMMIT_TAG#v}" REGISTRY="$CI_REGISTRY_IMAGE"']
    assert release["artifacts"]["paths"] == ["dist/release/"]


def test_deploy_hint_is_manual() -> None:
    job = jobs()["deploy-hint"]
    assert job["stage"] == "deploy" and job["when"] == "manual"


def test_make_targets_run_dry() -> None:
    """make -n resolves every delivery target (no missing prerequisites)."""
    for target in (
        "yamllint",
        "hadolint",
        "helm-lint",
        "ct-lint",
        "chart-lint",
        "package",
        "deploy-hint",
        "registry",
    ):
        res = subprocess.run(
            ["make", "-n", target], cwd=REPO, check=False, capture_output=True, text=True, timeout=120
        )
        assert res.returncode == 0, f"make -n {target}: {res.stderr}"
