"""``make demo``: the whole product on the local control plane, end to end.

Builds the image from the Dockerfile (localcluster/image.py), starts the control plane
with fake GPU nodes (kwok) and one real kubelet node (localcluster/node.py) that holds
the image, and installs gpu-scheduler-chart as a user does, with its defaults: the
scheduler runs as a pod on the real node, with the chart's security context, and the
apiserver (Kubernetes 1.37) injects the GPU variables itself (injection.mode auto picks the
MutatingAdmissionPolicy): no webhook, no certificate anywhere. With ``webhook=True``
(``DEMO_ARGS=--webhook``) the webhook runs as pods too and the apiserver calls it through
its Service with certificates from generate-webhook-certs.py. Then it applies
examples/gpu-workload.yaml, prints where each replica landed, and runs ``helm test``. Exit
0 only when every replica is Running where the map says, with the mapped devices, and the
helm test passes.

With ``dra=True`` (``DEMO_ARGS=--dra``) it first publishes, on the kwok GPU nodes, the
DeviceClass and ResourceSlices NVIDIA's DRA driver would (localcluster/dra.py), and installs the
chart in DRA mode (``dra.enabled=true``): each replica gets a ResourceClaim naming its GPUs,
kube-scheduler allocates it and binds the pod. A replica matches when it runs on its node and
its claim is allocated exactly the devices its entry resolves to (kube_gpu_scheduler.domain.dra); the
table shows each claim's devices with their PCI bus IDs and UUIDs, and ``gpu-scheduler-check
verify-release --mode dra`` checks the same through the API before ``helm test``. Last, it
installs gpu-scheduler-check-chart in DRA mode (``gpuScheduling.injectionMode=dra``, on GPUs the
example leaves free) and runs its ``helm test``, which checks each claim with the chart's own
account on the real node.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from kube_gpu_scheduler.domain import dra
from kube_gpu_scheduler.domain.injection import (
    CUDA_DEVICE_ORDER,
    CUDA_VISIBLE_DEVICES,
    PCI_BUS_ID,
    format_devices,
    held_devices,
)
from kube_gpu_scheduler.domain.podinfo import entry_for
from localcluster import dra as dra_slices
from localcluster.cluster import REPO, Cluster
from localcluster.image import build as build_image
from localcluster.release import CHECK_CHART, install_chart, product_values
from localcluster.webhook_host import make_certs

EXAMPLE = REPO / "examples" / "gpu-workload.yaml"
RELEASE, SYSTEM_NS, DEMO_NS = "gpu-scheduler", "gpu-scheduler-system", "gpu-demo"
CHECK_RELEASE, CHECK_NS = "gpu-scheduler-check", "gpu-scheduler-tests"
# DRA mode: the check chart's replicas take GPUs the example leaves free.
CHECK_MAP = ((0, "node1", "2,3"), (1, "node2", "0"), (2, "node3", "3"))


def say(msg: str) -> None:
    print(f"==> {msg}", file=sys.stderr, flush=True)


def chart_lease_name(cluster: Cluster) -> str:
    """The Lease the chart's Role lets the scheduler update (its only named lease)."""
    roles = yaml.safe_load(
        cluster.kubectl(
            "get", "roles", "-n", SYSTEM_NS, "-l", f"app.kubernetes.io/instance={RELEASE}", "-o", "yaml"
        ).stdout
    )
    for role in roles["items"]:
        for rule in role.get("rules") or []:
            if "leases" in rule.get("resources", []) and rule.get("resourceNames"):
                return str(rule["resourceNames"][0])
    raise RuntimeError(f"the chart created no Role naming a Lease in {SYSTEM_NS}")


def pod_rows(cluster: Cluster, sts: dict[str, Any]) -> list[dict[str, Any]]:
    selector = ",".join(f"{k}={v}" for k, v in sts["spec"]["selector"]["matchLabels"].items())
    pods = yaml.safe_load(cluster.kubectl("get", "pods", "-n", DEMO_NS, "-l", selector, "-o", "yaml").stdout)
    rows = []
    for pod in pods["items"]:
        meta = pod["metadata"]
        ordinal, entry = entry_for(meta)
        env = {e["name"]: e.get("value") for c in pod["spec"]["containers"] for e in c.get("env") or []}
        node = pod["spec"].get("nodeName") or "-"
        cuda = env.get("CUDA_VISIBLE_DEVICES") or "-"
        phase = pod["status"].get("phase", "?")
        ok = (
            entry is not None
            and node == entry.node
            and cuda == entry.devices
            and env.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID"
            and phase == "Running"
        )
        rows.append(
            {
                "ordinal": ordinal,
                "pod": meta["name"],
                "node": node,
                # What the scheduler's ledger counts as held: the devices in the container spec.
                "gpus": format_devices(held_devices(pod.get("spec"))) if node else "-",
                "cuda": cuda,
                "phase": phase,
                "expected": str(entry) if entry else "(no entry)",
                "ok": ok,
            }
        )
    return sorted(rows, key=lambda r: (r["ordinal"] is None, r["ordinal"]))


def _columns(lines: list[tuple[str, ...]]) -> str:
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )


def table(rows: list[dict[str, Any]]) -> str:
    head = ("ORDINAL", "POD", "NODE", "GPUS", "CUDA_VISIBLE_DEVICES", "PHASE", "MAP SAYS", "MATCH")
    return _columns(
        [head]
        + [
            (
                str(r["ordinal"]),
                r["pod"],
                r["node"],
                r["gpus"],
                r["cuda"],
                r["phase"],
                r["expected"],
                "yes" if r["ok"] else "NO",
            )
            for r in rows
        ]
    )


# ---------------------------------------------------------------- DRA mode
DRA_NODES = 3  # node1..node3, the GPU nodes Cluster.start makes here


def _items(cluster: Cluster, *args: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load(cluster.kubectl("get", *args, "-o", "yaml").stdout)["items"])


def devices_table(slices: list[dict[str, Any]], nodes: list[str]) -> str:
    """Each node's GPUs as the map's index names them: PCI bus ID order, not the minor's."""
    lines: list[tuple[str, ...]] = [("NODE", "INDEX", "DEVICE", "PCI BUS ID", "UUID")]
    for node in nodes:
        for i, d in enumerate(dra.node_devices(slices, node)):
            lines.append((node, str(i), d.name, d.pci_bus_id, d.uuid))
    return _columns(lines)


def dra_rows(cluster: Cluster, sts: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per replica: its node, its claim, the devices the claim is allocated (with
    their PCI bus IDs and UUIDs from the ResourceSlices) and whether that is what its entry says."""
    selector = ",".join(f"{k}={v}" for k, v in sts["spec"]["selector"]["matchLabels"].items())
    pods = _items(cluster, "pods", "-n", DEMO_NS, "-l", selector)
    claims = {c["metadata"]["name"]: c for c in _items(cluster, "resourceclaims", "-n", DEMO_NS)}
    slices = _items(cluster, "resourceslices")
    rows = []
    for pod in pods:
        meta = pod["metadata"]
        ordinal, entry = entry_for(meta)
        node = pod["spec"].get("nodeName") or "-"
        phase = pod["status"].get("phase", "?")
        claim_name = dra.pod_claim_name(pod)
        claim = claims.get(claim_name or "")
        published = {
            (d.pool, d.name): d
            for n in {node, entry.node if entry else ""}
            for d in dra.node_devices(slices, n)
        }
        got = [
            published.get((a.pool, a.device)) or dra.Device(a.pool, a.pool, a.device, "?", "?")
            for a in sorted(dra.allocation(claim or {}), key=lambda a: a.request)
        ]
        envs = [{e["name"]: e.get("value") for e in c.get("env") or []} for c in pod["spec"]["containers"]]
        env_ok = all(e.get(CUDA_DEVICE_ORDER) == PCI_BUS_ID and CUDA_VISIBLE_DEVICES not in e for e in envs)
        try:
            wanted = dra.resolve(entry, dra.node_devices(slices, entry.node)) if entry else None
        except dra.Unresolved:
            wanted = None
        ok = (
            entry is not None
            and wanted is not None
            and claim is not None
            and node == entry.node
            and phase == "Running"
            and env_ok
            and dra.matches(claim, entry, wanted)
        )
        rows.append(
            {
                "ordinal": ordinal,
                "pod": meta["name"],
                "node": node,
                "claim": claim_name or "-",
                "devices": got,
                "phase": phase,
                "expected": str(entry) if entry else "(no entry)",
                "ok": ok,
            }
        )
    return sorted(rows, key=lambda r: (r["ordinal"] is None, r["ordinal"]))


def dra_table(rows: list[dict[str, Any]]) -> str:
    """A line per allocated device (a replica without one gets a line with ``-``)."""
    head = ("ORDINAL", "POD", "NODE", "CLAIM", "DEVICE", "PCI BUS ID", "UUID", "PHASE", "MAP SAYS", "MATCH")
    lines: list[tuple[str, ...]] = [head]
    for r in rows:
        for d in r["devices"] or [None]:
            lines.append(
                (
                    str(r["ordinal"]),
                    r["pod"],
                    r["node"],
                    r["claim"],
                    d.name if d else "-",
                    d.pci_bus_id if d else "-",
                    d.uuid if d else "-",
                    r["phase"],
                    r["expected"],
                    "yes" if r["ok"] else "NO",
                )
            )
    return _columns(lines)


def publish_gpus(cluster: Cluster) -> list[dict[str, Any]]:
    """The DeviceClass and a ResourceSlice per kwok GPU node (localcluster/dra.py); the slices."""
    nodes = {f"node{i}": 4 for i in range(1, DRA_NODES + 1)}
    api = cluster.api_client()
    try:
        dra_slices.publish(api, nodes)
    finally:
        api.close()
    slices = _items(cluster, "resourceslices")
    print(devices_table(slices, list(nodes)))
    return slices


def verify_dra_release(cluster: Cluster, timeout: float) -> bool:
    """``gpu-scheduler-check verify-release --mode dra`` on the example, as the check chart's
    helm test runs it: each claim's allocation against the map, through the API."""
    import os
    import subprocess

    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "kube_gpu_scheduler.check",
            "verify-release",
            "--namespace",
            DEMO_NS,
            "--selector",
            "app=gpu-workload",
            "--mode",
            "dra",
            "--timeout",
            str(int(timeout)),
        ],
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "CHECK_LOG_LEVEL": "WARNING"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout + 60,
        check=False,
    )
    print(res.stdout.strip())
    if res.returncode != 0:
        say(f"verify-release --mode dra failed:\n{res.stderr.strip()[-3000:]}")
    return res.returncode == 0


def wait_rollout(cluster: Cluster, namespace: str, release: str, timeout: float) -> None:
    for dep in cluster.kubectl(
        "get", "deployments", "-n", namespace, "-l", f"app.kubernetes.io/instance={release}", "-o", "name"
    ).stdout.split():
        cluster.kubectl("rollout", "status", "-n", namespace, dep, f"--timeout={int(timeout)}s")


def product_pods(cluster: Cluster, namespace: str, release: str) -> str:
    return cluster.kubectl(
        "get", "pods", "-n", namespace, "-l", f"app.kubernetes.io/instance={release}", "-o", "wide"
    ).stdout


def injection_objects(cluster: Cluster) -> str:
    """What injects and what certifies it: the release's admission policies, webhook
    configurations and TLS Secrets (a line each, or "none")."""
    sel = f"app.kubernetes.io/instance={RELEASE}"
    lines = []
    for what, args in (
        ("admission policies", ("mutatingadmissionpolicies,validatingadmissionpolicies", "-l", sel)),
        (
            "webhook configurations",
            ("mutatingwebhookconfigurations,validatingwebhookconfigurations", "-l", sel),
        ),
        ("TLS Secrets", ("secrets", "-n", SYSTEM_NS, "--field-selector", "type=kubernetes.io/tls")),
    ):
        names = cluster.kubectl("get", *args, "-o", "name", check=False).stdout.split()
        lines.append(f"{what}: {', '.join(names) if names else 'none'}")
    return "\n".join(lines)


def check_chart_dra(cluster: Cluster, image_ref: str, timeout: float) -> bool:
    """Install gpu-scheduler-check-chart with gpuScheduling.injectionMode=dra (its pre-install
    wait-ready hook dry-runs a mapped pod through the DRA policy on the real node) and run its
    ``helm test``: verify-release --mode dra with the chart's own account and RBAC."""
    repository, _, tag = image_ref.rpartition(":")
    values = {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "gpuScheduling": {
            "schedulingMap": [{"podIndex": o, "nodeName": n, "gpuDevices": g} for o, n, g in CHECK_MAP],
            "injectionMode": "dra",
        },
    }
    install_chart(
        cluster, CHECK_RELEASE, CHECK_NS, values, chart=CHECK_CHART, wait=True, timeout=f"{int(timeout)}s"
    )
    res = cluster.helm("test", CHECK_RELEASE, "-n", CHECK_NS, "--timeout", f"{int(timeout)}s", check=False)
    print(res.stdout.strip())
    logs = cluster.kubectl(
        "logs", "-n", CHECK_NS, f"{CHECK_RELEASE}-test", "-c", "verify-release", check=False
    ).stdout
    print("\n".join(line for line in logs.splitlines() if not line.startswith("{")))
    if res.returncode != 0:
        say(f"helm test {CHECK_RELEASE} failed: {res.stderr.strip()}\n{logs[-3000:]}")
    return res.returncode == 0


def run(
    keep: bool = False,
    workdir: Path | None = None,
    timeout: float = 240,
    webhook: bool = False,
    dra_mode: bool = False,
) -> int:
    if dra_mode and webhook:
        say("DRA mode runs with the injection policy only (the chart's dra.enabled): drop --webhook")
        return 2
    if workdir is None:
        workdir = REPO / ".cluster" if keep else Path(tempfile.mkdtemp(prefix="gpu-scheduler-demo-"))
    if keep and (workdir / "state.json").exists():
        say(
            f"a control plane kept by an earlier run is still registered in {workdir}: run `make cluster-down` first"
        )
        return 2
    say("building the image from the Dockerfile (make image: mmdebstrap base + buildah, no Docker)")
    image = build_image()
    say(
        "starting the local control plane (etcd, kube-apiserver, controller-manager, kube-scheduler, "
        "kwok GPU nodes) and a real kubelet node (containerd, runc, CNI bridge, kube-proxy)"
    )
    cluster = Cluster.start(
        workdir, gpu_nodes=3, gpus_per_node=4, detach=keep, real_node=True, images=[image.archive]
    )
    logs = workdir / "logs"
    try:
        certs = None
        if webhook:
            say("webhook mode: generating webhook certificates with generate-webhook-certs.py")
            certs = make_certs(workdir / "webhook-certs", service=f"{RELEASE}-webhook", namespace=SYSTEM_NS)
        else:
            say(
                "policy mode (the chart's default on Kubernetes >= 1.36): the apiserver injects the GPU "
                "variables, no webhook, no certificate"
            )
        values = product_values(image.ref, certs)
        if dra_mode:
            say(
                "DRA mode: publishing the DeviceClass gpu.nvidia.com and a ResourceSlice per kwok GPU node, "
                "as NVIDIA's DRA driver would (an index is the node's i-th GPU in PCI bus ID order)"
            )
            publish_gpus(cluster)
            values["dra"] = {"enabled": True}
        say(
            f"helm install {RELEASE} ./gpu-scheduler-chart -n {SYSTEM_NS} (image {image.ref}, pullPolicy Never"
            + (", dra.enabled=true)" if dra_mode else ")")
        )
        install_chart(cluster, RELEASE, SYSTEM_NS, values)
        wait_rollout(cluster, SYSTEM_NS, RELEASE, timeout)
        print(product_pods(cluster, SYSTEM_NS, RELEASE))
        print(injection_objects(cluster))

        sts = yaml.safe_load(EXAMPLE.read_text())
        say(f"applying {EXAMPLE.relative_to(REPO)} into namespace {DEMO_NS}")
        cluster.kubectl("create", "namespace", DEMO_NS)
        cluster.kubectl("apply", "-n", DEMO_NS, "-f", str(EXAMPLE))
        replicas = int(sts["spec"]["replicas"])
        deadline = time.monotonic() + timeout
        rows: list[dict[str, Any]] = []
        read_rows = dra_rows if dra_mode else pod_rows
        while time.monotonic() < deadline:
            rows = read_rows(cluster, sts)
            if len(rows) == replicas and all(r["ok"] for r in rows):
                break
            time.sleep(0.5)
        print(dra_table(rows) if dra_mode else table(rows))
        good = len(rows) == replicas and all(r["ok"] for r in rows)
        if good and dra_mode:
            say(
                f"every replica is Running on its mapped node and its claim is allocated exactly its "
                f"mapped GPUs ({replicas}/{replicas})"
            )
            say("gpu-scheduler-check verify-release --mode dra (each claim's allocation against the map)")
            good = verify_dra_release(cluster, timeout)
        elif good:
            say(f"every replica is Running on its mapped node with its mapped GPUs ({replicas}/{replicas})")
        if good:
            say(f"helm test {RELEASE} (the test pods run on the real node)")
            res = cluster.helm("test", RELEASE, "-n", SYSTEM_NS, "--timeout", f"{int(timeout)}s", check=False)
            print(res.stdout.strip())
            if res.returncode != 0:
                say(f"helm test failed: {res.stderr.strip()}")
                good = False
            if good and dra_mode:
                say(
                    f"helm install {CHECK_RELEASE} ./gpu-scheduler-check-chart -n {CHECK_NS} "
                    f"(gpuScheduling.injectionMode=dra; map "
                    + "; ".join(f"{o}={n}:{g}" for o, n, g in CHECK_MAP)
                    + f"), then helm test {CHECK_RELEASE}: each claim checked against the map"
                )
                good = check_chart_dra(cluster, image.ref, timeout)
        else:
            say("placement does NOT match the map; see `kubectl describe pod` and the logs in " + str(logs))
            if dra_mode:
                print(
                    cluster.kubectl("get", "resourceclaims", "-n", DEMO_NS, "-o", "wide", check=False).stdout
                )
            print(
                cluster.kubectl(
                    "get", "events", "-n", DEMO_NS, "--sort-by=.lastTimestamp", check=False
                ).stdout
            )
            print(
                cluster.kubectl(
                    "logs",
                    "-n",
                    SYSTEM_NS,
                    "-l",
                    f"app.kubernetes.io/instance={RELEASE}",
                    "--tail=50",
                    "--all-containers",
                    "--prefix",
                    check=False,
                ).stdout
            )
        if keep:
            say("the control plane keeps running; stop it with `make cluster-down`")
            print(f"export KUBECONFIG={cluster.kubeconfig}")
        return 0 if good else 1
    finally:
        if not keep:
            cluster.stop()
            with contextlib.suppress(OSError):
                import shutil

                shutil.rmtree(workdir)
