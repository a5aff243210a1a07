"""Fixtures for what the tests build from the repository (registered by tests/conftest.py).

* ``fake_nvml``: the directory holding the fake ``libnvidia-ml.so.1``, compiled once per
  session from localcluster/fakenvml/fakenvml.c (tests/support/fakenvml.py: ``nvml_env``).
* ``wheel_venv``: a user's ``pip install .``: the project's wheel installed into a fresh venv,
  its dependencies resolved by pip from the wheel's own metadata, once per session.
* ``image_venv``: the venv the image gets: the Dockerfile's build stage run here (the lock
  with ``--require-hashes``, then the wheel with no index), once per session.

Both come from tests/support/wheelvenv.py and borrow nothing from the test virtualenv: each
fixture fails when the venv's ``python -I`` could import anything from outside it (its
standard library apart).
"""

from __future__ import annotations

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


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> wheelvenv.WheelVenv:
    """A user's ``pip install .`` (no extra): the wheel, dependencies resolved by pip, in a fresh venv."""
    return _isolated(wheelvenv.install_resolved(tmp_path_factory.mktemp("wheel-venv")))


@pytest.fixture(scope="session")
def image_venv(tmp_path_factory: pytest.TempPathFactory) -> wheelvenv.WheelVenv:
    """The image's venv: the Dockerfile's build stage (hashed lock, nvml extra, then the wheel) run here."""
    return _isolated(wheelvenv.install_image(tmp_path_factory.mktemp("image-venv")))
