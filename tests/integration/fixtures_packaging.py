"""Fixtures for what the tests build from the repository (registered by tests/conftest.py).

* ``fake_nvml``: the directory holding the fake ``libnvidia-ml.so.1``, compiled once per
  session from localcluster/fakenvml/fakenvml.c (tests/support/fakenvml.py: ``nvml_env``).
* ``wheel_venv``: a user's ``pip install .``: the project's wheel installed into a fresh venv,
  its dependencies resolved by pip from the wheel's own metadata, once per session.
* ``image_venv``: the venv the image gets: the Dockerfile's build stage run here (the lock
  with ``--require-hashes``, then the wheel with no index), once per session.

Each venv is built once per run, not once per pytest-xdist worker: the first worker to ask
builds it under a file lock in the run's shared temporary directory, and the others use it
(the tests only run its programs; one that installs more makes a venv of its own).

Both come from tests/support/wheelvenv.py and borrow nothing from the test virtualenv: each
fixture fails when the venv's ``python -I`` could import anything from outside it (its
standard library apart).
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import fakenvml, wheelvenv


@pytest.fixture(scope="session")
def fake_nvml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory holding the compiled fake ``libnvidia-ml.so.1`` (for LD_LIBRARY_PATH)."""
    return fakenvml.build(tmp_path_factory.mktemp("fakenvml"))


def _isolated(venv: wheelvenv.WheelVenv) -> wheelvenv.WheelVenv:
    problems = venv.isolation_problems()
    assert not problems, f"{venv.how}: not isolated: {problems}"
    return venv


def once_per_run(
    factory: pytest.TempPathFactory, name: str, make: Callable[[Path], wheelvenv.WheelVenv]
) -> wheelvenv.WheelVenv:
    """``make(work)`` run by the first worker of this pytest run that asks; the others wait on
    the lock and read what it recorded. A build that failed recorded nothing: the next one tries."""
    base = factory.getbasetemp()
    # Under xdist each worker's basetemp is popen-gwN inside the run's own directory.
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    record = shared / f"{name}.json"
    with (shared / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if record.exists():
            fields = json.loads(record.read_text())
            return wheelvenv.WheelVenv(
                **{
                    **fields,
                    "root": Path(fields["root"]),
                    "wheel": Path(fields["wheel"]),
                    "extras": tuple(fields["extras"]),
                }
            )
        work = shared / name
        if work.exists():  # a failed build's leftovers
            import shutil

            shutil.rmtree(work)
        work.mkdir()
        venv = _isolated(make(work))
        fields = {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(venv).items()}
        record.write_text(json.dumps(fields))
        return venv


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> wheelvenv.WheelVenv:
    """A user's ``pip install .`` (no extra): the wheel, dependencies resolved by pip, in a fresh venv."""
    return once_per_run(tmp_path_factory, "wheel-venv", wheelvenv.install_resolved)


@pytest.fixture(scope="session")
def image_venv(tmp_path_factory: pytest.TempPathFactory) -> wheelvenv.WheelVenv:
    """The image's venv: the Dockerfile's build stage (hashed lock, nvml extra, then the wheel) run here."""
    return once_per_run(tmp_path_factory, "image-venv", wheelvenv.install_image)
