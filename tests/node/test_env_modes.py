"""The env modes on the real node, under NVIDIA's own container runtime as a GPU Operator >= 25.10
sets it up: the ``nvidia`` RuntimeClass runs nvidia-container-runtime v1.18.0 in ``cdi`` mode, not
as the default runtime, its default kind the management one (a CDI spec with ``all`` only), the
accept-envvar setting on (localcluster/nvidia_driver.py ``_install_toolkit``), over 4 stand-in
GPUs whose minors are not in PCI bus order.

* ``nvidia-cdi`` mode, installed as a second release of the chart (its own name, namespace and
  scheduler name ``gpu-scheduler-cdi``, policy injection, no webhook: nothing it owns is named
  like the package's ``product`` release, and each scheduler sees only its own pods): a replica
  mapped by index and one mapped by UUID are bound to the real node by that scheduler, get
  ``runtimeClassName: nvidia`` and ``runtime.nvidia.com/gpu=`` devices from the injection
  policy, and their in-pod check (Ready only when every check passes) sees exactly their
  entry's device nodes and NVML UUIDs, no other GPU;
* for the record, what users hit with the other modes on such a cluster: ``nvidia`` mode's bare
  indices under ``runtimeClassName: nvidia`` fail the container's creation (``unresolvable CDI
  devices management.nvidia.com/gpu=N``), and ``cuda`` and ``nvidia`` modes without a runtime
  class (plain runc) give no GPU at all; the check in those containers says why.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from kube_gpu_scheduler.domain.injection import CDI_GPU_PREFIX, InjectionMode, desired_env
from kube_gpu_scheduler.domain.schedmap import ANNOTATION, gpu_name, parse
from localcluster.cluster import Cluster
from localcluster.node import NODE_NAME
from localcluster.nvidia_driver import RUNTIME_CLASS
from localcluster.release import install_chart, product_values, uninstall

RELEASE, NAMESPACE, SCHEDULER = "gpu-scheduler-cdi", "gpu-scheduler-cdi-system", "gpu-scheduler-cdi"
TOLERATE_CONTROL_PLANE = [
    {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}
]
# Restricted, as the check chart runs it: non-root, read-only root, every capability dropped.
SECURITY = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "runAsUser": 65532,
    "capabilities": {"drop": ["ALL"]},
}


def downward(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


CHECK_ENV = [
    downward("POD_NAME", "metadata.name"),
    downward("POD_NAMESPACE", "metadata.namespace"),
    downward("NODE_NAME", "spec.nodeName"),
]


@pytest.fixture(scope="module")
def cdi_release(node_cluster: Cluster, product_image: Any) -> Iterator[Cluster]:
    """The chart in injection.deviceMode nvidia-cdi, beside (never instead of) the package's release."""
    assert node_cluster.nvidia is not None, "node_cluster starts NVIDIA's stack (nvidia_gpus)"
    # The scheduler places only on a node that reports nvidia.com/gpu (the device plugin's count;
    # here the DRA driver publishes the GPUs, so the count is written as the upstream docs do).
    node_cluster.kubectl(
        "patch", "node", NODE_NAME, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"capacity": {"nvidia.com/gpu": "4"}}}),
    )  # fmt: skip
    values = {
        **product_values(product_image.ref),
        "scheduler": {"name": SCHEDULER},
        "webhook": {"enabled": False},
        "injection": {"mode": "policy", "deviceMode": "nvidia-cdi", "runtimeClassName": RUNTIME_CLASS},
    }
    install_chart(node_cluster, RELEASE, NAMESPACE, values, wait=True, timeout="240s")
    try:
        yield node_cluster
    finally:
        uninstall(node_cluster, RELEASE, NAMESPACE)
        node_cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


def check_statefulset(name: str, text: str) -> dict[str, Any]:
    """One replica running ``gpu-scheduler-check serve`` (Ready only while every check passes)."""
    labels = {"app": name}
    container = {
        "name": "check",
        "image": "IMAGE",
        "imagePullPolicy": "Never",
        "command": ["gpu-scheduler-check", "serve"],
        "env": [
            *CHECK_ENV,
            downward("POD_INDEX", "metadata.labels['apps.kubernetes.io/pod-index']"),
            downward("GPU_SCHEDULING_MAP", f"metadata.annotations['{ANNOTATION}']"),
            {"name": "GPU_INJECTION_MODE", "value": "nvidia-cdi"},
            {"name": "CHECK_INTERVAL_SECONDS", "value": "2"},
        ],
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8080}, "periodSeconds": 2},
        "securityContext": SECURITY,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "serviceName": name,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": {ANNOTATION: text}},
                "spec": {
                    "schedulerName": SCHEDULER,
                    "tolerations": TOLERATE_CONTROL_PLANE,
                    "automountServiceAccountToken": False,
                    "containers": [container],
                },
            },
        },
    }


def get_pod(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return json.loads(cluster.kubectl("get", "pod", name, "-n", namespace, "-o", "json").stdout)


def wait_ready(cluster: Cluster, namespace: str, name: str, timeout: float = 240) -> None:
    """Wait for the pod's Ready condition; on a timeout say what the pod, its events, its log and
    the release's scheduler show."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pod = cluster.get_json("pod", name, "-n", namespace)
        if pod:
            conditions = pod.get("status", {}).get("conditions") or []
            if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
                return
        time.sleep(1)
    shown = [
        cluster.kubectl("get", "pod", name, "-n", namespace, "-o", "yaml", check=False).stdout[-4000:],
        cluster.kubectl("get", "events", "-n", namespace, check=False).stdout[-3000:],
        cluster.kubectl("logs", name, "-n", namespace, "--tail=30", check=False).stdout[-4000:],
        cluster.kubectl("logs", "-n", NAMESPACE, f"deploy/{RELEASE}", "--tail=30", check=False).stdout[
            -4000:
        ],
    ]
    raise AssertionError(f"pod {namespace}/{name} not Ready after {timeout:.0f}s:\n" + "\n---\n".join(shown))


def seen_record(cluster: Cluster, namespace: str, pod: str, container: str) -> dict[str, Any]:
    """The check's last ``devices seen`` record in the container's log."""
    out = cluster.kubectl("logs", pod, "-n", namespace, "-c", container).stdout
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    records = [line["seen"] for line in lines if line.get("msg") == "devices seen"]
    assert records, out[-3000:]
    return dict(records[-1])


def test_nvidia_cdi_mode_gives_each_replica_exactly_its_gpus(
    cdi_release: Cluster, node_namespace: str
) -> None:
    cluster = cdi_release
    assert cluster.nvidia is not None
    bus = cluster.nvidia.gpus_in_bus_order()  # NVML index i = bus[i]
    assert [g.minor for g in bus] != sorted(g.minor for g in bus), "the minors are not in bus order"
    image = json.loads(cluster.kubectl("get", "deployment", "-n", NAMESPACE, RELEASE, "-o", "json").stdout)[
        "spec"
    ]["template"]["spec"]["containers"][0]["image"]
    maps = {"by-index": f"0={NODE_NAME}:2,0\n", "by-uuid": f"0={NODE_NAME}:{bus[3].uuid.upper()}\n"}
    want = {"by-index": [bus[2], bus[0]], "by-uuid": [bus[3]]}
    started = time.monotonic()
    for name, text in maps.items():
        sts = check_statefulset(name, text)
        sts["spec"]["template"]["spec"]["containers"][0]["image"] = image
        cluster.apply([{**sts, "metadata": {**sts["metadata"], "namespace": node_namespace}}])
    for name in maps:
        wait_ready(cluster, node_namespace, f"{name}-0")
    print(
        f"\nnvidia-cdi: both replicas Ready (every in-pod check passed) in {time.monotonic() - started:.0f}s"
    )
    for name, text in maps.items():
        pod = get_pod(cluster, node_namespace, f"{name}-0")
        spec = pod["spec"]
        entry = parse(text)[0]
        # Bound by this release's scheduler to the real node, with what the injection policy gave.
        assert spec["nodeName"] == NODE_NAME and spec["schedulerName"] == SCHEDULER
        assert spec["runtimeClassName"] == RUNTIME_CLASS
        env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
        assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(CDI_GPU_PREFIX + str(g) for g in entry.gpus)
        assert env["CUDA_VISIBLE_DEVICES"] == ",".join(str(i) for i in range(len(entry.gpus)))
        # Inside: exactly the entry's device nodes, and NVML sees exactly its GPUs.
        record = seen_record(cluster, node_namespace, f"{name}-0", "check")
        print(f"{name} ({text.strip()}): {json.dumps(record)}")
        assert record["ok"] is True and record["mode"] == "nvidia-cdi" and record["failed"] == []
        minors = sorted(g.minor for g in want[name])
        assert record["devices"] == {"gpus": [f"/dev/nvidia{m}" for m in minors], "nvidiactl": True}
        assert sorted(g["uuid"] for g in record["gpus"]) == sorted(g.uuid for g in want[name])
        assert sorted(gpu_name(g["pci_bus_id"]) for g in record["gpus"]) == sorted(
            gpu_name(g.pci_bus_id) for g in want[name]
        )
        listing = cluster.kubectl(
            "exec", f"{name}-0", "-n", node_namespace, "--", "sh", "-c", "ls /dev | grep ^nvidia"
        ).stdout.split()
        print(f"{name}: /dev holds {listing}")
        assert sorted(n for n in listing if n[6:].isdigit()) == sorted(f"nvidia{m}" for m in minors)


def plain_pod(name: str, containers: list[dict[str, Any]], runtime_class: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeName": NODE_NAME,
        "restartPolicy": "Never",
        "tolerations": TOLERATE_CONTROL_PLANE,
        "automountServiceAccountToken": False,
        "containers": containers,
    }
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def mode_container(name: str, image: str, mode: InjectionMode, text: str) -> dict[str, Any]:
    """The check, once, with exactly the variables ``mode`` injects for replica 0 of ``text``."""
    (entry,) = parse(text).values()
    return {
        "name": name,
        "image": image,
        "imagePullPolicy": "Never",
        "command": ["gpu-scheduler-check", "once"],
        "env": [
            *CHECK_ENV,
            {"name": "POD_INDEX", "value": "0"},
            {"name": "GPU_SCHEDULING_MAP", "value": text},
            {"name": "GPU_INJECTION_MODE", "value": mode},
            *({"name": k, "value": v} for k, v in desired_env(entry, mode)),
        ],
        "securityContext": SECURITY,
    }


def statuses(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return list((pod.get("status") or {}).get("containerStatuses") or [])


def test_the_other_modes_fail_on_a_cdi_default_gpu_operator_and_the_check_says_why(
    node_cluster: Cluster, product_image: Any, node_namespace: str
) -> None:
    cluster = node_cluster
    text = f"0={NODE_NAME}:2,0\n"
    # nvidia mode's bare indices, under NVIDIA's runtime (cdi mode, the management kind by default).
    bare = plain_pod(
        "nvidia-mode-nvidia-class",
        [mode_container("check", product_image.ref, "nvidia", text)],
        RUNTIME_CLASS,
    )
    # No runtime class: plain runc, whatever the variables say.
    runc = plain_pod(
        "no-runtime-class",
        [
            mode_container(mode, product_image.ref, mode, text)  # type: ignore[arg-type]
            for mode in ("cuda", "nvidia", "nvidia-cdi")
        ],
        None,
    )
    cluster.apply([{**p, "metadata": {**p["metadata"], "namespace": node_namespace}} for p in (bare, runc)])

    def failed_to_create() -> str | None:
        for s in statuses(get_pod(cluster, node_namespace, "nvidia-mode-nvidia-class")):
            for state in (s.get("state") or {}, s.get("lastState") or {}):
                for detail in state.values():
                    if "unresolvable CDI devices" in (detail.get("message") or ""):
                        return f"{detail.get('reason')}: {detail['message']}"
        return None

    cluster.wait_until(lambda: failed_to_create() is not None, 180, "nvidia mode's container to fail")
    message = failed_to_create()
    print(f"\nnvidia mode, runtimeClassName {RUNTIME_CLASS}: {message}")
    assert message is not None and "management.nvidia.com/gpu=2" in message
    assert "management.nvidia.com/gpu=0" in message

    def ended() -> bool:
        pod = get_pod(cluster, node_namespace, "no-runtime-class")
        return len(statuses(pod)) == 3 and all("terminated" in (s.get("state") or {}) for s in statuses(pod))

    cluster.wait_until(ended, 180, "the plain-runc containers to end")
    for s in statuses(get_pod(cluster, node_namespace, "no-runtime-class")):
        assert s["state"]["terminated"]["exitCode"] == 1, s  # the check failed: no GPU
        record = seen_record(cluster, node_namespace, "no-runtime-class", s["name"])
        print(f"{s['name']} mode, no runtimeClassName: {json.dumps(record)}")
        assert record["devices"] == {"gpus": [], "nvidiactl": False}
        assert record["nvml"].startswith("unavailable: NVML not available: ")
        assert "LibraryNotFound" in record["nvml"]
        assert record["cause"] == "no-gpu-from-runtime"
        assert record["diagnosis"].startswith("the container runtime gave this container no GPU")
        if s["name"] != "nvidia-cdi":
            assert "a pod without runtimeClassName runs under plain runc" in record["diagnosis"]
        else:
            assert (
                "the pod's RuntimeClass (the scheduler chart's injection.runtimeClassName"
                in record["diagnosis"]
            )
