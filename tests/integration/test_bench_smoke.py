"""``make bench`` keeps working: the smoke scale runs end to end inside ``make test``.

It runs ``python -m bench`` with ``BENCH_SCALE=smoke`` (its own control plane with 10
kwok nodes, 20 pods per plan, one repetition) and checks that every arm ran (the DRA
phase's too: the claim controller against kube-scheduler on claims made beforehand, against
StatefulSets with a ResourceClaimTemplate (arm KT: the StatefulSet and resourceclaim
controllers of the phase's own kube-controller-manager), and beside other allocated claims; the apiserver's CPU per create and per apply with 1 and 3
releases), that every correctness check passed and that the report
was written. Timings are never
asserted: they depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.apiserver import APISERVER_ARMS, largest_key, plan_key
from bench.arms import ARMS
from bench.dra import DRA_ARMS
from bench.raw import PodWatch, Raw
from bench.scales import SCALES
from bench.tenancy import TENANCY_ARMS
from localcluster.cluster import Cluster

pytestmark = pytest.mark.cluster


@pytest.mark.slow(
    reason="every make bench arm, each with its own control plane start, at the smoke scale", budget=300
)
def test_bench_smoke_scale_runs_every_arm_and_places_every_pod_correctly(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    workdir = tmp_path / "work"
    env = {**os.environ, "BENCH_SCALE": "smoke", "BENCH_DOC": str(doc), "BENCH_WORKDIR": str(workdir)}
    res = subprocess.run(
        [sys.executable, "-m", "bench"],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert res.returncode == 0, f"python -m bench failed ({res.returncode}):\n{res.stderr[-4000:]}"

    results = json.loads((workdir / "results.json").read_text())
    scale = SCALES["smoke"]
    runs = results["runs"]
    # Every run passed its read-back: each pod on its mapped node with its GPU, no GPU twice,
    # and the GPU variables present exactly when the webhook or the admission policies were on.
    assert runs and all(r["correct"] and not r["problems"] for r in runs), [
        r for r in runs if not r["correct"]
    ]
    measured = [r for r in runs if r["rep"] >= 0]
    bind = {(r["arm"], r["plan"]) for r in measured if r["arm"] in ARMS}
    assert bind == {(arm, plan.key) for arm in ARMS for plan in scale.plans}
    create = {(r["arm"], r["plan"]) for r in measured if r["arm"] in ("W+", "W-", "P")}
    assert create == {(arm, f"map{e}") for arm in ("W+", "W-", "P") for e in scale.webhook_maps}
    dra = {(r["arm"], r["plan"]) for r in measured if r["arm"] in DRA_ARMS}
    assert dra == {(arm, scale.dra_plan.key) for arm in DRA_ARMS}
    tenancy = {(r["arm"], r["plan"]) for r in measured if r["arm"] in TENANCY_ARMS}
    assert tenancy == {(arm, plan.key) for arm in TENANCY_ARMS for plan in scale.groups[0][1]}
    # What the apiserver spends: creates and applies, 1 and 3 releases, every map size; the
    # largest map with 3 releases. A 504 is counted (the report's row), never a failure here.
    api = scale.apiserver
    apiserver = {(r["arm"], r["plan"]) for r in measured if r["arm"] in APISERVER_ARMS}
    assert apiserver == {
        *((arm, plan_key(n, e)) for arm in APISERVER_ARMS for n in (1, 3) for e in api.maps),
        *((arm, plan_key(3, largest_key(api))) for arm in ("US", "PS")),
    }
    # The apiserver's CPU is read in clock ticks (10 ms): one small apply may read 0, never less,
    # and the arms together read some.
    api_runs = [r for r in measured if r["arm"] in APISERVER_ARMS]
    for r in api_runs:
        assert r["cpu"]["kube-apiserver"] >= 0 and r["apiserver_idle"] >= 0, r
    assert sum(r["cpu"]["kube-apiserver"] for r in api_runs) > 0, api_runs
    for r in measured:
        if r["arm"] in APISERVER_ARMS:
            continue
        if r["arm"] in DRA_ARMS:
            assert r["pods"] == scale.dra_plan.pods and r["throughput"] > 0, r
            if r["arm"] in ("D", "DF"):
                # The claim controller's own metrics were read: its replica keys and their CPU time.
                assert r["dra_keys"] >= r["pods"] and r["dra_key_cpu_ms"] > 0 and r["dra_key_ms"] > 0, r
            if r["arm"] == "KT":
                # The replicas and their claims came from the phase's kube-controller-manager.
                assert r["cpu"]["kube-controller-manager-dra"] > 0 and r["dra_keys"] == 0, r
            continue
        plan = next((p for p in scale.plans if p.key == r["plan"]), None)
        if r["arm"] in ("W+", "W-", "P"):
            want = scale.webhook_pods
        elif r["arm"] == "GR":  # one gang: the plan's first workload (bench/gang.py)
            assert plan is not None
            want = min(plan.pods, plan.nodes * plan.per_node)
        else:
            assert plan is not None
            want = plan.pods
        assert r["pods"] == want and r["throughput"] > 0 and r["p99"] >= r["p50"] >= 0, r
        if r["arm"] == "A":
            # Every pod's time inside the scheduler was read from its "bound" log line (bind_s),
            # and the p99 with that time taken out (the bound row) cannot exceed the p99.
            assert 0 <= r["own_p99"] < r["p99"] and 0 < r["p99_without_own"] <= r["p99"], r

    memory = results["memory"]
    for key in ("scheduler_idle", "scheduler_foreign", "webhook_idle", "webhook_after"):
        assert memory[key] > 0, (key, memory)
    assert any(k.startswith("scheduler_own_") for k in memory), memory

    text = doc.read_text()
    for heading in (
        "## Ratios",
        "## Bind arms",
        "## Injection: the webhook, the admission policies, nothing",
        "## Tenancy: on against off",
        "## What the apiserver spends",
        "## DRA mode",
        "## Memory (VmRSS)",
        "## Where the time goes",
    ):
        assert heading in text
    assert "Correctness failures" not in text
    png = doc.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The ratios table is printed at the end of the run.
    assert "throughput A/C" in res.stdout
    assert "bound for a gpu-scheduler taking no time at all" in res.stdout
    assert "pod creates with the admission policies (injection.mode policy) / without" in res.stdout
    assert "throughput D/K" in res.stdout and "claim controller's CPU per replica key" in res.stdout
    assert "throughput D/KT" in res.stdout and "**Where D's extra CPU goes**" in text
    assert "throughput T1/T0" in res.stdout
    assert "kube-apiserver CPU per mapped pod create, policy mode / unmutated" in res.stdout
    assert "504s answered to the" in res.stdout


def test_the_harness_pod_watch_resumes_when_the_apiserver_ends_it(cluster: Cluster) -> None:
    """On saturated cores the apiserver closes watchers it finds too slow ("Forcing pods
    watcher close due to unresponsiveness"); the harness's watch must resume from the last
    resourceVersion, or a run waits for pods it will never see bound."""
    raw = Raw(cluster.kubeconfig)
    ns = "bench-watch-resume"
    raw.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    watch = PodWatch(raw, ns).start()
    try:

        def pod(name: str) -> dict[str, object]:
            return {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name},
                "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "x"}]},
            }

        raw.post(f"/api/v1/namespaces/{ns}/pods", pod("before"))
        assert watch.wait_seen(1, 30)
        # The server side of the stream goes away, as when the apiserver drops the watcher.
        watch._list.resp.shutdown()
        raw.post(f"/api/v1/namespaces/{ns}/pods", pod("after"))
        raw.post(f"/api/v1/namespaces/{ns}/pods/after/binding", binding("after", "node1"))
        assert watch.wait_bound(1, 30), (watch.seen, watch.bound, watch.error)
        assert set(watch.seen) == {"before", "after"} and set(watch.bound) == {"after"}
        assert watch.resumed >= 1 and watch.error is None
    finally:
        watch.stop()
        raw.delete(f"/api/v1/namespaces/{ns}")
        raw.close()


def binding(name: str, node: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
