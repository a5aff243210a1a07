"""`make demo` (python -m localcluster demo): the README's first command, end to end."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from localcluster.cluster import REPO
from localcluster.procs import pid_alive

# It starts a control plane (in the demo's process).
pytestmark = pytest.mark.cluster


@pytest.mark.parametrize("mode", ["policy", "webhook"])
def test_demo_places_every_replica_and_cleans_up(tmp_path, mode: str) -> None:
    """`make demo` (policy mode, the chart's default) and `make demo DEMO_ARGS=--webhook`."""
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "localcluster",
            "demo",
            "--workdir",
            str(tmp_path / "demo"),
            *(["--webhook"] if mode == "webhook" else []),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    rows = [line.split() for line in res.stdout.splitlines() if re.match(r"^\d+\s+gpu-workload-", line)]
    assert [(r[0], r[1], r[2], r[3], r[4], r[5], r[-1]) for r in rows] == [
        ("0", "gpu-workload-0", "node1", "0,1", "0,1", "Running", "yes"),
        ("1", "gpu-workload-1", "node2", "2", "2", "Running", "yes"),
        ("2", "gpu-workload-2", "node3", "0,1,2", "0,1,2", "Running", "yes"),
    ]
    assert "every replica is Running on its mapped node" in res.stderr
    policies = re.search(r"^admission policies: (.*)$", res.stdout, re.M)
    webhooks = re.search(r"^webhook configurations: (.*)$", res.stdout, re.M)
    secrets = re.search(r"^TLS Secrets: (.*)$", res.stdout, re.M)
    assert policies and webhooks and secrets, res.stdout
    if mode == "policy":
        # No certificate anywhere: no webhook, no TLS Secret; the apiserver injected.
        assert "mutatingadmissionpolicy" in policies.group(1) and "-inject" in policies.group(1)
        assert (webhooks.group(1), secrets.group(1)) == ("none", "none")
        assert "gpu-scheduler-webhook" not in res.stdout
    else:
        assert "mutatingadmissionpolicy" not in policies.group(1)
        assert "mutatingwebhookconfiguration" in webhooks.group(1)
        assert "gpu-scheduler-webhook-tls" in secrets.group(1)
    # Without --keep, nothing the demo started survives it.
    leftovers = subprocess.run(
        ["pgrep", "-f", str(tmp_path / "demo")], capture_output=True, text=True, check=False
    )
    pids = [int(p) for p in leftovers.stdout.split()]
    assert not [p for p in pids if pid_alive(p)], f"demo left processes: {pids}"
