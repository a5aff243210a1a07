"""The command line: parse the subcommand, read the settings once, run the program it names."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from kube_gpu_scheduler.base import logs
from kube_gpu_scheduler.base.argtypes import non_negative_float, non_negative_int
from kube_gpu_scheduler.check.once_serve import cmd_once, cmd_serve
from kube_gpu_scheduler.check.probe import cmd_http_get
from kube_gpu_scheduler.check.results import EXIT_USAGE, log
from kube_gpu_scheduler.check.settings import MODES, Settings
from kube_gpu_scheduler.check.verify_release import cmd_verify_release
from kube_gpu_scheduler.check.wait_ready import DEFAULT_INTERVAL, DEFAULT_TIMEOUT, cmd_wait_ready


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu-scheduler-check",
        description="Check that a pod runs on the node and with the GPUs its gpu-scheduling-map names.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("once", help="run the checks from the environment once; exit 0 match, 1 mismatch")
    sub.add_parser("serve", help="re-check every CHECK_INTERVAL_SECONDS; /readyz 200 match, 503 mismatch")
    v = sub.add_parser("verify-release", help="through the API: every selected pod placed as its map says")
    v.add_argument("--namespace", "-n", required=True)
    v.add_argument("--selector", "-l", required=True, help="label selector of the release's pods")
    v.add_argument(
        "--timeout", type=non_negative_float, default=120.0, help="seconds to wait for convergence"
    )
    v.add_argument("--interval", type=non_negative_float, default=2.0, help="seconds between attempts")
    v.add_argument(
        "--mode", choices=["auto", *MODES], default="auto", help="injection mode; auto: per container"
    )
    v.add_argument("--kubeconfig", help="default: $KUBECONFIG, else in-cluster, else ~/.kube/config")
    v.add_argument(
        "--termination-message-path",
        help="also write a one-line verdict naming each failing replica into this file if it exists "
        "(/dev/termination-log in a pod: Argo CD shows it for a failed hook)",
    )
    w = sub.add_parser(
        "wait-ready",
        help="wait until a scheduler holds its Lease and a dry-run mapped pod comes back with its GPUs",
    )
    w.add_argument("--namespace", "-n", required=True, help="where the probe pod is dry-run created")
    w.add_argument("--map", required=True, help="the gpu-scheduling-map text (its lowest ordinal is probed)")
    w.add_argument("--scheduler-name", default="gpu-scheduler", help="spec.schedulerName of the probe pod")
    w.add_argument("--mode", choices=list(MODES), default="cuda", help="injection mode the webhook uses")
    w.add_argument(
        "--lease-namespace", default="gpu-scheduler-system", help="namespace of the scheduler's Lease"
    )
    w.add_argument(
        "--lease-name",
        default="gpu-scheduler",
        help="the scheduler's leader-election Lease; empty: skip the Lease (leader election off)",
    )
    w.add_argument("--image", default="gpu-scheduler-check", help="image of the probe pod (never pulled)")
    w.add_argument("--service-account", default="", help="ServiceAccount of the probe pod (default: default)")
    w.add_argument(
        "--timeout", type=non_negative_float, default=DEFAULT_TIMEOUT, help="seconds to wait before failing"
    )
    w.add_argument(
        "--interval", type=non_negative_float, default=DEFAULT_INTERVAL, help="seconds between polls"
    )
    w.add_argument("--kubeconfig", help="default: $KUBECONFIG, else in-cluster, else ~/.kube/config")
    w.add_argument(
        "--termination-message-path",
        help="on failure, also write the verdict (what is still missing) into this file if it exists",
    )
    h = sub.add_parser("http-get", help="GET a URL and expect a status (helm test)")
    h.add_argument("url")
    h.add_argument("--cafile", help="CA bundle to verify an https:// server with")
    h.add_argument("--expect", type=int, default=200, help="status code wanted (default 200)")
    h.add_argument("--timeout", type=non_negative_float, default=5.0, help="seconds per attempt")
    h.add_argument("--retries", type=non_negative_int, default=3, help="attempts after the first")
    h.add_argument("--delay", type=non_negative_float, default=2.0, help="seconds between attempts")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = Settings.from_env(os.environ)
    except ValueError as err:  # SettingsError
        logs.setup()
        log.error(f"bad environment: {err}")
        return EXIT_USAGE
    logs.setup(settings.log_level)
    if args.command == "once":
        return cmd_once(settings)
    if args.command == "serve":
        return cmd_serve(settings)
    if args.command == "verify-release":
        return cmd_verify_release(args)
    if args.command == "wait-ready":
        return cmd_wait_ready(args)
    return cmd_http_get(args)
