"""The project as a user, or the image, gets it: in a fresh venv that borrows nothing from the tests'.

Two installs, each made once per session by a fixture of tests/integration/fixtures_packaging.py:

* :func:`install_resolved` (``wheel_venv``): a user's ``pip install .``. The wheel is built
  from a copy of exactly what the Dockerfile copies, as the image's first stage builds it,
  and the new venv's own pip installs it, resolving every dependency from the wheel's own
  metadata (its ``Requires-Dist``) against the package index.
* :func:`install_image` (``image_venv``): the Dockerfile's build stage, run here as a script:
  its ENV, WORKDIR, COPY and RUN instructions in order, with the stage's absolute paths
  (``/opt/venv``, ``/src``, ``/wheels``) moved under a temporary directory. The lock
  (requirements/runtime.txt) is installed with ``--require-hashes``, then the wheel with no
  index, exactly as in the image: a lock that misses a package fails here, not in a cluster.

Isolation: every command runs without ``PYTHONPATH``, ``PYTHONHOME``, ``VIRTUAL_ENV`` and the
test venv's ``bin`` on ``PATH``; each venv is made by a base interpreter (never the test
venv's), without system site-packages; :meth:`WheelVenv.isolation_problems` asks the venv's
``python -I`` for its ``sys.path`` and where each package is imported from.

pip keeps its normal download cache (``PIP_CACHE_DIR``, else ``~/.cache/pip``), so a rerun
downloads nothing: the Dockerfile's ``--no-cache-dir`` and ``PIP_NO_CACHE_DIR`` are the only
things :func:`install_image` leaves out.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
LOCK = REPO / "requirements" / "runtime.txt"
PACKAGES = ("kube_gpu_scheduler",)
SCRIPTS = ("gpu-scheduler", "gpu-scheduler-webhook", "gpu-scheduler-map", "gpu-scheduler-check")
# Third-party modules the programs import: each must come from the venv too.
THIRD_PARTY = ("flask", "werkzeug", "gunicorn", "gevent", "packaging", "kubernetes", "orjson", "yaml")
# The absolute paths the Dockerfile's build stage uses; install_image moves them under its work dir.
STAGE_PATHS = ("/opt/venv", "/wheels", "/src")
# Debian bookworm's python3 (with python3-venv): the interpreter of a Debian-based image.
DEBIAN_PYTHON = Path("/usr/bin/python3")


@dataclass(frozen=True)
class WheelVenv:
    root: Path
    wheel: Path
    how: str  # how it was installed, for messages
    base_python: str  # the interpreter that made the venv
    extras: tuple[str, ...] = ()  # the project's extras installed ("nvml": NVML bindings)

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def python(self) -> Path:
        return self.bin / "python"

    def env(self, extra: Mapping[str, str] | None = None, home: Path | None = None) -> dict[str, str]:
        """A program's environment: the venv's bin first on PATH (as the image's), nothing else of ours."""
        return {
            "PATH": f"{self.bin}:/usr/bin:/bin",
            "HOME": str(home or self.root),
            "LANG": "C.UTF-8",
            **(extra or {}),
        }

    def probe(self) -> dict[str, object]:
        """``sys.path``, ``sys.prefix`` and where each package is imported from, asked of ``python -I``."""
        # find_spec, not import: a missing third-party module is left to the programs' own tests,
        # which then fail as a user's start would (ModuleNotFoundError in the log).
        code = (
            "import importlib.util, json, sys\n"
            f"mods = {[*PACKAGES, *THIRD_PARTY]!r}\n"
            "specs = {m: importlib.util.find_spec(m) for m in mods}\n"
            "print(json.dumps({'path': sys.path, 'prefix': sys.prefix, 'base_prefix': sys.base_prefix,"
            " 'files': {m: s.origin for m, s in specs.items() if s is not None}}))"
        )
        res = subprocess.run(
            [str(self.python), "-I", "-c", code],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=self.root,
            env=self.env(),
        )
        assert res.returncode == 0, f"{self.how}: {res.stderr[-3000:]}"
        return dict(json.loads(res.stdout))

    def isolation_problems(self) -> list[str]:
        """What the venv could import from outside itself and its interpreter's standard library."""
        info = self.probe()
        root = str(self.root.resolve())
        base = str(Path(str(info["base_prefix"])).resolve())
        problems = []
        if str(Path(str(info["prefix"])).resolve()) != root:
            problems.append(f"sys.prefix is {info['prefix']}, not the venv {root}")
        for entry in info["path"]:  # type: ignore[attr-defined]
            resolved = str(Path(entry).resolve())
            inside = resolved.startswith(root + os.sep)
            stdlib = resolved.startswith(base + os.sep) and "-packages" not in resolved
            if not (inside or stdlib):
                problems.append(f"sys.path holds {entry}")
        files = dict(info["files"])  # type: ignore[call-overload]
        problems += [f"the product package {p} is not installed" for p in PACKAGES if p not in files]
        for module, file in files.items():
            if not str(Path(file).resolve()).startswith(root + os.sep):
                problems.append(f"{module} is imported from {file}")
        cfg = (self.root / "pyvenv.cfg").read_text()
        if not re.search(r"^include-system-site-packages\s*=\s*false$", cfg, re.M):
            problems.append("pyvenv.cfg does not say include-system-site-packages = false")
        return problems


def clean_env() -> dict[str, str]:
    """This environment without what would point a new interpreter at the test venv or the checkout.

    A checkout on PYTHONPATH would also make pip see gpu-scheduler as installed already."""
    test_bin = str(Path(sys.prefix) / "bin")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV")
    }
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and p != test_bin)
    return env


def base_python() -> str:
    """The interpreter the test venv was made from (a venv made by a venv's python is based on it)."""
    return str(getattr(sys, "_base_executable", "") or sys.executable)


def image_python() -> str:
    """The interpreter the image's stage runs here: Debian's python3 when this machine has it with its
    venv module (what a Debian bookworm base holds), else the base interpreter (python:3.11-slim's)."""
    if DEBIAN_PYTHON.exists():
        res = subprocess.run(
            [str(DEBIAN_PYTHON), "-I", "-c", "import ensurepip, sys; print(sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if res.returncode == 0 and res.stdout.strip() == "(3, 11)":
            return str(DEBIAN_PYTHON)
    return base_python()


def _run(args: list[str], what: str, cwd: Path | None = None, env: Mapping[str, str] | None = None) -> str:
    res = subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        cwd=cwd,
        env=dict(env) if env is not None else clean_env(),
    )
    if res.returncode != 0:
        pytest.fail(f"{what} failed ({' '.join(args)}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return res.stdout


def copy_sources(dest: Path) -> Path:
    """What the Dockerfile copies for the wheel: pyproject.toml, README.md, LICENSE and the package."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, dest / name)
    for package in PACKAGES:
        shutil.copytree(REPO / package, dest / package, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def _check_scripts(root: Path, how: str) -> None:
    missing = [s for s in SCRIPTS if not (root / "bin" / s).exists()]
    assert not missing, f"{how}: no console script {missing} in {root / 'bin'}"


def install_resolved(work: Path, extras: str = "") -> WheelVenv:
    """A user's ``pip install .``: the wheel, its dependencies resolved by the new venv's pip.

    ``extras`` (``"nvml"``) installs ``wheel[extras]``."""
    python = base_python()
    root = work / "venv"
    _run([python, "-m", "venv", str(root)], "python -m venv")
    pip = [str(root / "bin" / "python"), "-m", "pip"]
    src = copy_sources(work / "src")
    dist = work / "dist"
    # An isolated PEP 517 build, as in the image (pip fetches the build backend from the index).
    _run([*pip, "wheel", "--no-deps", "-q", "-w", str(dist), str(src)], "pip wheel")
    (wheel,) = dist.glob("kube_gpu_scheduler-*.whl")
    target = f"{wheel}[{extras}]" if extras else str(wheel)
    # --no-compile: the programs write their byte-code at their first start instead; what is
    # installed, and from where, is the same (7 of the 19 s an install takes on an idle machine).
    _run([*pip, "install", "-q", "--no-compile", target], f"pip install {target}")
    how = f"pip install {wheel.name}{f'[{extras}]' if extras else ''} (dependencies resolved by pip)"
    _check_scripts(root, how)
    return WheelVenv(root, wheel, how, python, (extras,) if extras else ())


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str


def build_stage(dockerfile: Path = DOCKERFILE, stage: str = "build") -> list[Instruction]:
    """The instructions of the Dockerfile's stage ``stage`` (continuations joined, comments dropped)."""
    logical: list[str] = []
    pending = ""
    for raw in dockerfile.read_text().splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not pending):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    out: list[Instruction] = []
    inside = False
    for text in logical:
        keyword, _, args = text.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            inside = bool(re.search(rf"\s+AS\s+{re.escape(stage)}$", args, re.I))
            continue
        if inside:
            out.append(Instruction(keyword, " ".join(args.split())))
    assert out, f"{dockerfile}: no stage {stage!r}"
    return out


def _stage_path(root: Path, path: str) -> Path:
    return root / path.lstrip("/")


def _move_paths(root: Path, command: str) -> str:
    """The RUN command with the stage's absolute paths moved under ``root``; fails on any other."""
    moved = re.sub(
        r"(?<![\w./-])(" + "|".join(re.escape(p) for p in STAGE_PATHS) + r")(?=[/\s'\"]|$)",
        lambda m: str(_stage_path(root, m.group(1))),
        command,
    )
    others = [
        p
        # (not a path under a variable: "${site}/bin")
        for p in re.findall(r"(?<![\w./}-])/[\w./-]+", command)
        if not any(p == s or p.startswith(s + "/") for s in STAGE_PATHS)
    ]
    assert not others, (
        f"the Dockerfile's build stage uses the absolute path(s) {others}: "
        "tests/support/wheelvenv.py (STAGE_PATHS) must learn where they go"
    )
    return moved


def install_image(work: Path, dockerfile: Path = DOCKERFILE) -> WheelVenv:
    """The Dockerfile's build stage run here, its paths under ``work``; the venv it leaves at /opt/venv."""
    python = image_python()
    shims = work / "shims"  # the base image's `python`
    shims.mkdir(parents=True)
    (shims / "python").symlink_to(python)
    env = clean_env()
    env["PATH"] = f"{shims}:/usr/bin:/bin"
    cwd = work
    for ins in build_stage(dockerfile):
        if ins.keyword == "ENV":
            for pair in shlex.split(ins.args):
                name, sep, value = pair.partition("=")
                assert sep, f"ENV {ins.args}: only NAME=VALUE pairs are understood here"
                if name != "PIP_NO_CACHE_DIR":  # pip's download cache stays on, for speed
                    env[name] = value
        elif ins.keyword == "ARG":
            # TARGETARCH, BUILDARCH: unset here, as in a plain `docker build`: the native install.
            continue
        elif ins.keyword == "WORKDIR":
            cwd = _stage_path(work, ins.args)
            cwd.mkdir(parents=True, exist_ok=True)
        elif ins.keyword == "COPY":
            *sources, dest = shlex.split(ins.args)
            assert not [s for s in sources if s.startswith("--")], f"COPY {ins.args}: no flags here"
            target = _stage_path(work, dest) if dest.startswith("/") else cwd / dest
            for source in sources:
                src = REPO / source
                if src.is_dir():
                    shutil.copytree(
                        src, target, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True
                    )
                else:
                    to = target / src.name if dest.endswith("/") else target
                    to.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(src, to)
        elif ins.keyword == "RUN":
            command = _move_paths(work, ins.args).replace(" --no-cache-dir", "")
            _run(["/bin/sh", "-c", command], f"RUN {ins.args}", cwd=cwd, env=env)
        else:
            pytest.fail(f"the Dockerfile's build stage has {ins.keyword}: teach install_image what it does")
    root = _stage_path(work, "/opt/venv")
    (wheel,) = _stage_path(work, "/wheels").glob("kube_gpu_scheduler-*.whl")
    how = f"the Dockerfile's build stage (lock with --require-hashes, then the wheel), base {python}"
    _check_scripts(root, how)
    # The lock holds the nvml extra's packages (make lock: --extra nvml), and the stage installs
    # kube_gpu_scheduler-*.whl[nvml].
    return WheelVenv(root, wheel, how, python, ("nvml",))
