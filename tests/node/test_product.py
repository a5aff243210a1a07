"""What a user installs, running for real: the image from our Dockerfile, as the chart's
Deployments, on the real kubelet node; GPU replicas on the kwok GPU nodes.

Everything is asserted from what runs (the containers' own /proc, the apiserver's view,
requests through Service IPs), never from rendered YAML.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from typing import Any

from kubernetes import client

from localcluster.cluster import Cluster
from localcluster.node import NODE_NAME
from tests.node.conftest import Product
from tests.support.waiting import wait_for

# Run inside each container: who it runs as, what it may do, and whether its root is writable.
PROBE = r"""
import json, os
status = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
try:
    open("/opt/probe-write", "w").close()
    root_writable = True
except OSError as e:
    root_writable = e.strerror
print(json.dumps({
    "uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
    "CapEff": status["CapEff"].strip(), "CapPrm": status["CapPrm"].strip(), "CapBnd": status["CapBnd"].strip(),
    "NoNewPrivs": status["NoNewPrivs"].strip(), "Seccomp": status["Seccomp"].strip(),
    "root_writable": root_writable,
}))
"""


def _statefulset(name: str, entries: list[str], replicas: int | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name},
        "spec": {
            "serviceName": name,
            "replicas": len(entries) if replicas is None else replicas,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {
                    "labels": {"app": name},
                    "annotations": {"gpu-scheduling-map": "\n".join(entries)},
                },
                "spec": {
                    "schedulerName": "gpu-scheduler",
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "main", "image": "registry.invalid/never-pulled:kwok"}],
                },
            },
        },
    }


def _env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for c in pod["spec"]["containers"] for e in c.get("env") or []}


def _pods(cluster: Cluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    return list(cluster.get_json("pods", "-n", namespace, "-l", selector)["items"])


def _expected(entries: list[str]) -> dict[int, tuple[str, str]]:
    out = {}
    for e in entries:
        ordinal, _, rest = e.partition("=")
        node, _, gpus = rest.partition(":")
        out[int(ordinal)] = (node, gpus)
    return out


class BoundSampler(threading.Thread):
    """Samples the namespace's pods every 0.2 s: a pod with a node must carry its map entry's devices,
    and no GPU may be held by two bound pods at once. Violations are collected, not raised."""

    def __init__(self, cluster: Cluster, namespace: str, entries: list[str]) -> None:
        super().__init__(daemon=True)
        self.cluster, self.namespace, self.expected = cluster, namespace, _expected(entries)
        self.violations: list[str] = []
        self.unmutated: dict[str, str] = {}  # uid -> name of pods seen without their devices
        self.samples = 0
        self._stop_evt = threading.Event()

    def run(self) -> None:
        while not self._stop_evt.is_set():
            holders: dict[str, str] = {}
            try:
                pods = _pods(self.cluster, self.namespace, "app")
            except Exception:  # a transient error of the apiserver is no verdict
                time.sleep(0.2)
                continue
            self.samples += 1
            for pod in pods:
                if "CUDA_VISIBLE_DEVICES" not in _env(pod):
                    self.unmutated[pod["metadata"]["uid"]] = pod["metadata"]["name"]
                node = pod["spec"].get("nodeName")
                if not node or pod["status"].get("phase") in ("Succeeded", "Failed"):
                    continue
                name = pod["metadata"]["name"]
                ordinal = int(name.rsplit("-", 1)[1])
                want_node, want_gpus = self.expected[ordinal]
                env = _env(pod)
                if node != want_node or env.get("CUDA_VISIBLE_DEVICES") != want_gpus:
                    self.violations.append(
                        f"{name} bound to {node} with CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')!r} "
                        f"(map: {want_node}:{want_gpus})"
                    )
                for gpu in want_gpus.split(","):
                    key = f"{node}:{gpu}"
                    if key in holders and holders[key] != name:
                        self.violations.append(f"{key} held by {holders[key]} and {name}")
                    holders[key] = name
            time.sleep(0.2)

    def stop(self) -> None:
        self._stop_evt.set()
        self.join(timeout=10)


def test_scheduler_and_webhook_pods_run_on_the_real_node_with_the_restricted_security_context(
    product: Product,
) -> None:
    pods = product.pods()
    components = sorted(p["metadata"]["labels"]["app.kubernetes.io/component"] for p in pods)
    assert components == ["scheduler", "webhook", "webhook"], components
    for pod in pods:
        name = pod["metadata"]["name"]
        assert pod["spec"]["nodeName"] == NODE_NAME, f"{name} is not on the real node"
        assert pod["status"]["phase"] == "Running", name
        assert all(c["ready"] for c in pod["status"]["containerStatuses"]), f"{name} is not Ready"
        # The image our Dockerfile built, never pulled.
        assert pod["status"]["containerStatuses"][0]["image"].endswith(product.image.ref.split("/", 1)[1])
        out = product.cluster.kubectl(
            "exec", "-n", product.namespace, name, "--", "python", "-c", PROBE
        ).stdout
        seen = json.loads(out)
        assert seen["uid"] == 65532 and seen["gid"] == 65532, (name, seen)
        assert seen["CapEff"] == seen["CapPrm"] == seen["CapBnd"] == "0000000000000000", (name, seen)
        assert seen["NoNewPrivs"] == "1", (name, seen)
        assert seen["Seccomp"] == "2", f"{name}: RuntimeDefault seccomp is a filter (mode 2): {seen}"
        assert seen["root_writable"] == "Read-only file system", (name, seen)


def test_the_apiserver_calls_the_webhook_through_its_service(product: Product, node_namespace: str) -> None:
    cluster = product.cluster
    mwc = json.loads(
        cluster.kubectl(
            "get",
            "mutatingwebhookconfigurations",
            "-l",
            f"app.kubernetes.io/instance={product.release}",
            "-o",
            "json",
        ).stdout
    )["items"]
    assert mwc, "the chart registered no MutatingWebhookConfiguration"
    client_config = mwc[0]["webhooks"][0]["clientConfig"]
    assert "url" not in client_config
    assert client_config["service"]["name"] == f"{product.release}-webhook"
    entries = ["0=node1:0,1", "1=node2:2", "2=node3:3"]
    cluster.apply({**_statefulset("svc", entries), "metadata": {"name": "svc", "namespace": node_namespace}})

    def placed() -> bool:
        pods = _pods(cluster, node_namespace, "app=svc")
        return len(pods) == 3 and all(
            (p["spec"].get("nodeName"), _env(p).get("CUDA_VISIBLE_DEVICES")) == _expected(entries)[i]
            and _env(p).get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID"
            for i, p in enumerate(sorted(pods, key=lambda p: p["metadata"]["name"]))
        )

    wait_for(placed, timeout=120, what="the 3 replicas injected by the webhook and bound per the map")
    # `kubectl logs` reaches the kubelet, and a webhook pod's log names an admitted pod.
    logs = "".join(
        cluster.kubectl("logs", "-n", product.namespace, p["metadata"]["name"]).stdout
        for p in product.pods("webhook")
    )
    assert f"{node_namespace}/svc-" in logs, logs[-2000:]


def test_scheduler_health_and_metrics_answer_through_its_service(product: Product) -> None:
    cluster = product.cluster
    ip = cluster.kubectl(
        "get", "service", product.release, "-n", product.namespace, "-o", "jsonpath={.spec.clusterIP}"
    ).stdout.strip()
    # From the host, through kube-proxy's rules, as any client in the cluster.
    with urllib.request.urlopen(f"http://{ip}:8080/healthz", timeout=10) as r:
        health = json.loads(r.read())
    assert health["status"] == "ok", health
    with urllib.request.urlopen(f"http://{ip}:8080/metrics", timeout=10) as r:
        metrics = r.read().decode()
    assert "gpu_scheduler_pods_bound_total" in metrics
    log = cluster.kubectl("logs", "-n", product.namespace, f"deploy/{product.release}").stdout
    assert '"became leader"' in log or "became leader" in log, log[-2000:]


def test_helm_test_passes_with_its_pods_on_the_real_node(product: Product) -> None:
    """The chart's own `helm test`: its pods run on the real node and reach the scheduler's and the
    webhook's Services by their DNS names (cluster DNS: CoreDNS on the node). A passing test pod
    is kept for `helm test --logs`; where they ran is sampled while they run."""
    seen: dict[str, tuple[str | None, str | None]] = {}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for pod in _pods(product.cluster, product.namespace, "app.kubernetes.io/component=test"):
                seen[pod["metadata"]["name"]] = (pod["spec"].get("nodeName"), pod["status"].get("phase"))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        res = product.cluster.helm(
            "test", product.release, "-n", product.namespace, "--timeout", "180s", "--logs"
        )
    finally:
        done.set()
        sampler.join(timeout=30)
    suites = [
        line.split(":", 1)[1].strip() for line in res.stdout.splitlines() if line.startswith("TEST SUITE:")
    ]
    assert f"{product.release}-test-health" in suites and f"{product.release}-test-webhook" in suites, (
        res.stdout
    )
    assert {f"{product.release}-test-health", f"{product.release}-test-webhook"} <= set(seen), seen
    assert {node for node, _ in seen.values()} == {NODE_NAME}, seen
    # Passed and kept (before-hook-creation alone): --logs printed each pod's output.
    for pod in (f"{product.release}-test-health", f"{product.release}-test-webhook"):
        assert f"POD LOGS: {pod}" in res.stdout, res.stdout
    kept = _pods(product.cluster, product.namespace, "app.kubernetes.io/component=test")
    assert {p["status"].get("phase") for p in kept} == {"Succeeded"}, kept


class WebhookKiller(threading.Thread):
    """Kills the webhook containers' processes on the node (SIGKILL through containerd, as an
    OOM kill or a crash would), again each time the kubelet restarts one, until stopped: while
    it runs no webhook answers, whatever the API says of its pods."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.kills = 0
        self._stop_evt = threading.Event()

    def run(self) -> None:
        node = self.cluster.node
        assert node is not None
        while not self._stop_evt.is_set():
            listed = node.ctr(
                "containers", "ls", "-q", 'labels."io.kubernetes.container.name"==webhook', check=False
            )
            for cid in listed.stdout.split():
                if node.ctr("tasks", "kill", "--signal", "SIGKILL", cid, check=False).returncode == 0:
                    self.kills += 1
            self._stop_evt.wait(0.1)

    def stop(self) -> None:
        self._stop_evt.set()
        self.join(timeout=10)


def test_no_pod_is_bound_without_its_devices_while_the_webhook_pods_are_killed(
    product: Product, node_namespace: str
) -> None:
    cluster = product.cluster
    entries = [f"{i}=node{i // 4 + 1}:{i % 4}" for i in range(12)]
    product.wait_serving()
    sampler = BoundSampler(cluster, node_namespace, entries)
    killer = WebhookKiller(cluster)
    sampler.start()
    try:
        # Both webhook replicas die, as in a node's crash, and stay dead while the burst comes:
        # failurePolicy Ignore admits its pods unmutated, and the scheduler must neither bind them
        # nor lose them (it deletes them so that the StatefulSet recreates them through the
        # webhook once it is back).
        killer.start()
        wait_for(lambda: killer.kills >= 2, timeout=30, what="both webhook containers killed on the node")
        cluster.apply(
            {**_statefulset("burst", entries), "metadata": {"name": "burst", "namespace": node_namespace}}
        )
        wait_for(
            lambda: len(sampler.unmutated) >= 3, timeout=60, what="burst pods admitted past the dead webhook"
        )
        killer.stop()

        def all_placed() -> bool:
            pods = _pods(cluster, node_namespace, "app=burst")
            return len(pods) == 12 and all(
                p["spec"].get("nodeName") and p["status"].get("phase") == "Running" for p in pods
            )

        wait_for(all_placed, timeout=240, interval=1, what="all 12 replicas Running once the webhook is back")
    finally:
        killer.stop()
        sampler.stop()
    assert sampler.samples > 5, "the transition was not watched"
    assert sampler.violations == [], sampler.violations[:10]
    # Every replica now runs with its devices: each unmutated pod was replaced, none was bound.
    running = {p["metadata"]["uid"] for p in _pods(cluster, node_namespace, "app=burst")}
    assert not running & sampler.unmutated.keys(), "a pod admitted without its devices is running"
    product.wait_serving()


def _dry_run_pod(cluster: Cluster, namespace: str, i: int) -> dict[str, Any]:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"dry-{i}",
            "namespace": namespace,
            "labels": {"apps.kubernetes.io/pod-index": "1"},
            "annotations": {"gpu-scheduling-map": "0=node1:0\n1=node2:1,2"},
        },
        "spec": {
            "schedulerName": "gpu-scheduler",
            "containers": [{"name": "main", "image": "registry.invalid/never-pulled:kwok"}],
        },
    }
    # `kubectl create --dry-run=server`, through the API client (a process per admission cost
    # more CPU than the admission).
    resp = client.CoreV1Api(cluster.admin_api()).create_namespaced_pod(
        namespace, pod, dry_run="All", _preload_content=False
    )
    return dict(json.loads(resp.data))


def test_helm_upgrade_that_rolls_the_webhook_never_admits_a_mapped_pod_without_devices(
    product: Product, node_namespace: str
) -> None:
    cluster = product.cluster
    results: list[tuple[float, str | None]] = []
    done = threading.Event()

    def admit_continuously() -> None:
        i = 0
        while not done.is_set():
            i += 1
            try:
                env = _env(_dry_run_pod(cluster, node_namespace, i))
            except Exception as e:  # an admission error is a result too
                results.append((time.monotonic(), f"error: {e}"))
            else:
                results.append((time.monotonic(), env.get("CUDA_VISIBLE_DEVICES")))
            done.wait(0.1)  # about as often as a kubectl process a time made them

    product.wait_serving()
    worker = threading.Thread(target=admit_continuously, daemon=True)
    worker.start()
    try:
        time.sleep(2)
        from localcluster.release import install_chart

        # A value that changes the webhook's pod template: both replicas are replaced.
        install_chart(cluster, product.release, product.namespace, product.values(logLevel="DEBUG"))
        product.rollout()
        product.wait_serving()
        time.sleep(3)
    finally:
        done.set()
        worker.join(timeout=60)
        from localcluster.release import install_chart

        install_chart(cluster, product.release, product.namespace, product.values())
        product.rollout()
        product.wait_serving()
    assert len(results) > 20, f"only {len(results)} admissions were made during the roll"
    missing = [r for r in results if r[1] != "1,2"]
    assert missing == [], f"{len(missing)} of {len(results)} admissions without devices: {missing[:5]}"


def test_helm_uninstall_leaves_nothing_behind(product: Product) -> None:
    cluster = product.cluster
    cluster.helm("uninstall", product.release, "-n", product.namespace, "--wait", "--timeout", "120s")
    # helm uninstall leaves hooks, the helm test pods kept for --logs among them: removed as
    # docs/charts.md "helm test" says.
    cluster.kubectl(
        "delete",
        "pod",
        "-n",
        product.namespace,
        "-l",
        f"app.kubernetes.io/instance={product.release},app.kubernetes.io/component=test",
        "--ignore-not-found",
    )
    kinds = (
        "deployments,replicasets,pods,services,endpointslices,serviceaccounts,secrets,configmaps,roles,"
        "rolebindings,leases,poddisruptionbudgets,networkpolicies"
    )
    selector = f"app.kubernetes.io/instance={product.release}"
    cluster_kinds = (
        "clusterroles,clusterrolebindings,mutatingwebhookconfigurations,validatingwebhookconfigurations,"
        "validatingadmissionpolicies,validatingadmissionpolicybindings"
    )

    def left() -> list[str]:
        out = cluster.kubectl(
            "get", kinds, "-n", product.namespace, "-l", selector, "-o", "name"
        ).stdout.split()
        return out + cluster.kubectl("get", cluster_kinds, "-l", selector, "-o", "name").stdout.split()

    # Cluster-scoped objects and the workloads go at once; the pods once their grace period
    # (the webhook's preStop sleep and drain) is over.
    assert not [o for o in left() if not o.startswith("pod/")], left()
    wait_for(lambda: left() == [], timeout=120, interval=2, what="every object of the release gone")
    # The containers are gone from the node too (NVIDIA's DRA driver, in its own namespace, stays).
    node = cluster.node
    assert node is not None
    ours = f'labels."io.kubernetes.pod.namespace"=={product.namespace}'

    def running() -> list[str]:
        mine = set(node.ctr("containers", "ls", "-q", ours).stdout.split())
        tasks = [line.split() for line in node.ctr("tasks", "ls").stdout.splitlines()[1:]]
        return [t[0] for t in tasks if t and t[0] in mine and "RUNNING" in t]

    wait_for(
        lambda: not running(),
        timeout=90,
        what=f"no container of {product.namespace} running on the real node",
    )
