"""``gpu-scheduler``: the console script.

Reads the settings once, serves the HTTP endpoints, syncs the caches, takes
part in leader election and places pods until SIGTERM or SIGINT; then it stops
placing pods, releases the Lease and exits 0.
"""

from __future__ import annotations

import logging
import signal
import ssl
import sys
from collections.abc import Sequence
from types import FrameType

from gpu_scheduling import logs
from gpu_scheduling.kube.client import load_client
from gpu_scheduling.kube.tls import server_context
from scheduler import settings as settings_mod
from scheduler.core import Scheduler
from scheduler.extender import Extender, ExtenderServer
from scheduler.server import HealthServer

log = logging.getLogger("gpu_scheduler")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = settings_mod.load(argv)
    except settings_mod.SettingsError as err:
        logs.setup("INFO")
        log.error("invalid settings", extra={"error": str(err)})
        return 2
    logs.setup(settings.log_level)
    log.info(
        "starting",
        extra={
            "schedulerName": settings.scheduler_name,
            "identity": settings.identity,
            "leaderElect": settings.leader_elect,
            "lease": f"{settings.lease_namespace}/{settings.lease_name}",
            "httpPort": settings.http_port,
            "mode": settings.mode,
        },
    )
    try:
        api_client = load_client(
            settings.kubeconfig,
            pool_size=settings.workers + 8,
            user_agent=f"gpu-scheduler/{settings.identity}",
        )
    except Exception as err:
        log.error("cannot load the Kubernetes client configuration", extra={"error": str(err)})
        return 1

    scheduler = Scheduler(settings, api_client)

    def stop(signum: int, _frame: FrameType | None) -> None:
        log.info("shutting down", extra={"signal": signal.Signals(signum).name})
        scheduler.stop_event.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    probes = scheduler.probes()
    extender_server: ExtenderServer | None = None
    if settings.mode == settings_mod.EXTENDER:
        try:
            ctx = server_context(
                settings.extender_tls_cert_file,
                settings.extender_tls_key_file,
                settings.extender_client_ca_file,
                require_client_cert=True,
            )
            extender = Extender(scheduler, api_client)
            extender_server = ExtenderServer(settings.extender_address, settings.extender_port, extender, ctx)
        except (OSError, ssl.SSLError) as err:
            log.error("cannot serve the extender", extra={"port": settings.extender_port, "error": str(err)})
            return 1
        probes = extender.probes(probes, extender_server.alive)
    try:
        server = HealthServer(settings.http_address, settings.http_port, probes)
    except OSError as err:
        log.error("cannot listen", extra={"port": settings.http_port, "error": str(err)})
        return 1
    server.start()
    if extender_server is not None:
        extender_server.start()
    scheduler.start()
    try:
        scheduler.run_until_stopped()
    finally:
        if extender_server is not None:
            extender_server.stop()  # no bind may start while the Lease is being released
        scheduler.shutdown()
        server.stop()
        log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
