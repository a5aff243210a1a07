"""`helm test gpu-scheduler`: the chart's own test hooks pass against the installed release.

kwok runs no containers, so each hook Pod's command (gpu-scheduler-check http-get ...)
runs here as a host process, against the real scheduler and webhook running as host
processes under the chart's ServiceAccount. The one thing changed is the address:
the in-cluster Service name (no kube-proxy or cluster DNS here) becomes the host
process's 127.0.0.1 port, and the CA file the hook mounts becomes a file holding
the same bytes. A stopped scheduler must make the hook fail.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import yaml

from localcluster.cluster import Cluster, free_port
from localcluster.release import REPO, SCHEDULER_CHART, release_service_account
from localcluster.scheduler_host import run_scheduler
from localcluster.webhook_host import ca_bundle, make_certs, run_webhook
from tests.integration.fixtures_chart import hook_commands

CHECK = Path(sys.executable).parent / "gpu-scheduler-check"


def _run_hook(
    argv: list[str], ports: dict[str, int], ca_files: dict[str, Path]
) -> subprocess.CompletedProcess[str]:
    assert argv[:2] == ["gpu-scheduler-check", "http-get"], argv
    args = list(argv[2:])
    url = urlsplit(args[0])
    args[0] = urlunsplit(url._replace(netloc=f"127.0.0.1:{ports[url.scheme]}"))
    if "--cafile" in args:
        i = args.index("--cafile") + 1
        args[i] = str(ca_files[args[i]])
    return subprocess.run(
        [str(CHECK), "http-get", *args, "--timeout", "3", "--retries", "2"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_scheduler_chart_helm_tests_pass_against_the_running_release(
    cluster: Cluster, namespace: str, helm_release: Any, tmp_path: Path
) -> None:
    certs = make_certs(tmp_path / "certs")
    values = yaml.safe_load((REPO / SCHEDULER_CHART / "ci" / "webhook-cabundle-values.yaml").read_text())
    values["webhook"]["caBundle"] = ca_bundle(certs)
    # Scope the webhook configurations to this namespace, which they also exclude: they match nothing.
    values["webhook"]["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    release = helm_release(f"ht-{namespace}", namespace, values, SCHEDULER_CHART)

    sa = release_service_account(cluster, release, namespace)
    sa_kubeconfig = cluster.service_account_kubeconfig(namespace, sa)
    # The CA ConfigMap is an object of the release, not a hook (helm test --logs reads a pod per hook).
    manifest_text = cluster.helm("get", "manifest", release, "--namespace", namespace).stdout
    commands = hook_commands(cluster, release, namespace)
    assert {c.pod.rsplit("-", 1)[-1] for c in commands} == {"health", "webhook"}

    # The CA the webhook hook mounts (its ConfigMap, rendered from webhook.caBundle).
    assert all(c.pod.endswith(("-test-health", "-test-webhook")) for c in commands)
    ca_files: dict[str, Path] = {}
    for doc in yaml.safe_load_all(manifest_text):
        if doc and doc["kind"] == "ConfigMap" and "ca.crt" in doc.get("data", {}):
            (tmp_path / "hook-ca.crt").write_text(doc["data"]["ca.crt"])
    for c in commands:
        if "--cafile" in c.argv:
            ca_files[c.argv[c.argv.index("--cafile") + 1]] = tmp_path / "hook-ca.crt"

    wport, sport = free_port(), free_port()
    with (
        run_webhook(certs, wport),
        run_scheduler(
            sa_kubeconfig,
            env={"GPU_SCHEDULER_LEASE_NAMESPACE": namespace, "POD_NAMESPACE": namespace},
            http_port=sport,
        ) as scheduler,
    ):
        ports = {"http": sport, "https": wport}
        for c in commands:
            res = _run_hook(c.argv, ports, ca_files)
            assert res.returncode == 0, f"helm test {c.pod} failed: {res.stdout}{res.stderr}"
        # The hook can fail: with the scheduler gone, its health check does.
        scheduler.stop()
        health = next(c for c in commands if c.pod.endswith("-health"))
        assert _run_hook(health.argv, ports, ca_files).returncode != 0
