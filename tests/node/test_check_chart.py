"""The check chart's pods run the real `gpu-scheduler-check` on the real node.

The real node advertises 4 `nvidia.com/gpu` (an extended resource in its status, as the
upstream docs describe), and a fake NVML (localcluster/fakenvml/fakenvml.c, compiled here) stands
in for the driver's libnvidia-ml.so.1: mounted from the host the way the NVIDIA container
runtime mounts the real one, found through LD_LIBRARY_PATH. Everything else is what a
user runs: the webhook injects the devices, the scheduler binds each replica to the real
node, the check's own pynvml code reads the (fake) GPUs, and `helm test` verifies.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localcluster.node import NODE_NAME
from localcluster.release import CHECK_CHART, REAL_NODE_PLACEMENT, install_chart
from tests.node.conftest import Product
from tests.support import fakenvml
from tests.support.waiting import wait_for

CHECK_NS, CHECK_RELEASE = "gpu-scheduler-tests", "gpu-scheduler-check"
MOUNT = "/opt/fake-nvml"


@pytest.fixture
def fake_nvml_on_host(tmp_path_factory: pytest.TempPathFactory) -> Path:
    lib_dir = fakenvml.build(tmp_path_factory.mktemp("fakenvml-node"))
    # The container runs as uid 65532: the folder and the library must be readable by it.
    lib_dir.chmod(0o755)
    for f in lib_dir.iterdir():
        f.chmod(0o755)
    return lib_dir


def test_check_chart_pods_run_the_real_check_on_the_real_node(
    product: Product, fake_nvml_on_host: Path
) -> None:
    cluster = product.cluster
    cluster.kubectl(
        "patch",
        "node",
        NODE_NAME,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"capacity": {"nvidia.com/gpu": "4"}}}),
    )
    repository, _, tag = product.image.ref.rpartition(":")
    values = {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "replicaCount": 2,
        "gpuScheduling": {
            "schedulingMap": [
                {"podIndex": 0, "nodeName": NODE_NAME, "gpuDevices": "0,1"},
                {"podIndex": 1, "nodeName": NODE_NAME, "gpuDevices": "3"},
            ]
        },
        "tolerations": [
            {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}
        ],
        **REAL_NODE_PLACEMENT[CHECK_CHART],
        "check": {
            "intervalSeconds": 2,
            "extraEnv": [
                {"name": "LD_LIBRARY_PATH", "value": MOUNT},
                *(
                    {"name": k, "value": v}
                    for k, v in fakenvml.nvml_env(Path(MOUNT), gpus=4).items()
                    if k != "LD_LIBRARY_PATH"
                ),
            ],
            "extraVolumes": [
                {"name": "nvml", "hostPath": {"path": str(fake_nvml_on_host), "type": "Directory"}}
            ],
            "extraVolumeMounts": [{"name": "nvml", "mountPath": MOUNT, "readOnly": True}],
        },
    }
    try:
        # The pre-install wait-ready hook runs first, for real, then the StatefulSet.
        install_chart(cluster, CHECK_RELEASE, CHECK_NS, values, chart=CHECK_CHART, wait=True, timeout="240s")
        pods = json.loads(
            cluster.kubectl(
                "get", "pods", "-n", CHECK_NS, "-l", "app.kubernetes.io/component=check", "-o", "json"
            ).stdout
        )["items"]
        assert len(pods) == 2
        for pod in pods:
            name = pod["metadata"]["name"]
            assert pod["spec"]["nodeName"] == NODE_NAME, name
            assert all(c["ready"] for c in pod["status"]["containerStatuses"]), f"{name} is not Ready"
        # What the check itself answers (its /checks, from inside the pod): every check passed,
        # and its pynvml code read the 4 (fake) GPUs through the mounted library.
        probe = "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8080/checks').read().decode())"
        body = json.loads(
            cluster.kubectl("exec", "-n", CHECK_NS, f"{CHECK_RELEASE}-1", "--", "python", "-c", probe).stdout
        )
        assert body["ok"] is True, body["failed"]
        assert body["seen"]["node"] == NODE_NAME and body["seen"]["nvml"] == "ok", body["seen"]
        assert [g["index"] for g in body["seen"]["gpus"]] == [0, 1, 2, 3], body["seen"]
        checks = {c["check"]: c for c in body["checks"]}
        assert checks["env:CUDA_VISIBLE_DEVICES"]["actual"] == "3"
        assert checks["nvml:indices"]["ok"] is True, checks["nvml:indices"]
        # helm test: the verification pod (wait-ready first) on the real node, over the API.
        # --logs prints its output, once: the Pod is the chart's only test hook (its RBAC are
        # objects of the release; as hooks --logs asked for a pod named as each of them).
        test_pod = f"{CHECK_RELEASE}-test"
        res = cluster.helm("test", CHECK_RELEASE, "-n", CHECK_NS, "--timeout", "240s", "--logs", check=False)
        assert res.returncode == 0, res.stdout + res.stderr
        assert res.stdout.count("POD LOGS: ") == 1 and res.stdout.count(f"POD LOGS: {test_pod}\n") == 1, (
            res.stdout
        )
        assert "release matches its maps" in res.stdout.split(f"POD LOGS: {test_pod}", 1)[1], res.stdout
        wait_for(
            lambda: (
                cluster.kubectl(
                    "get",
                    "pod",
                    f"{CHECK_RELEASE}-test",
                    "-n",
                    CHECK_NS,
                    "-o",
                    "jsonpath={.spec.nodeName}",
                    check=False,
                ).stdout
                == NODE_NAME
            ),
            timeout=10,
            what="the verification pod on the real node",
        )
        # `helm uninstall` removes the test RBAC with the release (the kept test pod is a hook: it stays).
        cluster.helm("uninstall", CHECK_RELEASE, "-n", CHECK_NS, "--wait")
        left = cluster.kubectl(
            "get",
            "serviceaccounts,roles,rolebindings",
            "-A",
            "-l",
            f"app.kubernetes.io/instance={CHECK_RELEASE},app.kubernetes.io/component=test",
            "-o",
            "name",
        ).stdout.split()
        assert not left, left
    finally:
        cluster.helm("uninstall", CHECK_RELEASE, "-n", CHECK_NS, "--wait", "--ignore-not-found", check=False)
        cluster.kubectl(
            "delete", "pod", f"{CHECK_RELEASE}-test", "-n", CHECK_NS, "--ignore-not-found", check=False
        )
