"""``make demo``: the whole product on the local control plane, end to end.

Starts the control plane with fake GPU nodes, installs gpu-scheduler-chart
(ServiceAccounts, RBAC, admission policy, webhook configurations pointing at the
host-process webhook), runs the webhook with certificates from generate-webhook-certs.py
and the chart's webhook ServiceAccount, and the scheduler with a token of the chart's
scheduler ServiceAccount, applies examples/gpu-workload.yaml, and prints where each
replica landed. Exit 0 only when every replica is Running where the map says, with
the mapped devices.
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
from localcluster.cluster import REPO, Cluster, free_port
from localcluster.release import install_chart, release_service_account, webhook_host_values
from localcluster.scheduler_host import run_scheduler
from localcluster.webhook_host import ca_bundle, make_certs, run_webhook

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


def run(keep: bool = False, workdir: Path | None = None, timeout: float = 120) -> int:
    if workdir is None:
        workdir = REPO / ".cluster" if keep else Path(tempfile.mkdtemp(prefix="gpu-scheduler-demo-"))
    if keep and (workdir / "state.json").exists():
        say(
            f"a control plane kept by an earlier run is still registered in {workdir}: run `make cluster-down` first"
        )
        return 2
    say("starting the local control plane (etcd, kube-apiserver, controller-manager, kube-scheduler, kwok)")
    cluster = Cluster.start(workdir, gpu_nodes=3, gpus_per_node=4, detach=keep)
    procs = []
    try:
        say("generating webhook certificates with generate-webhook-certs.py")
        certs = make_certs(workdir / "webhook-certs")
        port = free_port()
        say(f"installing gpu-scheduler-chart into {SYSTEM_NS} (webhook at https://127.0.0.1:{port})")
        install_chart(
            cluster, RELEASE, SYSTEM_NS, webhook_host_values(f"https://127.0.0.1:{port}", ca_bundle(certs))
        )
        sa = release_service_account(cluster, RELEASE, SYSTEM_NS, "scheduler")
        sa_kubeconfig = cluster.service_account_kubeconfig(SYSTEM_NS, sa)
        webhook_sa = release_service_account(cluster, RELEASE, SYSTEM_NS, "webhook")
        webhook_kubeconfig = cluster.service_account_kubeconfig(SYSTEM_NS, webhook_sa)
        say(
            f"starting the webhook as ServiceAccount {SYSTEM_NS}/{webhook_sa} "
            f"and the scheduler as {SYSTEM_NS}/{sa}"
        )
        logs = workdir / "logs"
        webhook = run_webhook(
            certs, port, env={"KUBECONFIG": str(webhook_kubeconfig)}, log_path=logs / "webhook.log"
        )
        procs.append(webhook)
        scheduler = run_scheduler(
            sa_kubeconfig,
            env={
                "GPU_SCHEDULER_LEASE_NAME": chart_lease_name(cluster),
                "GPU_SCHEDULER_LEASE_NAMESPACE": SYSTEM_NS,
                "POD_NAMESPACE": SYSTEM_NS,
            },
            log_path=logs / "scheduler.log",
        )
        procs.append(scheduler)
        if keep:
            cluster.adopt("gpu-scheduler-webhook", webhook)
            cluster.adopt("gpu-scheduler", scheduler)

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
        else:
            say("placement does NOT match the map; see `kubectl describe pod` and the logs in " + str(logs))
            print(
                cluster.kubectl(
                    "get", "events", "-n", DEMO_NS, "--sort-by=.lastTimestamp", check=False
                ).stdout
            )
        if keep:
            say("the control plane keeps running; stop it with `make cluster-down`")
            print(f"export KUBECONFIG={cluster.kubeconfig}")
        return 0 if good else 1
    finally:
        if not keep:
            for proc in reversed(procs):
                proc.stop()
            cluster.stop()
            with contextlib.suppress(OSError):
                import shutil

                shutil.rmtree(workdir)
