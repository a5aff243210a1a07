"""The webhook behind the real kube-apiserver: admission over TLS, as kubectl users see it.

The apiserver calls the host-process webhook at https://127.0.0.1:PORT with the generated CA as
caBundle; the StatefulSet controller (kube-controller-manager) creates the pods.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from kube_gpu_scheduler.domain.schedmap import parse, sharing_problems
from kube_gpu_scheduler.domain.sharing import RELEASE_FORBIDS, warning
from kube_gpu_scheduler.webhook.nodes import NodeCache, NodeInfo
from localcluster.cluster import Cluster
from tests.integration.fixtures_webhook import (
    WebhookServer,
    dump,
    kubectl_apply,
    register_webhooks,
    start_webhook,
)
from tests.support.mapcorpus import TASK_MAP
from tests.support.waiting import wait_for

pytestmark = pytest.mark.cluster

ANNOTATION = "gpu-scheduling-map"


def pod(namespace: str, name: str, annotation: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "schedulerName": "gpu-scheduler",
        "containers": [{"name": "main", "image": "busybox"}],
        **spec,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": {ANNOTATION: annotation}},
        "spec": body,
    }


def statefulset(
    namespace: str, name: str, annotation: str, replicas: int, scheduler: str = "gpu-scheduler"
) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": {ANNOTATION: annotation}},
                "spec": {
                    "schedulerName": scheduler,
                    "initContainers": [{"name": "prep", "image": "busybox"}],
                    "containers": [
                        {
                            "name": "main",
                            "image": "busybox",
                            "env": [{"name": "CUDA_VISIBLE_DEVICES", "value": "7"}],
                        }
                    ],
                },
            },
        },
    }


def env_of(cluster: Cluster, namespace: str, name: str) -> dict[str, dict[str, str]]:
    obj = json.loads(cluster.kubectl("get", "pod", name, "-n", namespace, "-o", "json").stdout)
    spec = obj["spec"]
    return {
        c["name"]: {e["name"]: e.get("value", "") for e in c.get("env") or []}
        for c in spec.get("initContainers", []) + spec["containers"]
    }


def test_pod_with_the_map_gets_its_gpus(cluster: Cluster, namespace: str, webhook_configs: str) -> None:
    manifest = pod(
        namespace,
        "train-1",
        "0=node1:0,1\n1=node2:2,3\n",
        initContainers=[{"name": "init", "image": "busybox", "env": [{"name": "A", "value": "1"}]}],
    )
    res = kubectl_apply(cluster, manifest)
    assert res.returncode == 0, res.stderr
    assert "Warning" not in res.stderr
    env = env_of(cluster, namespace, "train-1")
    for container in ("init", "main"):
        assert env[container]["CUDA_VISIBLE_DEVICES"] == "2,3", container
        assert env[container]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID", container
    assert env["init"]["A"] == "1"


def test_pod_without_the_map_is_not_sent_to_the_webhook(
    cluster: Cluster, namespace: str, webhook_configs: str, webhook_server: WebhookServer
) -> None:
    manifest = pod(namespace, "plain-0", "")
    del manifest["metadata"]["annotations"]
    before = webhook_server.proc.log_text().count(f'"pod":"{namespace}/plain-0"')
    assert kubectl_apply(cluster, manifest).returncode == 0
    assert env_of(cluster, namespace, "plain-0") == {"main": {}}
    # matchConditions kept it away: the webhook never logged this pod
    assert webhook_server.proc.log_text().count(f'"pod":"{namespace}/plain-0"') == before


def test_statefulset_replicas_get_their_entries(
    cluster: Cluster, namespace: str, webhook_configs: str
) -> None:
    res = kubectl_apply(cluster, statefulset(namespace, "w", "0=node1:0,1\n1=node2:2\n", replicas=2))
    assert res.returncode == 0, res.stderr
    assert "Warning" not in res.stderr, res.stderr

    def pods_exist() -> bool:
        out = cluster.kubectl("get", "pods", "-n", namespace, "-l", "app=w", "-o", "name", check=False).stdout
        return len(out.split()) == 2

    wait_for(pods_exist, 60, what="the StatefulSet controller to create w-0 and w-1")
    for name, devices in (("w-0", "0,1"), ("w-1", "2")):
        env = env_of(cluster, namespace, name)
        assert env["prep"] == {"CUDA_VISIBLE_DEVICES": devices, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        # the template's conflicting value was replaced in place
        assert env["main"] == {"CUDA_VISIBLE_DEVICES": devices, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def test_malformed_map_statefulset_is_refused_with_the_line(
    cluster: Cluster, namespace: str, webhook_configs: str
) -> None:
    res = kubectl_apply(cluster, statefulset(namespace, "bad", "0=node1:0\n0=node1:1\n", replicas=2))
    assert res.returncode != 0
    assert 'admission webhook "validate-statefulsets.gpu-scheduler.io" denied the request' in res.stderr
    assert "line 2: ordinal 0 is already mapped on line 1 (0=node1:0)" in res.stderr
    assert cluster.kubectl("get", "statefulset", "bad", "-n", namespace, check=False).returncode != 0


def test_the_tasks_map_is_admitted_with_the_warning_and_its_sharers_get_the_same_gpu(
    cluster: Cluster, namespace: str, webhook_configs: str
) -> None:
    """Replicas 3 and 4 share GPU 3 of node4: kubectl prints the warning naming it, and the
    StatefulSet controller's pods 3 and 4 both get CUDA_VISIBLE_DEVICES=3."""
    said = warning(parse(TASK_MAP))
    assert said is not None and "node4:3 by ordinals 3, 4 (lines 4, 5)" in said
    res = kubectl_apply(cluster, statefulset(namespace, "task", TASK_MAP, replicas=5))
    assert res.returncode == 0, res.stderr
    assert f"Warning: {said}" in res.stderr.splitlines(), res.stderr

    def five() -> bool:
        out = cluster.kubectl("get", "pods", "-n", namespace, "-l", "app=task", "-o", "name").stdout
        return len(out.split()) == 5

    wait_for(five, 60, what="the StatefulSet controller to create task-0 to task-4")
    for name, devices in (("task-2", "0,1,2"), ("task-3", "3"), ("task-4", "3")):
        assert env_of(cluster, namespace, name)["main"]["CUDA_VISIBLE_DEVICES"] == devices, name
    # A bare pod of the map is told too.
    bare = pod(namespace, "bare-4", TASK_MAP)
    bare["metadata"]["labels"] = {"apps.kubernetes.io/pod-index": "4"}
    res = kubectl_apply(cluster, bare)
    assert res.returncode == 0, res.stderr
    assert f"Warning: {said}" in res.stderr.splitlines(), res.stderr
    assert env_of(cluster, namespace, "bare-4")["main"]["CUDA_VISIBLE_DEVICES"] == "3"


def test_a_release_that_forbids_sharing_refuses_the_tasks_map(
    cluster: Cluster, namespace: str, webhook_certs: Path, tmp_path: Path
) -> None:
    err = sharing_problems(parse(TASK_MAP), RELEASE_FORBIDS)
    assert err is not None
    with (
        start_webhook(webhook_certs, tmp_path, None, {"GPU_SCHEDULER_ALLOW_SHARING": "false"}) as strict,
        register_webhooks(cluster, namespace, strict),
    ):
        res = kubectl_apply(cluster, statefulset(namespace, "shared", TASK_MAP, replicas=5))
        assert res.returncode != 0
        assert 'admission webhook "validate-statefulsets.gpu-scheduler.io" denied the request' in res.stderr
        assert f"denied the request: {err}" in res.stderr, res.stderr
        assert "sharing.allowed=true" in res.stderr
        res = kubectl_apply(cluster, pod(namespace, "shared-0", TASK_MAP))
        assert res.returncode != 0 and str(err.problems[0]) in res.stderr, res.stderr
        # A map that shares nothing is admitted.
        res = kubectl_apply(cluster, statefulset(namespace, "alone", "0=node1:0\n1=node1:1\n", replicas=2))
        assert res.returncode == 0, res.stderr
    assert cluster.kubectl("get", "statefulset", "shared", "-n", namespace, check=False).returncode != 0


def test_count_entries_are_refused_in_webhook_mode_naming_dra_mode(
    cluster: Cluster, namespace: str, webhook_configs: str
) -> None:
    """A count entry (auto(N)): the webhook cannot choose GPUs, only DRA mode's claim can
    (GPUCountNeedsDRA): the StatefulSet and a bare pod are refused, saying so."""
    text = "0=node1:0\n1=node1:auto(2)\n"
    res = kubectl_apply(cluster, statefulset(namespace, "counted", text, replicas=2))
    assert res.returncode != 0
    assert 'admission webhook "validate-statefulsets.gpu-scheduler.io" denied the request' in res.stderr
    said = "gpu-scheduling-map line 2: replica 1 asks for node1:auto(2): a count of GPUs (auto(N)) is given only in DRA mode"
    assert said in res.stderr, res.stderr
    res = kubectl_apply(cluster, pod(namespace, "counted-1", text))
    assert res.returncode != 0
    assert 'admission webhook "mutate-pods.gpu-scheduler.io" denied the request' in res.stderr
    assert said in res.stderr, res.stderr


def test_malformed_map_pods_fail_creation_with_an_event(
    cluster: Cluster, namespace: str, webhook_server: WebhookServer
) -> None:
    # Only the mutating webhook: the StatefulSet gets in, its pods are refused, the controller says why.
    with register_webhooks(cluster, namespace, webhook_server, validate=False):
        res = kubectl_apply(cluster, statefulset(namespace, "late", "0=node1:0\n\n0=node2:1\n", replicas=1))
        assert res.returncode == 0, res.stderr

        def failed_create() -> str:
            out = cluster.kubectl(
                "get", "events", "-n", namespace, "--field-selector", "reason=FailedCreate", "-o", "json"
            ).stdout
            return " ".join(e["message"] for e in json.loads(out)["items"])

        message = wait_for(failed_create, 60, what="a FailedCreate event")
    assert "invalid gpu-scheduling-map annotation" in message
    assert "line 3: ordinal 0 is already mapped on line 1" in message


def test_pod_requesting_nvidia_gpu_gets_a_warning(
    cluster: Cluster, namespace: str, webhook_configs: str
) -> None:
    manifest = pod(namespace, "greedy-0", "0=node1:1\n")
    manifest["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    res = kubectl_apply(cluster, manifest)
    assert res.returncode == 0, res.stderr
    assert "Warning: this pod also requests nvidia.com/gpu ('main')" in res.stderr
    assert "renumbers them from 0" in res.stderr
    assert env_of(cluster, namespace, "greedy-0")["main"]["CUDA_VISIBLE_DEVICES"] == "1"


def test_deny_policy_refuses_such_a_pod(
    cluster: Cluster, namespace: str, webhook_certs: Path, tmp_path: Path
) -> None:
    env = {"WEBHOOK_GPU_RESOURCE_POLICY": "deny", "WEBHOOK_INJECTION_MODE": "nvidia"}
    with (
        start_webhook(webhook_certs, tmp_path, None, env) as strict,
        register_webhooks(cluster, namespace, strict, validate=False),
    ):
        manifest = pod(namespace, "greedy-0", "0=node1:1,2\n")
        manifest["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
        res = kubectl_apply(cluster, manifest)
        assert res.returncode != 0
        assert 'admission webhook "mutate-pods.gpu-scheduler.io" denied the request' in res.stderr
        assert "renumbered from 0" in res.stderr
        # without the request the pod is admitted, in nvidia mode
        del manifest["spec"]["containers"][0]["resources"]
        assert kubectl_apply(cluster, manifest).returncode == 0
        env = env_of(cluster, namespace, "greedy-0")["main"]
        assert env == {
            "NVIDIA_VISIBLE_DEVICES": "1,2",
            "CUDA_VISIBLE_DEVICES": "0,1",
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        }


def test_statefulset_with_gaps_and_unknown_nodes_gets_warnings(
    cluster: Cluster, namespace: str, webhook_configs: str
) -> None:
    annotation = "0=node1:0\n1=ghost:1\n2=node2:9\n"
    res = kubectl_apply(cluster, statefulset(namespace, "warned", annotation, replicas=4))
    assert res.returncode == 0, res.stderr
    warnings = [line for line in res.stderr.splitlines() if line.startswith("Warning: ")]
    assert any("no entry for ordinal 3 (1 of 4 replicas)" in w for w in warnings), res.stderr
    assert any("node 'ghost' (ordinals 1, line 2) does not exist" in w for w in warnings), res.stderr
    assert any(
        "ordinal 2 wants GPU 9 but node 'node2' has 4 allocatable nvidia.com/gpu" in w for w in warnings
    )
    # an UPDATE is checked too
    fixed = statefulset(namespace, "warned", "0=node1:0\n1=node2:1\n2=node2:2\n3=node3:0\n", replicas=4)
    res = kubectl_apply(cluster, fixed)
    assert res.returncode == 0, res.stderr
    assert "Warning" not in res.stderr, res.stderr


def test_mapped_pod_naming_its_node_is_refused(
    cluster: Cluster, namespace: str, webhook_configs: str
) -> None:
    # It would skip gpu-scheduler's checks and could give a GPU that another replica holds a second user.
    res = kubectl_apply(cluster, pod(namespace, "direct-0", "0=node1:0\n", nodeName="node1"))
    assert res.returncode != 0
    assert 'admission webhook "mutate-pods.gpu-scheduler.io" denied the request' in res.stderr
    assert "spec.nodeName is set ('node1') on a pod carrying gpu-scheduling-map" in res.stderr
    assert "gpu-scheduler binds it to the node its map names" in res.stderr
    assert cluster.kubectl("get", "pod", "direct-0", "-n", namespace, check=False).returncode != 0


def test_mapped_pod_of_another_scheduler_gets_a_warning_and_no_gpus(
    cluster: Cluster, namespace: str, webhook_configs: str
) -> None:
    manifest = pod(namespace, "elsewhere-0", "0=node1:0,1\n")
    del manifest["spec"]["schedulerName"]  # the apiserver defaults it to default-scheduler
    res = kubectl_apply(cluster, manifest)
    assert res.returncode == 0, res.stderr
    assert (
        "Warning: spec.schedulerName is 'default-scheduler', not 'gpu-scheduler': gpu-scheduling-map ignored, "
        "no GPU variables set" in res.stderr
    ), res.stderr
    assert env_of(cluster, namespace, "elsewhere-0") == {"main": {}}


def sts_warnings(cluster: Cluster, namespace: str, annotation: str) -> list[str]:
    """The warnings ``kubectl create --dry-run=server`` prints for a new StatefulSet with this map."""
    name = f"probe-{uuid.uuid4().hex[:6]}"
    manifest = statefulset(namespace, name, annotation, replicas=1)
    res = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=dump(manifest), check=False)
    assert res.returncode == 0, res.stderr
    return [line for line in res.stderr.splitlines() if line.startswith("Warning: ")]


def test_node_warnings_come_from_the_watch_cache(
    cluster: Cluster, namespace: str, webhook_configs: str, webhook_kubeconfig: Path
) -> None:
    # The webhook's identity may list and watch nodes, not get them: warnings that follow the nodes
    # prove that look-ups are answered from the cache, with no per-request GET.
    as_webhook = ("--kubeconfig", str(webhook_kubeconfig))
    assert cluster.kubectl("auth", "can-i", "get", "nodes", *as_webhook, check=False).stdout.strip() == "no"
    for verb in ("list", "watch"):
        assert cluster.kubectl("auth", "can-i", verb, "nodes", *as_webhook).stdout.strip() == "yes"

    late, cpu = f"late-{uuid.uuid4().hex[:6]}", f"cpu-{uuid.uuid4().hex[:6]}"
    missing = f"gpu-scheduling-map: node '{late}' (ordinals 0, line 1) does not exist"
    assert any(missing in w for w in sts_warnings(cluster, namespace, f"0={late}:1\n"))
    try:
        cluster.add_node(late, gpus=2, wait=False)
        cluster.add_node(cpu, gpus=None, wait=False)
        # The same webhook process, not restarted: the watch brings the new nodes in.
        wait_for(
            lambda: not sts_warnings(cluster, namespace, f"0={late}:1\n"),
            30,
            what=f"the webhook to see node {late}",
        )
        [beyond] = sts_warnings(cluster, namespace, f"0={late}:3\n")
        assert f"ordinal 0 wants GPU 3 but node '{late}' has 2 allocatable nvidia.com/gpu" in beyond
        [no_gpus] = sts_warnings(cluster, namespace, f"0={cpu}:0\n")
        assert f"node '{cpu}' reports no nvidia.com/gpu" in no_gpus
        assert "ordinal 0 (line 1) GPU 0" in no_gpus
    finally:
        cluster.delete_node(late)
        cluster.delete_node(cpu)
    # A deleted node is gone from the cache too.
    wait_for(
        lambda: any(missing in w for w in sts_warnings(cluster, namespace, f"0={late}:1\n")),
        30,
        what=f"the webhook to see node {late} deleted",
    )


def test_oversize_map_is_refused_by_the_webhook(
    cluster: Cluster, namespace: str, webhook_configs: str
) -> None:
    # Mutating admission runs before the apiserver validates the object: the webhook meets the
    # oversize annotation first and answers with its own one-line message.
    text = "0=node1:0\n" + "# padding\n" * 30_000
    res = cluster.kubectl("create", "-f", "-", input=json.dumps(pod(namespace, "big-0", text)), check=False)
    assert res.returncode != 0
    assert 'admission webhook "mutate-pods.gpu-scheduler.io" denied the request' in res.stderr
    assert f"gpu-scheduling-map is {len(text)} bytes, more than the 262144-byte limit" in res.stderr
    assert len(res.stderr) < 1000


def test_node_cache_lists_then_watches_the_real_apiserver(cluster: Cluster) -> None:
    cache = NodeCache(str(cluster.kubeconfig), watch_timeout_s=5)
    try:
        cache.start()
        wait_for(lambda: cache.synced, 30, what="the first list")
        assert cache.get("node1") == NodeInfo("node1", 4)
        assert cache.get("no-such-node") is None
        name = f"watched-{uuid.uuid4().hex[:6]}"
        cluster.add_node(name, gpus=8, wait=False)
        wait_for(lambda: cache.get(name) == NodeInfo(name, 8), 30, what=f"the watch to add {name}")
        cluster.delete_node(name)
        wait_for(lambda: cache.get(name) is None, 30, what=f"the watch to delete {name}")
        # The apiserver ends each watch after 5-6 s here; the cache resumes from the last
        # resourceVersion (no relist) and keeps following.
        time.sleep(7)
        cluster.add_node(name, gpus=None, wait=False)
        wait_for(
            lambda: cache.get(name) == NodeInfo(name, None), 30, what=f"a resumed watch to add {name} again"
        )
        cluster.delete_node(name)
        assert cache.lists == 1  # events, not relists
    finally:
        cache.stop()
