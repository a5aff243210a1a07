"""The device-plugin pitfall is said loudly where `kubectl describe pod` shows it: a Warning event."""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client

from localcluster.cluster import Cluster
from localcluster.procs import ManagedProcess
from tests.integration.fixtures_scheduler import statefulset
from tests.support.kubeapi import pod_events, read_pod
from tests.support.waiting import wait_for


def test_pod_that_also_requests_nvidia_gpu_gets_a_warning_event(
    cluster: Cluster, namespace: str, kube: Any, scheduler: ManagedProcess
) -> None:
    node = f"{namespace}-gpu"
    cluster.add_gpu_node(node, gpus=4)
    try:
        gpu_request = {"limits": {"nvidia.com/gpu": "1"}}
        sts = statefulset("dp", f"0={node}:3", 1)
        sts["spec"]["template"]["spec"]["containers"][0]["resources"] = gpu_request
        plain = statefulset("plain", f"0={node}:1", 1)
        cluster.kubectl(
            "apply",
            "-n",
            namespace,
            "-f",
            "-",
            input=json.dumps({"kind": "List", "apiVersion": "v1", "items": [sts, plain]}),
        )

        warning = wait_for(
            lambda: pod_events(kube, namespace, "dp-0", "GPUResourceRequested"), 60, what="pitfall event"
        )[0]
        assert warning["type"] == "Warning"
        assert "main" in warning["message"] and "renumbers them from 0" in warning["message"]
        # It is still placed as the map says (warn, not deny, is the scheduler's part) ...
        pod = client.CoreV1Api(kube).read_namespaced_pod("dp-0", namespace)
        assert pod.spec.node_name == node
        # ... and a pod without the request gets no such event.
        wait_for(
            # The StatefulSet controller may not have created it yet: absent is "not yet".
            lambda: (read_pod(kube, namespace, "plain-0") or {}).get("spec", {}).get("nodeName"),
            60,
            what="plain-0 bound",
        )
        assert pod_events(kube, namespace, "plain-0", "GPUResourceRequested") == []
    finally:
        cluster.delete_node(node)
