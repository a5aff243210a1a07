"""Fixtures for what the tests build from the repository (registered by tests/conftest.py).

* ``fake_nvml``: the directory holding the fake ``libnvidia-ml.so.1``, compiled once per
  session from tests/support/fakenvml/fakenvml.c (tests/support/fakenvml.py: ``nvml_env``).
* ``wheel_venv``: the project built as a wheel and installed non-editable into a fresh
  venv, once per session (tests/support/wheelvenv.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import fakenvml, wheelvenv


@pytest.fixture(scope="session")
def fake_nvml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory holding the compiled fake ``libnvidia-ml.so.1`` (for LD_LIBRARY_PATH)."""
    return fakenvml.build(tmp_path_factory.mktemp("fakenvml"))


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> wheelvenv.WheelVenv:
    """A venv with the project's wheel installed (not editable); imports resolve to the wheel."""
    venv = wheelvenv.build(tmp_path_factory.mktemp("wheel-venv"))
    files = venv.module_files()
    outside = {m: f for m, f in files.items() if not f.startswith(str(venv.root))}
    assert not outside, f"imported from outside the wheel install: {outside}"
    return venv
