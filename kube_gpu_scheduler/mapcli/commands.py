"""``gpu-scheduler-map plan`` and ``status``: the subcommands that read a live cluster.

``plan FILE|-``: what the scheduler would do with each replica of the input's StatefulSets
(:mod:`kube_gpu_scheduler.mapcli.plan`); exit 0 when every replica would be placed, 1 when one
would wait, 2 when the input or the cluster cannot be read. ``status``: who holds which GPU and
who waits (:mod:`kube_gpu_scheduler.mapcli.status`); exit 0, or 2 when the cluster cannot be read.
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
    if args.output == "json":
        json.dump(viewing.to_json(table, waits), out, indent=2)
        print(file=out)
    else:
        viewing.print_table(table, waits, out)
    return EXIT_OK
