"""The project as a user (or the image) gets it: a wheel, installed non-editable into a fresh venv.

``build`` (the ``wheel_venv`` fixture of tests/integration/fixtures_packaging.py, once per
session) builds the wheel from a
copy of exactly what the Dockerfile copies (pyproject.toml, README.md and the three
packages), as the image's first stage does, and installs it with ``--no-deps`` into
a new virtual environment. The third-party dependencies come from the test
virtualenv's site-packages through a plain path in a ``.pth`` file: a plain path
does not run that directory's own ``.pth`` files, so the editable install of the
checkout there stays inert and every import of ``gpu_scheduling``, ``scheduler`` and
``webhook`` resolves to the wheel (``WheelVenv.module_files`` proves it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("gpu_scheduling", "scheduler", "webhook")


@dataclass(frozen=True)
class WheelVenv:
    root: Path
    wheel: Path

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def python(self) -> Path:
        return self.bin / "python"

    def module_files(self) -> dict[str, str]:
        """Where the venv's Python imports each product package from."""
        code = (
            "import importlib, json; print(json.dumps({m: importlib.import_module(m).__file__ for m in %r}))"
        )
        res = subprocess.run(
            [str(self.python), "-I", "-c", code % (PACKAGES,)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=self.root,
        )
        assert res.returncode == 0, res.stderr
        import json

        return dict(json.loads(res.stdout))


def _clean_env() -> dict[str, str]:
    """This environment without PYTHONPATH/PYTHONHOME: a checkout on the path would make pip
    see gpu-scheduler as installed already and skip the wheel."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def _run(args: list[str], what: str, cwd: Path | None = None) -> None:
    res = subprocess.run(
        args, capture_output=True, text=True, timeout=600, check=False, cwd=cwd, env=_clean_env()
    )
    if res.returncode != 0:
        pytest.fail(f"{what} failed ({' '.join(args)}):\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}")


def build(work: Path) -> WheelVenv:
    src = work / "src"
    src.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for package in PACKAGES:
        shutil.copytree(REPO / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    dist = work / "dist"
    # An isolated PEP 517 build, as in the image (pip fetches the build backend from the index).
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)], "pip wheel")
    (wheel,) = dist.glob("gpu_scheduler-*.whl")
    root = work / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(root)], "python -m venv")
    venv_python = root / "bin" / "python"
    _run(
        [sys.executable, "-m", "pip", "--python", str(venv_python), "install", "-q", "--no-deps", str(wheel)],
        "pip install the wheel",
    )
    scripts = ("gpu-scheduler", "gpu-scheduler-webhook", "gpu-scheduler-map", "gpu-scheduler-check")
    missing = [s for s in scripts if not (root / "bin" / s).exists()]
    assert not missing, f"the wheel install made no console script {missing} in {root / 'bin'}"
    # Dependencies from the test virtualenv, as a plain path (its .pth files are not run).
    out = subprocess.run(
        [str(venv_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    (Path(out) / "test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return WheelVenv(root, wheel)
