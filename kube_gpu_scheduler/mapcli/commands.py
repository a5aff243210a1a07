"""``gpu-scheduler-map plan``, ``status`` and ``suggest``: the subcommands that read a live cluster.

``plan FILE|-``: what the scheduler would do with each replica of the input's StatefulSets
(:mod:`kube_gpu_scheduler.mapcli.plan`); exit 0 when every replica would be placed, 1 when one
would wait, 2 when the input or the cluster cannot be read. ``status``: who holds which GPU and
who waits (:mod:`kube_gpu_scheduler.mapcli.status`); exit 0, or 2 when the cluster cannot be read.
``suggest``: a map for R replicas of K topology-aligned free GPUs
(:mod:`kube_gpu_scheduler.mapcli.suggest`); exit 1 when not all fit.
Both take ``--kubeconfig`` (else ``KUBECONFIG``, in-cluster, ``~/.kube/config``) and
``-o table|json``. Installed also as ``kubectl-gpu_map``: ``kubectl gpu-map status``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

import yaml

from kube_gpu_scheduler.kube.client import KubeConfigError, load_client
from kube_gpu_scheduler.kube.errors import error_message
from kube_gpu_scheduler.mapcli import plan as planning
from kube_gpu_scheduler.mapcli import status as viewing
from kube_gpu_scheduler.mapcli import suggest as suggesting
from kube_gpu_scheduler.mapcli import topology
from kube_gpu_scheduler.mapcli.live import Cluster

EXIT_OK, EXIT_WAITS, EXIT_UNREADABLE = 0, 1, 2
DEFAULT_SCHEDULER_NAME = "gpu-scheduler"


def add_commands(sub: Any) -> None:
    p = sub.add_parser(
        "plan",
        help="what the scheduler would do with each replica, against the live cluster; exit 0 all "
        "placed, 1 one would wait, 2 unreadable",
        description="Read StatefulSets (a file or '-' for stdin, e.g. `helm template ... | gpu-scheduler-map "
        "plan -`) and the live cluster, and say per replica where it would be bound, or why it would "
        "wait: the GPU's holder, a node missing or unschedulable, an index out of range, no room, "
        "another map not yet placed that wants the same GPU (MapConflict). A gang (gpu-scheduler.io/gang) "
        "places all its replicas or none. Exit 0 when every replica would be placed.",
    )
    p.add_argument(
        "file", nargs="?", default="-", metavar="FILE", help="YAML with StatefulSets; '-' is stdin"
    )
    p.add_argument(
        "-n", "--namespace", default="default", help="for StatefulSets that name none (default: %(default)s)"
    )
    p.add_argument(
        "--dra",
        action="store_true",
        help="the cluster runs DRA mode: GPUs named by PCI bus ID are then no refusal",
    )
    s = sub.add_parser(
        "status",
        help="per node its GPUs, who holds each and which are free; the replicas waiting and why",
        description="Per node its GPUs (by index), the pod holding each (namespace, pod, StatefulSet, "
        "ordinal, mode: env = its injected variables, map = its entry without them, dra = its "
        "ResourceClaim) or 'free', and the replicas waiting with the scheduler's reason. Read from "
        "what the scheduler trusts (containers' variables, DRA claims), never from annotations.",
    )
    g = sub.add_parser(
        "suggest",
        help="a complete map for R replicas of K GPUs each from the live cluster's free GPUs, each "
        "replica's GPUs under one PCIe root (else NUMA node); exit 0, 1 when not all fit, 2 unreadable",
        description="Propose an explicit map (named entries) for --replicas replicas of --gpus GPUs each "
        "from the GPUs no pod or claim holds and no unplaced map wants, each replica's GPUs under one "
        "PCIe root (else one NUMA node) where the nodes' DRA driver publishes it, best fit first. "
        "Prints a manifest fragment to merge into the StatefulSet (-o map: the map alone). Nothing is "
        "reserved: check it with `plan` and apply it soon.",
    )
    g.add_argument("--replicas", type=int, required=True, help="how many replicas (R)")
    g.add_argument("--gpus", type=int, required=True, help="GPUs per replica (K)")
    g.add_argument("--nodes", default="", help="only these nodes (comma-separated; default: every node)")
    g.add_argument("--name", default="gpu-workload", help="the StatefulSet's name, for the comment")
    g.add_argument("-o", "--output", choices=["yaml", "map"], default="yaml", help="stdout format")
    g.add_argument("--kubeconfig", help="kubeconfig file (default: KUBECONFIG, in-cluster, ~/.kube/config)")
    g.add_argument(
        "--scheduler-name",
        default=DEFAULT_SCHEDULER_NAME,
        help="the scheduler's name (its pods' spec.schedulerName; default: %(default)s)",
    )
    for cmd in (p, s):
        cmd.add_argument(
            "--kubeconfig", help="kubeconfig file (default: KUBECONFIG, in-cluster, ~/.kube/config)"
        )
        cmd.add_argument("-o", "--output", choices=["table", "json"], default="table", help="stdout format")
        cmd.add_argument(
            "--scheduler-name",
            default=DEFAULT_SCHEDULER_NAME,
            help="the scheduler's name (its pods' spec.schedulerName; default: %(default)s)",
        )


def _cluster(args: argparse.Namespace, err: TextIO) -> tuple[Any, Cluster] | None:
    try:
        api = load_client(args.kubeconfig, user_agent="gpu-scheduler-map")
        return api, Cluster.read(api)
    except KubeConfigError as exc:
        print(f"gpu-scheduler-map: {exc}", file=err)
    except Exception as exc:
        print(f"gpu-scheduler-map: cannot read the cluster: {error_message(exc)}", file=err)
    return None


def live_slices(kubeconfig: str | None, err: TextIO) -> list[dict[str, Any]] | None:
    """``validate --live``: the cluster's ResourceSlices; None (said on ``err``) when unreadable."""
    try:
        api = load_client(kubeconfig, user_agent="gpu-scheduler-map")
        try:
            return topology.read_slices(api)
        finally:
            api.close()
    except KubeConfigError as exc:
        print(f"gpu-scheduler-map: {exc}", file=err)
    except Exception as exc:
        print(f"gpu-scheduler-map: cannot read the cluster: {error_message(exc)}", file=err)
    return None


def run_plan(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        if args.file == "-":
            text = sys.stdin.read()
        else:
            with open(args.file, encoding="utf-8-sig") as fh:
                text = fh.read()
        wanted = planning.statefulsets(text, args.namespace)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        print(f"gpu-scheduler-map plan: cannot read {args.file}: {exc}", file=err)
        return EXIT_UNREADABLE
    if not wanted:
        print(f"gpu-scheduler-map plan: {args.file}: no StatefulSet with a gpu-scheduling-map", file=err)
        return EXIT_UNREADABLE
    got = _cluster(args, err)
    if got is None:
        return EXIT_UNREADABLE
    api, cluster = got
    api.close()
    plans = planning.plan(wanted, cluster, args.scheduler_name, args.dra)
    ok = all(p.ok for p in plans)
    if args.output == "json":
        json.dump({"ok": ok, "statefulsets": [p.to_json() for p in plans]}, out, indent=2)
        print(file=out)
    else:
        for i, p in enumerate(plans):
            if i:
                print(file=out)
            gang = ", gang: all or none" if p.gang else ""
            print(f"StatefulSet {p.namespace}/{p.name} ({len(p.replicas)} replicas{gang})", file=out)
            rows = [("ORDINAL", "NODE", "GPUS", "VERDICT")]
            for r in p.replicas:
                e = r.entry
                verdict = "placed" if r.placed else f"waits: {r.reason}: {r.message}"
                if r.sharing:
                    verdict += f" ({r.sharing})"
                if r.topology:
                    verdict += f" (warning: {r.topology}: GPUs under one root talk faster)"
                rows.append((str(r.ordinal), e.node if e else "", e.devices if e else "", verdict))
            widths = [max(len(row[i]) for row in rows) for i in range(3)]
            for row in rows:
                print("  ".join(f"{c:<{widths[i]}}" for i, c in enumerate(row[:3])) + "  " + row[3], file=out)
    print(
        "every replica would be placed" if ok else "some replicas would wait: see above",
        file=err,
    )
    return EXIT_OK if ok else EXIT_WAITS


def run_status(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    got = _cluster(args, err)
    if got is None:
        return EXIT_UNREADABLE
    api, cluster = got
    notes = viewing.latest_warnings(api, args.scheduler_name)
    api.close()
    table = viewing.gpu_table(cluster, args.scheduler_name)
    waits = viewing.waiting(cluster, args.scheduler_name, notes)
    spans = topology.spanning(cluster.pods, cluster.slices, args.scheduler_name)
    if args.output == "json":
        json.dump(viewing.to_json(table, waits, spans), out, indent=2)
        print(file=out)
    else:
        viewing.print_table(table, waits, out, spans)
    return EXIT_OK


def run_suggest(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if not (0 < args.replicas <= 10_000 and 0 < args.gpus <= 32):
        print("gpu-scheduler-map suggest: --replicas must be 1-10000 and --gpus 1-32", file=err)
        return EXIT_UNREADABLE
    got = _cluster(args, err)
    if got is None:
        return EXIT_UNREADABLE
    api, cluster = got
    api.close()
    held = cluster.holdings(args.scheduler_name)
    taken = suggesting.taken_gpus(
        cluster, args.scheduler_name, planning.wanted(cluster, held, args.scheduler_name)
    )
    nodes = {n.strip() for n in args.nodes.split(",") if n.strip()}
    placed, short = suggesting.suggest(cluster, args.replicas, args.gpus, taken, nodes)
    if placed:
        out.write(
            suggesting.map_text(placed) if args.output == "map" else suggesting.fragment(placed, args.name)
        )
    if short:
        print(f"gpu-scheduler-map suggest: {short}", file=err)
        return EXIT_WAITS
    return EXIT_OK
