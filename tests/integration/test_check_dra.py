"""verify-release in DRA mode against the real apiserver and kube-scheduler, with the check
chart's own helm-test identity (gpuScheduling.injectionMode=dra: get on resourceclaims, list on
resourceslices).

The claims are made with kube_gpu_scheduler.domain.dra.claim_body from the devices each entry resolves to
in the ResourceSlices localcluster/dra.py publishes, and kube-scheduler allocates them, so the
check reads real allocations; a replica whose claim names another GPU than its entry fails.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kube_gpu_scheduler.domain import dra
from kube_gpu_scheduler.domain.schedmap import parse
from localcluster import dra as slices
from localcluster.cluster import REPO, Cluster
from tests.integration.test_check_cluster import (
    CHART_VALUES,
    RELEASE,
    checks_of,
    host_env,
    json_lines,
    render_chart_test,
    table,
)
from tests.support.waiting import wait_for

pytestmark = pytest.mark.cluster


def verify_release(kubeconfig: Path, args: list[str], timeout: int) -> subprocess.CompletedProcess[str]:
    """The chart's test command, from this checkout (``python -m kube_gpu_scheduler.check``)."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "kube_gpu_scheduler.check",
            *args,
            "--timeout",
            str(timeout),
            "--interval",
            "1",
        ],
        env=host_env({"KUBECONFIG": str(kubeconfig), "PYTHONPATH": str(REPO)}),
        capture_output=True,
        text=True,
        timeout=timeout + 60,
        check=False,
    )


SELECTOR_LABELS = {"app.kubernetes.io/name": "gpu-scheduler-check", "app.kubernetes.io/instance": RELEASE}


def replica(cluster: Cluster, namespace: str, name: str, map_text: str, claim_entry_text: str) -> None:
    """Pod ``name`` (the map's entry for its ordinal) with its claim ``<name>-gpus``, made for
    ``claim_entry_text`` (an entry, normally the pod's own) as the gpu-scheduler makes it."""
    ordinal = int(name.rsplit("-", 1)[1])
    entry = parse(map_text)[ordinal]
    claim_entry = next(iter(parse(claim_entry_text).values()))
    stored = json.loads(cluster.kubectl("get", "resourceslices", "-o", "json").stdout)["items"]
    devices = dra.resolve(claim_entry, dra.node_devices(stored, claim_entry.node))
    claim = dra.claim_body(dra.claim_name(name), namespace, claim_entry, devices, owner=None)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                **SELECTOR_LABELS,
                "apps.kubernetes.io/pod-index": str(ordinal),
            },
            "annotations": {"gpu-scheduling-map": map_text},
        },
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": entry.node},
            "resourceClaims": [{"name": dra.POD_CLAIM, "resourceClaimName": dra.claim_name(name)}],
            "containers": [
                {
                    "name": "check",
                    "image": "gpu-scheduler-check",
                    "env": [{"name": "CUDA_DEVICE_ORDER", "value": "PCI_BUS_ID"}],
                    "resources": {"claims": [{"name": dra.POD_CLAIM}]},
                }
            ],
        },
    }
    cluster.apply([claim, pod])

    def running() -> bool:
        got = json.loads(cluster.kubectl("get", "pod", name, "-n", namespace, "-o", "json").stdout)
        return got["status"].get("phase") == "Running"

    wait_for(running, timeout=90, what=f"{name} allocated by kube-scheduler and Running")


@pytest.fixture
def dra_test_identity(cluster: Cluster, namespace: str, tmp_path: Path) -> tuple[Path, list[str]]:
    values = {
        **CHART_VALUES,
        "gpuScheduling": {**CHART_VALUES["gpuScheduling"], "injectionMode": "dra"},
        "waitReady": {"enabled": False},
    }
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    docs = render_chart_test(cluster, namespace, values_file)
    test_pod = next(d for d in docs if d["kind"] == "Pod")
    cluster.apply([d for d in docs if d["kind"] != "Pod"])
    (container,) = test_pod["spec"]["containers"]
    assert container["args"][container["args"].index("--mode") + 1] == "dra"
    sa = test_pod["spec"]["serviceAccountName"]
    return cluster.service_account_kubeconfig(namespace, sa), list(container["args"])


def test_verify_release_checks_each_claims_allocation_against_the_map(
    cluster: Cluster, kube: Any, namespace: str, own_node: Any, dra_test_identity: tuple[Path, list[str]]
) -> None:
    kubeconfig, args = dra_test_identity
    a, b = own_node("ca"), own_node("cb")
    slices.publish(kube, {a: 4, b: 4})
    try:
        map_text = f"0={a}:0,1\n1={b}:2\n2={b}:1\n"
        replica(cluster, namespace, "w-0", map_text, f"0={a}:0,1")
        replica(cluster, namespace, "w-1", map_text, f"1={b}:2")
        res = verify_release(kubeconfig, args, timeout=60)
        assert res.returncode == 0, res.stdout + res.stderr
        rows = table(res.stdout)
        stored = json.loads(cluster.kubectl("get", "resourceslices", "-o", "json").stdout)["items"]
        # Index = PCI bus ID order (the node's name decides whether its minors are in bus order).
        want_a = ",".join(d.name for d in dra.node_devices(stored, a)[:2])
        want_b = dra.node_devices(stored, b)[2].name
        assert (rows["w-0"]["GPUS"], rows["w-0"]["WANT-GPUS"], rows["w-0"]["OK"]) == (want_a, want_a, "yes")
        assert (rows["w-1"]["GPUS"], rows["w-1"]["WANT-GPUS"], rows["w-1"]["OK"]) == (want_b, want_b, "yes")
        checks = checks_of(res.stderr)
        assert checks["dra:allocation"]["ok"] is True and checks["dra:reserved"]["ok"] is True

        # Replica 2's claim names node b's GPU 0 where the map says 1: kube-scheduler allocates
        # what the claim asks, and the check refuses it.
        replica(cluster, namespace, "w-2", map_text, f"2={b}:0")
        res = verify_release(kubeconfig, args, timeout=5)
        assert res.returncode == 1, res.stdout + res.stderr
        failed = {(d["pod"], d["check"]) for d in json_lines(res.stderr) if "check" in d and d["ok"] is False}
        assert failed == {(f"{namespace}/w-2", "dra:allocation")}
        assert table(res.stdout)["w-2"]["OK"] == "NO"
    finally:
        cluster.kubectl("delete", "pods", "--all", "-n", namespace, "--wait=false", check=False)
        slices.delete(kube, [a, b])
