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
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from gpu_scheduling.injection import format_devices, held_devices
from gpu_scheduling.podinfo import entry_for
from localcluster.cluster import REPO, Cluster
from localcluster.image import build as build_image
from localcluster.release import install_chart, product_values
from localcluster.webhook_host import make_certs

EXAMPLE = REPO / "examples" / "gpu-workload.yaml"
RELEASE, SYSTEM_NS, DEMO_NS = "gpu-scheduler", "gpu-scheduler-system", "gpu-demo"


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


def table(rows: list[dict[str, Any]]) -> str:
    head = ("ORDINAL", "POD", "NODE", "GPUS", "CUDA_VISIBLE_DEVICES", "PHASE", "MAP SAYS", "MATCH")
    lines = [head] + [
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
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )


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


def run(keep: bool = False, workdir: Path | None = None, timeout: float = 240, webhook: bool = False) -> int:
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
        say(
            f"helm install {RELEASE} ./gpu-scheduler-chart -n {SYSTEM_NS} (image {image.ref}, pullPolicy Never)"
        )
        install_chart(cluster, RELEASE, SYSTEM_NS, product_values(image.ref, certs))
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
        while time.monotonic() < deadline:
            rows = pod_rows(cluster, sts)
            if len(rows) == replicas and all(r["ok"] for r in rows):
                break
            time.sleep(0.5)
        print(table(rows))
        good = len(rows) == replicas and all(r["ok"] for r in rows)
        if good:
            say(f"every replica is Running on its mapped node with its mapped GPUs ({replicas}/{replicas})")
            say(f"helm test {RELEASE} (the test pods run on the real node)")
            res = cluster.helm("test", RELEASE, "-n", SYSTEM_NS, "--timeout", f"{int(timeout)}s", check=False)
            print(res.stdout.strip())
            if res.returncode != 0:
                say(f"helm test failed: {res.stderr.strip()}")
                good = False
        else:
            say("placement does NOT match the map; see `kubectl describe pod` and the logs in " + str(logs))
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
