"""``make demo``: the whole product on the local control plane, end to end.

Builds the image from the Dockerfile (localcluster/image.py), starts the control plane
with the task's GPU nodes: node1 to node3 fake (kwok), node4 the one real kubelet node
(localcluster/node.py, localcluster/demo_task.py) that holds the image, and installs
gpu-scheduler-chart as a user does, with its defaults: the
scheduler runs as a pod on the real node, with the chart's security context, and the
apiserver (Kubernetes 1.37) injects the GPU variables itself (injection.mode auto picks the
MutatingAdmissionPolicy): no webhook, no certificate anywhere. With ``webhook=True``
(``DEMO_ARGS=--webhook``) the webhook runs as pods too and the apiserver calls it through
its Service with certificates from generate-webhook-certs.py. Then it applies
examples/gpu-workload.yaml (the task's map: replicas 3 and 4 share node4's GPU 3), prints
where each replica landed, ``kubectl get pod -o wide -A`` and the logs of the replicas on
node3 (a kwok node: none) and node4 (two real containers running the check program, which
logs its node and CUDA_VISIBLE_DEVICES every interval), and runs ``helm test``. Exit 0 only
when every replica is Running where the map says, with the mapped devices, the two on node4
Ready and logging their mapped node and CUDA_VISIBLE_DEVICES, and the helm test passes.

With ``dra=True`` (``DEMO_ARGS=--dra``) the real node runs NVIDIA's own DRA driver over
stand-in GPUs (localcluster/nvidia_driver.py, localcluster/demo_dra.py); the kwok GPU nodes get
the ResourceSlices that driver would publish (localcluster/dra.py), and it installs the
chart in DRA mode (``dra.enabled=true``): each replica gets a ResourceClaim naming its GPUs,
kube-scheduler allocates it and binds the pod (shared GPUs are not placed in DRA mode yet: the
example's map is cut before its first sharer, replicas 0 to 2; the real node keeps its name,
control-plane). A replica matches when it runs on its node and
its claim is allocated exactly the devices its entry resolves to (kube_gpu_scheduler.domain.dra); the
table shows each claim's devices with their PCI bus IDs and UUIDs, and ``gpu-scheduler-check
verify-release --mode dra`` checks the same through the API before ``helm test``. Last, it
installs gpu-scheduler-check-chart in DRA mode (``gpuScheduling.injectionMode=dra``, on GPUs the
example leaves free, one of them on the real node) and runs its ``helm test``, which checks each
claim with the chart's own account, and prints what its replica on the real node sees from
inside: the GPUs NVIDIA's plugin prepared for its claim, and no others.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from kube_gpu_scheduler.domain.injection import (
    format_devices,
    held_devices,
)
from kube_gpu_scheduler.domain.podinfo import entry_for, pod_map
from localcluster.cluster import REPO, Cluster
from localcluster.demo_dra import (
    CHECK_MAP,
    CHECK_NS,
    CHECK_RELEASE,
    DEMO_NS,
    REAL_NODE_GPUS,
    check_chart_dra,
    columns,
    dra_rows,
    dra_table,
    publish_gpus,
    real_node_view,
    say,
    verify_dra_release,
)
from localcluster.demo_task import (
    KWOK_GPU_NODES,
    REAL_GPU_NODE,
    all_pods,
    demo_example,
    logged_enough,
    prepare_gpu_node,
    replica_logs,
)
from localcluster.image import build as build_image
from localcluster.node import NODE_NAME
from localcluster.release import install_chart, product_values
from localcluster.webhook_host import make_certs

EXAMPLE = REPO / "examples" / "gpu-workload.yaml"
RELEASE, SYSTEM_NS = "gpu-scheduler", "gpu-scheduler-system"


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


def sharing_lines(sts: dict[str, Any]) -> list[str]:
    """The shared GPUs of the StatefulSet's map, a line each (``node4:3 by ordinals 3, 4 (lines 4, 5)``)."""
    smap = pod_map(sts["spec"]["template"]["metadata"])
    return smap.sharing_lines() if smap is not None else []


def shares_with(meta: dict[str, Any], ordinal: int | None) -> str:
    """The ordinals that share a GPU with ``ordinal`` by its map (``-`` when none)."""
    smap = pod_map(meta)
    if smap is None or ordinal is None:
        return "-"
    mates = sorted({o for ords in smap.mates(ordinal).values() for o in ords})
    return ",".join(map(str, mates)) or "-"


def pod_rows(cluster: Cluster, sts: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per replica; on the real node (where a container runs) also Ready, which the
    check program in it gives only while it sees its mapped node and variables."""
    real = cluster.node.name if cluster.node is not None else None
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
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in pod["status"].get("conditions") or []
        )
        ok = (
            entry is not None
            and node == entry.node
            and cuda == entry.devices
            and env.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID"
            and phase == "Running"
            and (ready or node != real)
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
                "container": "-"
                if node == "-"
                else "runs, Ready"
                if ready and node == real
                else "runs, not Ready"
                if node == real
                else "none (kwok node)",
                "shares": shares_with(meta, ordinal),
                "expected": str(entry) if entry else "(no entry)",
                "expected_node": entry.node if entry else None,
                "expected_cuda": entry.devices if entry else None,
                "ok": ok,
            }
        )
    return sorted(rows, key=lambda r: (r["ordinal"] is None, r["ordinal"]))


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "ORDINAL", "POD", "NODE", "GPUS", "CUDA_VISIBLE_DEVICES", "PHASE", "CONTAINER", "SHARES WITH", "MAP SAYS",
        "MATCH",
    )  # fmt: skip
    return columns(
        [head]
        + [
            (
                str(r["ordinal"]),
                r["pod"],
                r["node"],
                r["gpus"],
                r["cuda"],
                r["phase"],
                r["container"],
                r["shares"],
                r["expected"],
                "yes" if r["ok"] else "NO",
            )
            for r in rows
        ]
    )


def map_status(cluster: Cluster) -> str:
    """``gpu-scheduler-map status`` on the demo's cluster (what ``kubectl gpu-map status`` prints)."""
    argv = [
        sys.executable,
        "-m",
        "kube_gpu_scheduler.mapcli.cli",
        "status",
        "--kubeconfig",
        str(cluster.kubeconfig),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    return done.stdout.strip() or done.stderr.strip()


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
        f"kwok GPU nodes node1..node{KWOK_GPU_NODES}) and a real kubelet node (containerd, runc, CNI bridge, "
        f"kube-proxy){'' if dra_mode else ' named ' + REAL_GPU_NODE}"
    )
    if dra_mode:
        say(
            f"DRA mode: the real node runs NVIDIA's own DRA driver (its Helm chart, its kubelet plugin) over "
            f"{REAL_NODE_GPUS} stand-in GPUs (localcluster/nvidia_driver.py)"
        )
    cluster = Cluster.start(
        workdir,
        gpu_nodes=KWOK_GPU_NODES,
        gpus_per_node=4,
        detach=keep,
        real_node=True,
        images=[image.archive],
        nvidia_gpus=REAL_NODE_GPUS if dra_mode else 0,
        # DRA mode: NVIDIA's driver on the control-plane node, the map cut before its sharers.
        real_node_name=NODE_NAME if dra_mode else REAL_GPU_NODE,
    )
    logs = workdir / "logs"
    try:
        if not dra_mode:
            prepare_gpu_node(cluster)
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
                "DRA mode: NVIDIA's plugin published the real node's GPUs; publishing a ResourceSlice per kwok "
                "GPU node as it would (an index is the node's i-th GPU in PCI bus ID order)"
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

        sts, applied = demo_example(EXAMPLE, image.ref, workdir, shared=not dra_mode)
        say(
            f"applying {EXAMPLE.relative_to(REPO)} into namespace {DEMO_NS}, with the image built here "
            "(pullPolicy Never) and CHECK_EXPECT_NO_GPU=true (no GPU hardware here)"
            + (
                f"; DRA mode does not place shared GPUs yet: replicas 0-{sts['spec']['replicas'] - 1} only, "
                "the map cut before its first sharer"
                if dra_mode
                else ""
            )
        )
        cluster.kubectl("create", "namespace", DEMO_NS)
        applied_res = cluster.kubectl("apply", "-n", DEMO_NS, "-f", str(applied))
        for line in applied_res.stderr.splitlines():
            if line.startswith("Warning:"):
                say(f"kubectl apply: {line}")  # the admission's warnings (a shared GPU is named)
        replicas = int(sts["spec"]["replicas"])
        deadline = time.monotonic() + timeout
        rows: list[dict[str, Any]] = []
        read_rows = dra_rows if dra_mode else pod_rows
        while time.monotonic() < deadline:
            rows = read_rows(cluster, sts)
            if (
                len(rows) == replicas
                and all(r["ok"] for r in rows)
                and (dra_mode or logged_enough(cluster, rows))
            ):
                break
            time.sleep(0.5)
        print(dra_table(rows) if dra_mode else table(rows))
        good = len(rows) == replicas and all(r["ok"] for r in rows)
        if not dra_mode:
            print()
            say("kubectl get pod -o wide -A")
            print(all_pods(cluster))
            print()
            say(
                f"the logs of the replicas on node3 and {REAL_GPU_NODE}: the check program in each container "
                "logs its node and CUDA_VISIBLE_DEVICES every 5 s"
            )
            text, logged = replica_logs(cluster, rows)
            print(text)
            print()
            if good and not logged:
                say(f"a replica on {REAL_GPU_NODE} did not log its mapped node and CUDA_VISIBLE_DEVICES")
            good = good and logged
        if good and dra_mode:
            say(
                f"every replica is Running on its mapped node and its claim is allocated exactly its "
                f"mapped GPUs ({replicas}/{replicas})"
            )
            say("gpu-scheduler-check verify-release --mode dra (each claim's allocation against the map)")
            good = verify_dra_release(cluster, timeout)
        elif good:
            say(f"every replica is Running on its mapped node with its mapped GPUs ({replicas}/{replicas})")
            for line in sharing_lines(sts):
                say(f"shared, as the map says: {line}")
        if good:
            say("gpu-scheduler-map status: who holds which GPU, and which are free")
            print(map_status(cluster))
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
                if good:
                    say(f"what the check chart's replica on the real node ({NODE_NAME}) sees from inside")
                    good = real_node_view(cluster)
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
