"""Extender mode against the real control plane.

The local control plane's own kube-scheduler binary runs the KubeSchedulerConfiguration
that gpu-scheduler-chart renders (``helm template`` with ``extender.enabled``), with a
token of the chart's kube-scheduler ServiceAccount; it calls the real ``gpu-scheduler``
program, a host process in ``GPU_SCHEDULER_MODE=extender`` with the chart's scheduler
RBAC, over TLS. Only two fields of the rendered configuration are the test's: the
kubeconfig (in a pod it is the in-cluster one) and the extender URL (``extender.url``,
the host process). The session's own kube-scheduler (``default-scheduler``) never sees
these pods: their ``schedulerName`` is the chart's profile.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster.cluster import Cluster, free_port, tool
from localcluster.pki import LocalPKI
from localcluster.procs import ManagedProcess
from localcluster.rbac import LEASE_NAME, SCHEDULER_SA, chart_identity, render_chart
from localcluster.scheduler_host import run_scheduler
from tests.integration.fixtures_scheduler import metric, statefulset
from tests.support.charts import one
from tests.support.kubeapi import failed_scheduling as _failed_scheduling
from tests.support.kubeapi import pod_events, read_pod
from tests.support.waiting import wait_for

# The profile's name (scheduler.name): not the standalone tests' name, so no other
# scheduler process of this session ever sees these pods.
PROFILE = "gpu-extender"


@dataclass
class ExtenderMode:
    gpu_scheduler: ManagedProcess
    kube_scheduler: ManagedProcess
    config: dict[str, Any]


def _running_on(kube: Any, ns: str, name: str) -> dict[str, Any] | None:
    pod = read_pod(kube, ns, name)
    if pod and pod["spec"].get("nodeName") and pod["status"].get("phase") == "Running":
        return pod
    return None


@pytest.fixture
def extender_mode(cluster: Cluster, namespace: str, tmp_path: Path) -> Iterator[ExtenderMode]:
    pki = LocalPKI(tmp_path / "extender-pki")
    crt, key = pki.issue("extender", "gpu-scheduler-extender", ips=("127.0.0.1",), server=True)
    port = free_port()
    release = f"gx-{namespace}"
    values = {
        "serviceAccount": {"name": SCHEDULER_SA},
        "scheduler": {"name": PROFILE, "leaderElection": {"leaseName": LEASE_NAME}},
        "extender": {
            "enabled": True,
            "url": f"https://127.0.0.1:{port}",
            "tls": {"caBundle": base64.b64encode(pki.ca_file.read_bytes()).decode()},
        },
    }
    docs = render_chart(cluster, release, namespace, values)
    config_map = one(docs, "ConfigMap", f"{release}-gpu-scheduler-kube-scheduler")
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    with (
        chart_identity(cluster, namespace, "scheduler", release, values) as ours,
        chart_identity(cluster, namespace, "kube-scheduler", release, values) as theirs,
    ):
        gpu_scheduler = run_scheduler(
            ours.kubeconfig,
            env={
                "POD_NAME": "extender-a",
                "POD_NAMESPACE": namespace,
                "GPU_SCHEDULER_NAME": PROFILE,
                "GPU_SCHEDULER_MODE": "extender",
                "GPU_SCHEDULER_EXTENDER_ADDRESS": "127.0.0.1",
                "GPU_SCHEDULER_EXTENDER_PORT": str(port),
                "GPU_SCHEDULER_EXTENDER_TLS_CERT_FILE": str(crt),
                "GPU_SCHEDULER_EXTENDER_TLS_KEY_FILE": str(key),
                "GPU_SCHEDULER_LOG_LEVEL": "DEBUG",
                # No webhook in these tests (the scheduler-only install).
                "GPU_SCHEDULER_REQUIRE_INJECTION": "false",
            },
            log_path=tmp_path / "gpu-scheduler.log",
        )
        run_config = {**config, "clientConnection": {"kubeconfig": str(theirs.kubeconfig)}}
        config_file = tmp_path / "kube-scheduler.yaml"
        config_file.write_text(yaml.safe_dump(run_config))
        secure_port = free_port()
        kube_scheduler = ManagedProcess(
            "kube-scheduler-extender",
            [
                tool("kube-scheduler"),
                f"--config={config_file}",
                f"--authentication-kubeconfig={theirs.kubeconfig}",
                f"--authorization-kubeconfig={theirs.kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={secure_port}",
                f"--cert-dir={tmp_path / 'kube-scheduler-certs'}",
                "--v=2",
            ],
            log_path=tmp_path / "kube-scheduler.log",
        ).start()
        try:
            kube_scheduler.wait_http(f"https://127.0.0.1:{secure_port}/readyz", timeout=60, insecure=True)
            lease = config["leaderElection"]["resourceName"]

            def holder() -> str:
                get = ("get", "lease", lease, "-n", namespace, "-o", "jsonpath={.spec.holderIdentity}")
                return cluster.kubectl(*get, check=False).stdout.strip()

            wait_for(holder, 60, what="kube-scheduler leads (its Lease from the chart's Role)")
            yield ExtenderMode(gpu_scheduler, kube_scheduler, config)
        finally:
            kube_scheduler.stop()
            gpu_scheduler.stop()
            for proc in (kube_scheduler, gpu_scheduler):
                print(f"--- {proc.log_path} (last 60 lines) ---\n{proc.log_text(60)}")


def test_rendered_configuration_names_the_profile_and_the_extender(extender_mode: ExtenderMode) -> None:
    config = extender_mode.config
    assert [p["schedulerName"] for p in config["profiles"]] == [PROFILE]
    (ext,) = config["extenders"]
    assert ext["filterVerb"] == "filter" and ext["bindVerb"] == "bind"
    assert ext["nodeCacheCapable"] is True and ext["enableHTTPS"] is True
    assert ext["ignorable"] is False
    assert config["percentageOfNodesToScore"] == 100


def test_kube_scheduler_places_a_mapped_statefulset_exactly(
    cluster: Cluster, namespace: str, kube: Any, extender_mode: ExtenderMode
) -> None:
    smap = "0=node1:0,1\n1=node2:2\n2=node3:3"
    sts = statefulset("w", smap, 3, scheduler_name=PROFILE)
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(sts))
    expected = {"w-0": "node1", "w-1": "node2", "w-2": "node3"}

    def all_running() -> bool:
        pods = {name: _running_on(kube, namespace, name) for name in expected}
        if not all(pods.values()):
            return False
        for name, pod in pods.items():
            assert pod is not None and pod["spec"]["nodeName"] == expected[name], name
        return True

    wait_for(all_running, 90, what="3 replicas Running on their mapped nodes")
    for name, node in expected.items():
        # kube-scheduler (the profile) reports the placement; the extender made the Binding.
        scheduled = pod_events(kube, namespace, name, "Scheduled")
        assert scheduled and node in scheduled[0]["message"], scheduled
    proc = extender_mode.gpu_scheduler
    assert metric(proc, "gpu_scheduler_extender_requests_total", 'result="ok",verb="bind"') == 3
    assert metric(proc, "gpu_scheduler_pods_bound_total") == 3
    assert metric(proc, "gpu_scheduler_extender_requests_total", 'result="ok",verb="filter"') >= 3


def test_a_gpu_already_held_is_refused_with_the_holder_named(
    cluster: Cluster, namespace: str, kube: Any, extender_mode: ExtenderMode
) -> None:
    cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=json.dumps(statefulset("a", "0=node1:3", 1, PROFILE))
    )
    wait_for(lambda: _running_on(kube, namespace, "a-0"), 90, what="a-0 Running on node1")
    cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=json.dumps(statefulset("b", "0=node1:2,3", 1, PROFILE))
    )
    ev = wait_for(
        lambda: _failed_scheduling(kube, namespace, "b-0", "GPUInUse", "node1:3", f"{namespace}/a-0"),
        60,
        what="b-0 refused: GPU node1:3 held by a-0",
    )
    # The other nodes are named as not mapped, in one line.
    assert "NotMappedNode: replica 0 is mapped to node1:2,3" in ev["message"], ev["message"]
    pod = read_pod(kube, namespace, "b-0")
    assert pod is not None and not pod["spec"].get("nodeName")
    assert (
        metric(
            extender_mode.gpu_scheduler,
            "gpu_scheduler_extender_requests_total",
            'result="refused",verb="filter"',
        )
        >= 1
    )


def test_a_standard_filter_standalone_mode_lacks_keeps_the_pod_pending(
    cluster: Cluster, namespace: str, kube: Any, extender_mode: ExtenderMode
) -> None:
    """Required inter-pod anti-affinity: standalone mode binds by the map alone; here
    kube-scheduler's InterPodAffinity filter removes the mapped node first."""
    blocker = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "blocker", "labels": {"role": "blocker"}},
        "spec": {
            "nodeName": "node2",
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
        },
    }
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(blocker))
    wait_for(lambda: _running_on(kube, namespace, "blocker"), 60, what="blocker Running on node2")
    anti = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"role": "blocker"}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
    sts = statefulset("c", "0=node2:0", 1, PROFILE, affinity=anti)
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(sts))
    wait_for(
        lambda: _failed_scheduling(kube, namespace, "c-0", "anti-affinity"),
        60,
        what="c-0 refused by kube-scheduler's anti-affinity filter",
    )
    pod = read_pod(kube, namespace, "c-0")
    assert pod is not None and not pod["spec"].get("nodeName")

    # The cause goes: the pod lands on its mapped node, through the extender.
    cluster.kubectl("delete", "pod", "blocker", "-n", namespace, "--grace-period=0", "--force")
    placed = wait_for(lambda: _running_on(kube, namespace, "c-0"), 90, what="c-0 bound once the blocker left")
    assert placed["spec"]["nodeName"] == "node2"
