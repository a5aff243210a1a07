"""``make demo``'s task layout without a cluster: the example (the task's map, the image and the
check program), the example as the demo applies it, the check's log lines it reads, the table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from kube_gpu_scheduler.check.settings import TABLE
from kube_gpu_scheduler.domain.schedmap import ANNOTATION, parse
from localcluster.cluster import REPO
from localcluster.demo import EXAMPLE, shares_with, sharing_lines, table
from localcluster.demo_task import RUNS_SHOWN, demo_example, visible_lines
from tests.support.mapcorpus import TASK_MAP

CHART = REPO / "gpu-scheduler-chart"


def example() -> dict[str, Any]:
    return yaml.safe_load(EXAMPLE.read_text())


def test_the_example_is_the_task_map_with_a_replica_per_entry() -> None:
    sts = example()
    text = sts["spec"]["template"]["metadata"]["annotations"][ANNOTATION]
    assert text == TASK_MAP
    assert sts["spec"]["replicas"] == len(parse(text)) == 5
    assert dict(parse(text).shared()) == {("node4", 3): (3, 4)}


def test_the_example_runs_the_check_program_of_the_released_image() -> None:
    (container,) = example()["spec"]["template"]["spec"]["containers"]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    # The image the chart installs by default: a release bump that forgets the example fails here.
    assert container["image"] == f"{values['image']['repository']}:{app_version}"
    assert container["command"] == ["gpu-scheduler-check", "serve"]
    # Every variable it sets is one the check program reads (kube_gpu_scheduler/check/settings.py).
    known = {s.env for s in TABLE}
    names = [e["name"] for e in container["env"]]
    assert set(names) <= known, set(names) - known
    assert {"POD_NAME", "POD_NAMESPACE", "NODE_NAME", "POD_INDEX", "GPU_SCHEDULING_MAP"} <= set(names)


def test_the_demo_applies_its_image_and_declares_no_gpu(tmp_path: Path) -> None:
    sts, path = demo_example(EXAMPLE, "localhost/gpu-scheduler:dev-1", tmp_path)
    assert yaml.safe_load(path.read_text()) == sts
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    assert (container["image"], container["imagePullPolicy"]) == ("localhost/gpu-scheduler:dev-1", "Never")
    assert {"name": "CHECK_EXPECT_NO_GPU", "value": "true"} in container["env"]
    assert sts["spec"]["replicas"] == 5
    assert sts["spec"]["template"]["metadata"]["annotations"][ANNOTATION] == TASK_MAP
    assert EXAMPLE.read_text() == (REPO / "examples" / "gpu-workload.yaml").read_text()  # untouched


def test_without_sharing_the_map_stops_before_its_first_sharer(tmp_path: Path) -> None:
    sts, _ = demo_example(EXAMPLE, "img:1", tmp_path, shared=False)
    assert sts["spec"]["replicas"] == 3
    assert (
        sts["spec"]["template"]["metadata"]["annotations"][ANNOTATION]
        == "0=node1:0,1\n1=node2:2\n2=node3:0,1,2\n"
    )


def test_visible_lines_are_the_checks_json_lines_of_each_run() -> None:
    line = {
        "level": "info",
        "msg": "visible devices",
        "node": "node4",
        "CUDA_VISIBLE_DEVICES": "3",
        "ok": True,
    }
    logs = "\n".join(
        [
            json.dumps(line),
            json.dumps({"msg": "check node passed"}),
            "not json",
            "{broken",
            json.dumps(dict(line, ok=False)),
        ]
    )
    assert visible_lines(logs) == [line, dict(line, ok=False)]
    assert RUNS_SHOWN >= 2  # "in a loop": more than one run shown


def test_the_demo_names_the_shared_gpu(tmp_path: Path) -> None:
    assert sharing_lines(example()) == ["node4:3 by ordinals 3, 4 (lines 4, 5)"]
    assert sharing_lines(demo_example(EXAMPLE, "img:1", tmp_path, shared=False)[0]) == []


def test_the_table_names_each_replicas_sharers_and_its_container() -> None:
    meta = {"name": "gpu-workload-3", "annotations": {ANNOTATION: TASK_MAP}}
    assert shares_with(meta, 3) == "4"
    assert shares_with(meta, 4) == "3"
    assert shares_with(meta, 0) == "-"
    assert shares_with({"name": "x"}, 0) == "-"
    row = {
        "ordinal": 3,
        "pod": "gpu-workload-3",
        "node": "node4",
        "gpus": "3",
        "cuda": "3",
        "phase": "Running",
        "container": "runs, Ready",
        "shares": "4",
        "expected": "3=node4:3",
        "ok": True,
    }
    head, line = table([row]).splitlines()
    assert head.split() == [
        "ORDINAL", "POD", "NODE", "GPUS", "CUDA_VISIBLE_DEVICES", "PHASE", "CONTAINER", "SHARES", "WITH", "MAP",
        "SAYS", "MATCH",
    ]  # fmt: skip
    assert line.split() == [
        "3",
        "gpu-workload-3",
        "node4",
        "3",
        "3",
        "Running",
        "runs,",
        "Ready",
        "4",
        "3=node4:3",
        "yes",
    ]
