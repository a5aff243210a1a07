"""A test without the ``cluster`` mark cannot start a control plane (tests/conftest.py), in-process or in a child."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from localcluster.cluster import NO_CONTROL_PLANE, REPO, Cluster


def test_this_unmarked_test_is_refused_a_control_plane(tmp_path: Path) -> None:
    assert os.environ[NO_CONTROL_PLANE].endswith("test_this_unmarked_test_is_refused_a_control_plane")
    with pytest.raises(RuntimeError, match="without the `cluster` mark"):
        Cluster.start(tmp_path / "cluster")
    assert not (tmp_path / "cluster").exists(), "the refusal comes before anything starts"


def test_a_command_it_runs_is_refused_too(tmp_path: Path) -> None:
    up = subprocess.run(
        [sys.executable, "-m", "localcluster", "up", "--nodes", "1"],
        cwd=REPO,
        env=dict(os.environ, GPU_SCHEDULER_CLUSTER_DIR=str(tmp_path / "state")),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert up.returncode != 0
    assert "without the `cluster` mark" in up.stderr, up.stderr
