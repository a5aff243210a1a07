"""The promise under attack and bad luck: each replica gets exactly its GPUs, no GPU twice.

Webhook and scheduler run together as host processes against the real
apiserver, the scheduler requiring the webhook's injection (as the chart sets
it when the webhook is enabled), the webhook registered with
``failurePolicy: Ignore`` (the chart's default), so an outage admits pods
without their variables. Tenants are real ServiceAccounts with pod rights in
their own namespace.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import ssl
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from localcluster.cluster import Cluster, free_port
from localcluster.procs import ManagedProcess
from localcluster.webhook_host import run_webhook
from tests.integration.fixtures_scheduler import metric, statefulset
from tests.integration.fixtures_webhook import webhook_configurations
from tests.support.waiting import wait_for

pytestmark = pytest.mark.cluster

MAP = "gpu-scheduling-map"
INJECTED = {"GPU_SCHEDULER_REQUIRE_INJECTION": "true"}


# -- helpers -------------------------------------------------------------------------------------


def mapped_pod(name: str, smap: str, namespace: str | None = None, **annotations: str) -> dict[str, Any]:
    """A bare pod of the gpu-scheduler carrying ``smap`` (and any other annotations)."""
    meta: dict[str, Any] = {"name": name, "annotations": {MAP: smap, **annotations}}
    if namespace:
        meta["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"schedulerName": "gpu-scheduler", "containers": [{"name": "c", "image": "x"}]},
    }


def pods_of(kube: Any, namespace: str) -> list[dict[str, Any]]:
    resp = client.CoreV1Api(kube).list_namespaced_pod(namespace, _preload_content=False)
    return list(json.loads(resp.data)["items"])


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0].get("env") or []}


def events(kube: Any, namespace: str, reason: str) -> list[dict[str, Any]]:
    resp = client.CoreV1Api(kube).list_namespaced_event(
        namespace, field_selector=f"reason={reason}", _preload_content=False
    )
    return list(json.loads(resp.data)["items"])


def holdings(kube: Any, namespaces: list[str]) -> dict[tuple[str, int], list[str]]:
    """``(node, gpu) -> [pods]`` over every active bound pod, from nodeName and the injected env."""
    held: dict[tuple[str, int], list[str]] = {}
    for ns in namespaces:
        for pod in pods_of(kube, ns):
            node = pod["spec"].get("nodeName")
            if not node or pod["status"].get("phase") in ("Succeeded", "Failed"):
                continue
            devices = env_of(pod).get("CUDA_VISIBLE_DEVICES", "")
            for gpu in filter(None, devices.split(",")):
                held.setdefault((node, int(gpu)), []).append(f"{ns}/{pod['metadata']['name']}")
    return held


def assert_no_gpu_twice(kube: Any, namespaces: list[str]) -> None:
    twice = {f"{n}:{g}": who for (n, g), who in holdings(kube, namespaces).items() if len(who) > 1}
    assert not twice, f"GPUs held by more than one pod: {twice}"


def assert_bound_pods_carry_their_devices(
    kube: Any, namespace: str, smap: dict[int, tuple[str, str]]
) -> None:
    """Nothing bound without its devices: every bound pod is on its mapped node with its GPUs."""
    for pod in pods_of(kube, namespace):
        if not pod["spec"].get("nodeName"):
            continue
        ordinal = int(pod["metadata"]["labels"]["apps.kubernetes.io/pod-index"])
        node, devices = smap[ordinal]
        name = pod["metadata"]["name"]
        assert pod["spec"]["nodeName"] == node, f"{name} bound to {pod['spec']['nodeName']}, mapped to {node}"
        env = env_of(pod)
        assert env.get("CUDA_VISIBLE_DEVICES") == devices, f"{name} bound with env {env}"
        assert env.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID", name


def all_running_with_devices(kube: Any, namespace: str, expect: dict[str, tuple[str, str]]) -> bool:
    """Every named pod (``name -> (node, devices)``) Running on its node with its devices."""
    pods = {
        p["metadata"]["name"]: p
        for p in pods_of(kube, namespace)
        if not p["metadata"].get("deletionTimestamp")
    }
    for name, (node, devices) in expect.items():
        pod = pods.get(name)
        if pod is None or pod["status"].get("phase") != "Running" or pod["spec"].get("nodeName") != node:
            return False
        if env_of(pod).get("CUDA_VISIBLE_DEVICES") != devices:
            return False
    return True


def named(prefix: str, smap: dict[int, tuple[str, str]]) -> dict[str, tuple[str, str]]:
    return {f"{prefix}-{i}": v for i, v in smap.items()}


class Webhook:
    """The webhook on a fixed port, so it can be stopped and started again behind one configuration."""

    def __init__(self, certs: Path, kubeconfig: Path, log_dir: Path) -> None:
        self.certs, self.kubeconfig, self.log_dir = certs, kubeconfig, log_dir
        self.port = free_port()
        self.proc: ManagedProcess | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.starts += 1
        self.proc = run_webhook(
            self.certs,
            self.port,
            env={"KUBECONFIG": str(self.kubeconfig), "WEBHOOK_LOG_LEVEL": "INFO"},
            log_path=self.log_dir / f"webhook-{self.port}-{self.starts}.log",
        )

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None


@pytest.fixture
def webhook(webhook_certs: Path, webhook_kubeconfig: Path, tmp_path: Path) -> Iterator[Webhook]:
    hook = Webhook(webhook_certs, webhook_kubeconfig, tmp_path)
    yield hook
    hook.stop()


@contextlib.contextmanager
def ignore_policy_configs(cluster: Cluster, namespaces: list[str], hook: Webhook) -> Iterator[None]:
    """The mutating configuration as the chart renders it by default: failurePolicy Ignore."""
    name = f"gpu-scheduler-trust-{uuid.uuid4().hex[:6]}"

    class _Server:
        url = hook.url
        ca_bundle = __import__("localcluster.webhook_host", fromlist=["ca_bundle"]).ca_bundle(hook.certs)

    mutating, _ = webhook_configurations(name, namespaces[0], _Server)  # type: ignore[arg-type]
    rule = mutating["webhooks"][0]
    rule["failurePolicy"] = "Ignore"
    rule["timeoutSeconds"] = 5
    rule["namespaceSelector"] = {
        "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": namespaces}]
    }
    cluster.apply(mutating)
    try:
        yield
    finally:
        cluster.kubectl("delete", "mutatingwebhookconfiguration", name, "--ignore-not-found", check=False)


def wait_webhook_live(cluster: Cluster, namespace: str) -> None:
    """Until a server-side dry-run of a mapped pod comes back injected (the apiserver calls it)."""
    probe = mapped_pod("probe-0", "0=node1:3\n", namespace)

    def live() -> bool:
        res = cluster.kubectl(
            "create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(probe), check=False
        )
        if res.returncode != 0:
            return False
        return "CUDA_VISIBLE_DEVICES" in json.dumps(json.loads(res.stdout)["spec"])

    wait_for(live, 60, what="the webhook to be called by the apiserver")


@pytest.fixture
def other_namespace(cluster: Cluster) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    cluster.wait_until(
        lambda: bool(cluster.get_json("serviceaccount", "default", "-n", name)),
        60,
        f"the default ServiceAccount of {name}",
    )
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def gpu_nodes(cluster: Cluster, own_node: Callable[..., str]) -> Callable[[int, int], list[str]]:
    made: list[str] = []

    def make(count: int, gpus: int) -> list[str]:
        names = [own_node(f"n{len(made) + i}", gpus=gpus, wait=False) for i in range(count)]
        made.extend(names)
        for name in names:
            cluster.wait_node_ready(name)
        return names

    return make


def tenant_kubeconfig(cluster: Cluster, namespace: str) -> Path:
    """A tenant: a ServiceAccount that may create, patch and delete pods in its own namespace."""
    cluster.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": "tenant", "namespace": namespace},
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": "tenant", "namespace": namespace},
                "rules": [
                    {
                        "apiGroups": [""],
                        "resources": ["pods"],
                        "verbs": ["get", "list", "create", "patch", "update", "delete"],
                    }
                ],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "tenant", "namespace": namespace},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant"},
                "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": namespace}],
            },
        ]
    )
    return cluster.service_account_kubeconfig(namespace, "tenant")


# -- tenants who edit annotations ------------------------------------------------------------------


def test_tenant_annotations_can_neither_squat_nor_free_a_gpu(
    cluster: Cluster,
    namespace: str,
    other_namespace: str,
    kube: Any,
    webhook: Webhook,
    start_scheduler: Callable[..., ManagedProcess],
    gpu_nodes: Callable[[int, int], list[str]],
) -> None:
    [node] = gpu_nodes(1, 2)
    webhook.start()
    with ignore_policy_configs(cluster, [namespace, other_namespace], webhook):
        wait_webhook_live(cluster, namespace)
        sched = start_scheduler(**INJECTED)
        tenant = tenant_kubeconfig(cluster, other_namespace)

        # (a) A pending pod with no ordinal and a forged record of node:0 (the old ledger's annotation).
        squatter = mapped_pod("squatter", f"0={node}:0", **{"gpu-scheduler/assigned": f"{node}:0"})
        res = cluster.kubectl(
            "apply",
            "-n",
            other_namespace,
            "-f",
            "-",
            input=json.dumps(squatter),
            kubeconfig=tenant,
            check=False,
        )
        # Refused by the chart's admission policy where it is installed; harmless where it is not.
        smap = {0: (node, "0")}
        cluster.kubectl(
            "apply", "-n", namespace, "-f", "-", input=json.dumps(statefulset("w", f"0={node}:0", 1))
        )
        wait_for(
            lambda: all_running_with_devices(kube, namespace, named("w", smap)),
            60,
            what=f"w-0 Running on {node}:0",
        )
        if res.returncode == 0:
            events_ = events(kube, namespace, "FailedScheduling")
            assert not any("squatter" in (e.get("message") or "") for e in events_), events_

        # (b) The tenant rewrites every annotation of a running pod of theirs; nothing is freed.
        victim_map = f"0={node}:1"
        victim = mapped_pod("mine-0", victim_map)
        cluster.kubectl(
            "apply", "-n", other_namespace, "-f", "-", input=json.dumps(victim), kubeconfig=tenant
        )
        wait_for(
            lambda: all_running_with_devices(kube, other_namespace, {"mine-0": (node, "1")}),
            60,
            what=f"mine-0 Running on {node}:1",
        )
        for patch in (
            {"metadata": {"annotations": {"gpu-scheduler/assigned": f"{node}:0"}}},
            {"metadata": {"annotations": {MAP: f"0={node}:0"}}},
            {"metadata": {"annotations": {MAP: None}}},
        ):
            cluster.kubectl(
                "patch", "pod", "mine-0", "-n", other_namespace, "--type=merge", "-p", json.dumps(patch),
                kubeconfig=tenant, check=False,
            )  # fmt: skip
        # Another replica mapped to the GPU mine-0 runs on must still wait for it.
        cluster.kubectl(
            "apply", "-n", namespace, "-f", "-", input=json.dumps(statefulset("x", f"0={node}:1", 1))
        )
        wait_for(
            lambda: any("x-0" in (e.get("regarding") or e.get("involvedObject") or {}).get("name", "")
                        and "GPUInUse" in (e.get("message") or "")
                        for e in events(kube, namespace, "FailedScheduling")),
            30,
            what="x-0 refused with GPUInUse",
        )  # fmt: skip
        time.sleep(3)  # a wrong bind would have happened by now
        assert_no_gpu_twice(kube, [namespace, other_namespace])
        x0 = client.CoreV1Api(kube).read_namespaced_pod("x-0", namespace)
        assert not x0.spec.node_name, "x-0 was bound onto a GPU that mine-0 still holds"
        # The holder goes: the waiting replica binds at once.
        cluster.kubectl("delete", "pod", "mine-0", "-n", other_namespace, "--wait=false", kubeconfig=tenant)
        wait_for(
            lambda: (
                all_running_with_devices(kube, namespace, {0: (node, "1")})
                or any(
                    p["metadata"]["name"] == "x-0" and p["spec"].get("nodeName")
                    for p in pods_of(kube, namespace)
                )
            ),
            60,
            what="x-0 bound once mine-0 is gone",
        )
        assert_no_gpu_twice(kube, [namespace, other_namespace])
        assert sched.running()


# -- the webhook down under failurePolicy Ignore ----------------------------------------------------


def test_pods_admitted_without_injection_are_never_bound_and_heal_when_the_webhook_returns(
    cluster: Cluster,
    namespace: str,
    kube: Any,
    webhook: Webhook,
    start_scheduler: Callable[..., ManagedProcess],
    gpu_nodes: Callable[[int, int], list[str]],
) -> None:
    nodes = gpu_nodes(2, 4)
    smap = {i: (nodes[i % 2], str(i // 2)) for i in range(6)}
    text = "".join(f"{i}={n}:{g}\n" for i, (n, g) in smap.items())
    webhook.start()
    with ignore_policy_configs(cluster, [namespace], webhook):
        wait_webhook_live(cluster, namespace)
        webhook.stop()  # outage: the apiserver admits mapped pods unchanged
        sched = start_scheduler(**INJECTED, GPU_SCHEDULER_BACKOFF_INITIAL="1", GPU_SCHEDULER_BACKOFF_MAX="4")
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(statefulset("w", text, 6)))

        # While it is down: NotInjected events, recreations, a metric, and nothing bound.
        wait_for(lambda: events(kube, namespace, "NotInjected"), 30, what="a NotInjected event")
        wait_for(lambda: metric(sched, "gpu_scheduler_pods_recreated_total") >= 6, 30, what="recreations")
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            assert_bound_pods_carry_their_devices(kube, namespace, smap)
            assert not any(p["spec"].get("nodeName") for p in pods_of(kube, namespace))
            time.sleep(0.5)
        assert metric(sched, "gpu_scheduler_not_injected_pods_total") >= 6
        assert metric(sched, "gpu_scheduler_pods_bound_total") == 0
        message = events(kube, namespace, "NotInjected")[0]["message"]
        assert "without the webhook's GPU variables" in message, message
        assert "StatefulSet w" in message, message

        # It comes back: every replica ends Running on its node with its devices.
        webhook.start()
        wait_for(
            lambda: all_running_with_devices(kube, namespace, named("w", smap)),
            90,
            what="every replica healed",
        )
        assert_bound_pods_carry_their_devices(kube, namespace, smap)
        assert_no_gpu_twice(kube, [namespace])
        assert metric(sched, "gpu_scheduler_pods_bound_total") == 6


def test_a_bare_pod_admitted_without_injection_waits_with_its_event(
    cluster: Cluster,
    namespace: str,
    kube: Any,
    start_scheduler: Callable[..., ManagedProcess],
    gpu_nodes: Callable[[int, int], list[str]],
) -> None:
    [node] = gpu_nodes(1, 1)
    start_scheduler(**INJECTED)
    pod = mapped_pod("bare-0", f"0={node}:0")
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(pod))
    ev = wait_for(lambda: events(kube, namespace, "NotInjected"), 30, what="NotInjected on bare-0")
    assert "it has no controller" in ev[0]["message"]
    time.sleep(2)
    current = client.CoreV1Api(kube).read_namespaced_pod("bare-0", namespace)
    assert current.status.phase == "Pending" and not current.spec.node_name
    [cond] = [c for c in current.status.conditions or [] if c.type == "PodScheduled"]
    assert cond.status == "False" and "NotInjected" in cond.message


# -- the bounded soak ---------------------------------------------------------------------------------


def _idle_connections(port: int, count: int, tls: bool) -> list[socket.socket]:
    """``count`` connections that never send a request (TLS ones finish the handshake first)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    out: list[socket.socket] = []
    for _ in range(count):
        try:
            raw = socket.create_connection(("127.0.0.1", port), timeout=2)
            out.append(ctx.wrap_socket(raw) if tls else raw)
        except OSError:
            continue
    return out


@pytest.mark.slow(reason="a soak: restarts under a connection flood for a fixed time", budget=240)
def test_soak_webhook_and_scheduler_restarts_under_an_idle_connection_flood(
    cluster: Cluster,
    namespace: str,
    kube: Any,
    webhook: Webhook,
    start_scheduler: Callable[..., ManagedProcess],
    gpu_nodes: Callable[[int, int], list[str]],
) -> None:
    """About 60 s of trouble, then every one of 200 pods Running on its node with its devices.

    200 pods in 4 StatefulSets over 25 nodes x 8 GPUs; an idle-connection flood on
    the webhook (TLS and raw TCP) for the whole run; the webhook stopped and started
    twice (pods created meanwhile are admitted without injection); the scheduler
    killed with SIGKILL twice (no Lease release, no clean-up).
    """
    nodes = gpu_nodes(25, 8)
    per_set = 50
    maps: dict[str, dict[int, tuple[str, str]]] = {}
    for s in range(4):
        # Set s takes GPUs 2s and 2s+1 of every node: two replicas of each set per node.
        maps[f"s{s}"] = {i: (nodes[i % 25], str(2 * s + i // 25)) for i in range(per_set)}
    settings = {
        **INJECTED,
        "GPU_SCHEDULER_BACKOFF_INITIAL": "0.5",
        "GPU_SCHEDULER_BACKOFF_MAX": "5",
        "GPU_SCHEDULER_LEASE_DURATION": "4",
        "GPU_SCHEDULER_RENEW_DEADLINE": "3",
        "GPU_SCHEDULER_RETRY_PERIOD": "1",
    }
    flood: list[socket.socket] = []
    kills = 0
    webhook.start()
    with ignore_policy_configs(cluster, [namespace], webhook):
        wait_webhook_live(cluster, namespace)
        sched = start_scheduler(**settings)

        def kill_scheduler() -> None:
            nonlocal sched, kills
            os.kill(sched.pid, signal.SIGKILL)
            kills += 1
            wait_for(lambda: not sched.running(), 10, what="the scheduler to die")
            time.sleep(2)  # pods created meanwhile wait for the next one
            sched = start_scheduler(identity=f"replica-{kills}", **settings)

        def restart_webhook() -> None:
            webhook.stop()
            time.sleep(3)  # pods created meanwhile are admitted without their variables
            webhook.start()

        start = time.monotonic()
        try:
            flood = _idle_connections(webhook.port, 64, tls=True) + _idle_connections(
                webhook.port, 64, tls=False
            )
            for s, smap in maps.items():
                text = "".join(f"{i}={n}:{g}\n" for i, (n, g) in smap.items())
                cluster.kubectl(
                    "apply", "-n", namespace, "-f", "-", input=json.dumps(statefulset(s, text, per_set))
                )
            for step in (restart_webhook, kill_scheduler, restart_webhook, kill_scheduler):
                time.sleep(5)
                step()
                flood += _idle_connections(webhook.port, 16, tls=True)
                assert_no_gpu_twice(kube, [namespace])
                _partial(kube, namespace, maps)
            # Scale one set down and up again while things settle: replicas come back exactly.
            cluster.kubectl("scale", "-n", namespace, "statefulset/s0", "--replicas=25")
            cluster.kubectl("scale", "-n", namespace, "statefulset/s0", "--replicas=50")
            assert kills == 2 and webhook.starts == 3
            for s, smap in maps.items():
                wait_for(
                    lambda s=s, smap=smap: _set_done(kube, namespace, s, smap),
                    240,
                    what=f"every replica of {s} Running on its node with its devices",
                )
        finally:
            for conn in flood:
                with contextlib.suppress(OSError):
                    conn.close()
        elapsed = time.monotonic() - start
    assert_no_gpu_twice(kube, [namespace])
    running = [p for p in pods_of(kube, namespace) if p["status"].get("phase") == "Running"]
    assert len(running) == 4 * per_set, f"{len(running)} of {4 * per_set} Running after {elapsed:.0f}s"


def _partial(kube: Any, namespace: str, maps: dict[str, dict[int, tuple[str, str]]]) -> None:
    """Mid-soak: whatever is bound is bound exactly right (node and devices of its own entry)."""
    for pod in pods_of(kube, namespace):
        node = pod["spec"].get("nodeName")
        if not node:
            continue
        name = pod["metadata"]["name"]
        want_node, want_devices = maps[name.rsplit("-", 1)[0]][int(name.rsplit("-", 1)[1])]
        env = env_of(pod)
        assert (node, env.get("CUDA_VISIBLE_DEVICES")) == (want_node, want_devices), f"{name}: {node} {env}"
        assert env.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID", name


def _set_done(kube: Any, namespace: str, name: str, smap: dict[int, tuple[str, str]]) -> bool:
    pods = [
        p
        for p in pods_of(kube, namespace)
        if p["metadata"]["name"].rsplit("-", 1)[0] == name and not p["metadata"].get("deletionTimestamp")
    ]
    if len(pods) != len(smap):
        return False
    for pod in pods:
        ordinal = int(pod["metadata"]["labels"]["apps.kubernetes.io/pod-index"])
        node, devices = smap[ordinal]
        if pod["spec"].get("nodeName"):
            # Bound: it must be exactly right, whatever else happens.
            assert pod["spec"]["nodeName"] == node, pod["metadata"]["name"]
            assert env_of(pod).get("CUDA_VISIBLE_DEVICES") == devices, pod["metadata"]["name"]
        if pod["status"].get("phase") != "Running":
            return False
    return True
