"""``python -m localcluster up|down|status|demo``: the local control plane for people.

``up`` starts it in the background under ``.cluster/`` and prints the
``export KUBECONFIG=...`` line; ``down`` stops every process it started.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

from localcluster.cluster import REPO, Cluster
from localcluster.procs import pid_alive

# `make cluster-up` keeps its state here (ignored by git); tests point it elsewhere.
STATE_DIR = Path(os.environ.get("GPU_SCHEDULER_CLUSTER_DIR", REPO / ".cluster"))


def _up(args: argparse.Namespace) -> int:
    state = STATE_DIR / "state.json"
    if state.exists():
        pids = json.loads(state.read_text())["pids"]
        if any(pid_alive(p) for p in pids.values()):
            print(
                f"already running; stop it with `make cluster-down`\nexport KUBECONFIG={STATE_DIR / 'admin.kubeconfig'}"
            )
            return 0
        Cluster.stop_from_state(STATE_DIR)
    if STATE_DIR.exists():
        import shutil

        shutil.rmtree(STATE_DIR)
    cluster = Cluster.start(STATE_DIR, gpu_nodes=args.nodes, gpus_per_node=args.gpus, detach=True)
    print(f"local control plane is up at {cluster.server} (logs: {STATE_DIR / 'logs'})", file=sys.stderr)
    print(f"fake GPU nodes: node1..node{args.nodes}, {args.gpus} x nvidia.com/gpu each", file=sys.stderr)
    print("stop it with: make cluster-down", file=sys.stderr)
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    return 0


def _down(_: argparse.Namespace) -> int:
    stopped = Cluster.stop_from_state(STATE_DIR)
    print(f"stopped: {', '.join(stopped)}" if stopped else "no local control plane was running")
    return 0


def _status(_: argparse.Namespace) -> int:
    state = STATE_DIR / "state.json"
    if not state.exists():
        print("not running")
        return 1
    pids = json.loads(state.read_text())["pids"]
    for name, pid in pids.items():
        print(f"{name:<24} pid {pid:<8} {'running' if pid_alive(pid) else 'GONE'}")
    print(f"export KUBECONFIG={STATE_DIR / 'admin.kubeconfig'}")
    return 0 if all(pid_alive(p) for p in pids.values()) else 1


def _demo(args: argparse.Namespace) -> int:
    from localcluster.demo import run

    return run(
        keep=args.keep,
        workdir=Path(args.workdir) if args.workdir else None,
        webhook=args.webhook,
        dra_mode=args.dra,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localcluster", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start in the background, print the KUBECONFIG line")
    up.add_argument("--nodes", type=int, default=3, help="fake GPU nodes (node1..nodeN)")
    up.add_argument("--gpus", type=int, default=4, help="nvidia.com/gpu per node")
    up.set_defaults(func=_up)
    sub.add_parser("down", help="stop what `up` started").set_defaults(func=_down)
    sub.add_parser("status", help="show the processes").set_defaults(func=_status)
    demo = sub.add_parser("demo", help="the end-to-end demo (make demo)")
    demo.add_argument("--keep", action="store_true", help="leave the control plane running afterwards")
    demo.add_argument(
        "--workdir", help="where to keep state (default: a temporary folder, or .cluster with --keep)"
    )
    demo.add_argument(
        "--webhook",
        action="store_true",
        help="inject with the admission webhook (pods, TLS certificates) instead of the default policy",
    )
    demo.add_argument(
        "--dra",
        action="store_true",
        help="DRA mode: NVIDIA's own DRA driver on the real node (stand-in GPUs), ResourceSlices like its "
        "on the kwok GPU nodes, the chart with dra.enabled=true; each replica's GPUs become a ResourceClaim "
        "kube-scheduler allocates",
    )
    demo.set_defaults(func=_demo)
    args = parser.parse_args(argv)
    # SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C: `demo` stops what it started and gives
    # the host back (its real node holds a host-wide lock), instead of leaving it running.
    signal.signal(signal.SIGTERM, _interrupt)
    return int(args.func(args))


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    sys.exit(main())
