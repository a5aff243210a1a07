"""The real node gives the host back what it took, and a second run works.

Runs before the package's own node (tests/node/conftest.py): it starts and stops nodes
of its own, and only one real node runs on a host at a time.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localcluster.cluster import Cluster
from localcluster.image import Image
from localcluster.node import LOCK_FILE, NODE_NAME, NodeUnavailable, RealNode, host_snapshot
from tests.support.waiting import wait_for

POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "sleeper", "namespace": "default"},
    "spec": {
        "nodeName": NODE_NAME,
        "tolerations": [{"operator": "Exists"}],
        "automountServiceAccountToken": True,
        "containers": [
            {
                "name": "sleeper",
                "image": "",
                "imagePullPolicy": "Never",
                "command": ["python", "-c", "import time; time.sleep(3600)"],
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
            }
        ],
        "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "8Mi"}}],
        "terminationGracePeriodSeconds": 1,
    },
}


def _run_once(workdir: Path, image: Image) -> None:
    c = Cluster.start(workdir, gpu_nodes=1, gpus_per_node=4, real_node=True, images=[image.archive])
    try:
        assert c.node is not None
        assert LOCK_FILE.exists()
        # A second node on the same host is refused while this one runs, with the reason.
        with pytest.raises(NodeUnavailable, match="another real node runs on this host"):
            RealNode(workdir.parent / f"{workdir.name}-second", c.node.bins).prepare_host()
        pod = json.loads(json.dumps(POD))
        pod["spec"]["containers"][0]["image"] = image.ref
        c.apply(pod)
        wait_for(
            lambda: (
                c.kubectl(
                    "get",
                    "pod",
                    "sleeper",
                    "-o",
                    "jsonpath={.status.containerStatuses[0].ready}",
                    check=False,
                ).stdout
                == "true"
            ),
            timeout=120,
            what="the sleeper pod Running on the real node",
        )
        # While it runs, the node holds what the snapshot looks at.
        during = host_snapshot()
        assert "gs-cni0" in during["links"]
        assert during["cgroups"], "the kubelet's cgroup root exists while the node runs"
        assert during["mounts"], "pod volumes and root filesystems are mounted while the node runs"
    finally:
        c.stop()


@pytest.mark.slow(reason="the real node stopped and started again", budget=240)
def test_stopping_the_node_gives_the_host_back_and_a_second_run_works(
    tmp_path: Path, product_image: Image
) -> None:
    before = host_snapshot()
    _run_once(tmp_path / "first", product_image)
    assert host_snapshot() == before
    assert not LOCK_FILE.exists()
    _run_once(tmp_path / "second", product_image)
    assert host_snapshot() == before
