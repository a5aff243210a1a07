"""The real node's name (Cluster.start(real_node_name=...)): ``make demo`` registers it as node4."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from localcluster.cluster import CONTROL_PLANE_NODE, Cluster
from localcluster.node import NODE_NAME, RealNode


def test_the_real_node_keeps_its_name_unless_told() -> None:
    assert inspect.signature(Cluster.start).parameters["real_node_name"].default == NODE_NAME
    assert NODE_NAME == CONTROL_PLANE_NODE == "control-plane"
    assert inspect.signature(RealNode).parameters["name"].default == NODE_NAME


def test_a_real_node_named_as_a_kwok_node_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot be named node3: a kwok GPU node has that name"):
        Cluster.start(tmp_path / "cluster", gpu_nodes=3, real_node=True, real_node_name="node3")
    assert not (tmp_path / "cluster").exists()
