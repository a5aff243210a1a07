"""The DRA phase's arm KT (bench/drakt.py): the StatefulSets and ResourceClaimTemplate a team
without gpu-scheduler writes, and the report's D/KT rows and "where D's extra CPU goes" line
(bench/drareport.py). The arm itself runs against the real control plane in
tests/integration/test_bench_smoke.py."""

from __future__ import annotations

import json

from bench.arms import Run
from bench.drakt import DRA_KCM, TEMPLATE, claim_of, claim_template, pod_names, statefulsets
from bench.drareport import DRA_COMPONENTS, dra_ratios, dra_section, extra_cpu_line
from bench.scales import SCALES
from bench.workload import Plan
from kube_gpu_scheduler.domain import dra


def test_one_parallel_statefulset_per_workload_asking_for_a_gpu_through_the_template() -> None:
    plan = Plan(100, 500, 1)
    docs = [json.loads(b) for b in statefulsets(plan, "tuned-kube-scheduler")]
    assert [d["metadata"]["name"] for d in docs] == ["w0", "w1", "w2", "w3", "w4"]
    assert sum(d["spec"]["replicas"] for d in docs) == 500
    spec = docs[0]["spec"]
    assert spec["podManagementPolicy"] == "Parallel"
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    pod = spec["template"]["spec"]
    assert pod["schedulerName"] == "tuned-kube-scheduler"
    ((claim,),) = [pod["resourceClaims"]]
    assert claim["resourceClaimTemplateName"] == TEMPLATE
    assert pod["containers"][0]["resources"]["claims"] == [{"name": claim["name"]}]
    # Nothing pins a replica: no affinity, no node name, no map.
    assert (
        "affinity" not in pod and "nodeName" not in pod and "annotations" not in spec["template"]["metadata"]
    )
    template = claim_template()
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"] == {"deviceClassName": dra.DEVICE_CLASS}
    assert pod_names(plan)[:2] == ["w0-0", "w0-1"] and len(set(pod_names(plan))) == 500
    status = {
        "status": {"resourceClaimStatuses": [{"name": claim["name"], "resourceClaimName": "w0-0-gpu-x1"}]}
    }
    assert claim_of(status) == "w0-0-gpu-x1" and claim_of({}) is None


def _run(arm: str, plan: Plan, rep: int, throughput: float, cpu_ms: dict[str, float]) -> Run:
    run = Run(
        arm, plan.key, rep, plan.pods, plan.pods / throughput, throughput, 0.1, 0.2 if arm == "D" else 0.4
    )
    run.cpu = {k: v * plan.pods / 1000 for k, v in cpu_ms.items()}
    return run


def test_d_against_kt_with_its_target_and_where_the_extra_cpu_goes() -> None:
    plan = SCALES["default"].dra_plan
    d_cpu = {"kube-apiserver": 30.0, "gpu-scheduler-dra": 12.0, DRA_KCM: 1.0, "etcd": 5.0}
    kt_cpu = {"kube-apiserver": 26.0, "gpu-scheduler-dra": 1.0, DRA_KCM: 7.0, "etcd": 5.0}
    # The control plane's pace drifts between repetitions: D/KT is the median of the ratios
    # within each (0.5, 1.8, 0.8), not the ratio of the medians (18/20).
    runs = [_run("D", plan, rep, t, d_cpu) for rep, t in enumerate((10.0, 18.0, 40.0))]
    runs += [_run("KT", plan, rep, t, kt_cpu) for rep, t in enumerate((20.0, 10.0, 50.0))]
    rows = {what.split(" (")[0]: (value, target) for what, _, value, target in dra_ratios(runs, plan, 3000)}
    assert rows["throughput D/KT"] == (0.8, ">= 0.9")
    assert rows["p99 create-to-bound D/KT"][0] == 0.5
    line = extra_cpu_line([r for r in runs if r.arm == "D"], [r for r in runs if r.arm == "KT"])
    # The largest gap first; equal processes left out.
    assert line.startswith(
        "**Where D's extra CPU goes** (ms per pod, D minus KT): all processes +9.0 (48.0 against 39.0)"
    )
    assert (
        line.index("gpu-scheduler-dra +11.0")
        < line.index(f"{DRA_KCM} -6.0")
        < line.index("kube-apiserver +4.0")
    )
    assert "etcd" not in line
    assert extra_cpu_line([], runs).endswith("no D and KT runs with CPU readings.")
    section = dra_section(runs, plan, 3000)
    assert DRA_KCM in DRA_COMPONENTS and "| KT: " in section and "**Where D's extra CPU goes**" in section


def test_d_against_kt_at_1000_nodes_at_the_full_scale() -> None:
    assert SCALES["full"].dra_plan == Plan(1000, 1000, 1)
    assert SCALES["default"].dra_plan.nodes == 100
