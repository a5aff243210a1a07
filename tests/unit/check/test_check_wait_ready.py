"""``gpu-scheduler-check wait-ready``: the pure parts (Lease freshness, the dry-run pod, what
the dry-run answer must carry, the verdicts). The waiting itself runs against the local
control plane in tests/integration/test_check_wait_ready.py."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kube_gpu_scheduler.check.cli import build_parser, main
from kube_gpu_scheduler.check.lease import LeaseTracker, lease_problem, parse_time
from kube_gpu_scheduler.check.wait_ready import (
    Poll,
    Target,
    build_target,
    injection_problem,
    not_ready_summary,
    probe_pod,
    ready_summary,
)
from kube_gpu_scheduler.domain.podinfo import POD_INDEX_LABEL, entry_for
from kube_gpu_scheduler.domain.schedmap import ANNOTATION, parse

NOW = datetime(2026, 9, 20, 10, 0, 0, tzinfo=UTC)
NS, NAME = "gpu-scheduler-system", "gpu-scheduler"


def lease(holder: str | None = "sched-7f9-abc", renewed: float | None = 1.0, duration: Any = 15) -> dict:
    """A Lease as the apiserver returns it; ``renewed`` seconds before NOW."""
    spec: dict[str, Any] = {"leaseDurationSeconds": duration}
    if holder is not None:
        spec["holderIdentity"] = holder
    if renewed is not None:
        spec["renewTime"] = (NOW - timedelta(seconds=renewed)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "spec": spec}


# ---------------------------------------------------------------- the Lease
def test_a_renewed_lease_is_held() -> None:
    assert lease_problem(lease(), NS, NAME, NOW) is None
    assert lease_problem(lease(renewed=14.9), NS, NAME, NOW) is None


@pytest.mark.parametrize(
    ("obj", "words"),
    [
        (
            None,
            "no scheduler holds Lease gpu-scheduler in namespace gpu-scheduler-system: the Lease does not exist",
        ),
        (
            lease(holder=""),
            "no scheduler holds Lease gpu-scheduler in namespace gpu-scheduler-system: its holderIdentity is empty",
        ),
        (lease(holder=None), "holderIdentity is empty"),
        (lease(renewed=40), "'sched-7f9-abc' last renewed it 40 s ago, beyond its leaseDurationSeconds 15"),
        (lease(renewed=None), "never renewed it (no renewTime)"),
        (lease(duration=0), "with no leaseDurationSeconds"),
        (lease(duration="x"), "with no leaseDurationSeconds"),
        (lease(renewed=-100), "100 s in the future (clock skew?)"),
    ],
)
def test_what_a_lease_that_is_not_held_says(obj: dict | None, words: str) -> None:
    problem = lease_problem(obj, NS, NAME, NOW)
    assert problem is not None and words in problem, problem
    assert problem.startswith(f"no scheduler holds Lease {NAME} in namespace {NS}")


def test_a_renewal_seen_here_counts_whatever_the_clocks_say() -> None:
    """A scheduler on a node whose clock is 5 minutes behind writes old renewTimes: the record
    changing under our eyes within leaseDurationSeconds is proof enough (client-go's rule)."""
    skewed = lease(renewed=300)
    assert lease_problem(skewed, NS, NAME, NOW, changed_ago=None) is not None
    assert lease_problem(skewed, NS, NAME, NOW, changed_ago=3.0) is None
    assert lease_problem(skewed, NS, NAME, NOW, changed_ago=16.0) is not None
    # A released Lease is released, however recently it changed.
    assert lease_problem(lease(holder=""), NS, NAME, NOW, changed_ago=0.5) is not None


def test_the_tracker_reports_how_long_ago_the_record_changed() -> None:
    clock = [100.0]
    tracker = LeaseTracker(lambda: clock[0])
    first = lease(renewed=1)
    assert tracker.observe(first) is None  # no change seen yet
    clock[0] = 102.0
    assert tracker.observe(first) is None  # the same record
    clock[0] = 104.0
    assert tracker.observe(lease(renewed=0)) == 0.0  # renewed
    clock[0] = 110.0
    assert tracker.observe(lease(renewed=0)) == 6.0
    assert tracker.observe(None) is None  # deleted: forget


def test_parse_time_reads_micro_time_and_rejects_garbage() -> None:
    assert parse_time("2026-09-20T10:00:00.123456Z") == datetime(2026, 9, 20, 10, 0, 0, 123456, tzinfo=UTC)
    assert parse_time("2026-09-20T10:00:00+00:00") == NOW
    assert parse_time(NOW.replace(tzinfo=None)) == NOW  # what the python client hands over
    assert parse_time("yesterday") is None
    assert parse_time(None) is None


# ---------------------------------------------------------------- the dry-run pod
MAP = "2=node3:0,1,2\n0=node1:0,1\n1=node2:2\n"


def target(**kw: Any) -> Target:
    base: dict[str, Any] = {
        "namespace": "gpu-scheduler-tests",
        "lease_namespace": NS,
        "lease_name": NAME,
        "scheduler_name": "gpu-scheduler",
        "smap": parse(MAP),
        "image": "registry.example/gpu-scheduler:1.0",
        "service_account": "rel-gpu-scheduler-check-wait-ready",
    }
    return Target(**{**base, **kw})


def test_the_probe_pod_is_the_lowest_replica_as_the_webhook_and_scheduler_see_it() -> None:
    t = target()
    pod = probe_pod(t)
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["namespace"] == "gpu-scheduler-tests"
    assert meta["generateName"] and "name" not in meta  # never collides with a real pod
    assert meta["labels"][POD_INDEX_LABEL] == "0"
    assert parse(meta["annotations"][ANNOTATION]) == parse(MAP)
    # The project's own ordinal rule picks the entry the webhook will inject.
    ordinal, entry = entry_for(meta)
    assert (ordinal, str(entry)) == (0, "0=node1:0,1")
    assert spec["schedulerName"] == "gpu-scheduler"
    assert spec["serviceAccountName"] == "rel-gpu-scheduler-check-wait-ready"
    assert "nodeName" not in spec  # the admission policy refuses a mapped pod with one
    assert spec["automountServiceAccountToken"] is False
    (c,) = spec["containers"]
    assert c["image"] == "registry.example/gpu-scheduler:1.0"
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert "nvidia.com/gpu" not in str(c["resources"])
    assert not c.get("env")  # whatever comes back was injected
    assert "serviceAccountName" not in probe_pod(target(service_account=""))["spec"]


def answered(env: list[dict[str, str]], init_env: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """The dry-run's answer: the probe pod as the admission chain left it."""
    pod = probe_pod(target())
    pod["spec"]["containers"][0]["env"] = env
    if init_env is not None:
        pod["spec"]["initContainers"] = [{"name": "init", "image": "x", "env": init_env}]
    return pod


CUDA = [
    {"name": "CUDA_VISIBLE_DEVICES", "value": "0,1"},
    {"name": "CUDA_DEVICE_ORDER", "value": "PCI_BUS_ID"},
]


def test_an_injected_answer_is_ready() -> None:
    t = target()
    assert injection_problem(answered(CUDA), t.entry, "cuda", 0) is None
    nvidia = [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "0,1"},
        {"name": "CUDA_VISIBLE_DEVICES", "value": "0,1"},
        {"name": "CUDA_DEVICE_ORDER", "value": "PCI_BUS_ID"},
    ]
    assert injection_problem(answered(nvidia), t.entry, "nvidia", 0) is None


def test_an_answer_without_the_variables_says_the_webhook_has_not_injected() -> None:
    t = target()
    problem = injection_problem(answered([]), t.entry, "cuda", 0)
    assert problem == (
        "dry-run of a mapped pod (ordinal 0, 0=node1:0,1) came back without CUDA_VISIBLE_DEVICES "
        "(the webhook/policy has not injected yet)"
    )
    only_devices = [CUDA[0]]
    assert "without CUDA_DEVICE_ORDER" in str(injection_problem(answered(only_devices), t.entry, "cuda", 0))
    # Every container counts, init containers too (the webhook patches them all).
    assert "without CUDA_VISIBLE_DEVICES" in str(injection_problem(answered(CUDA, []), t.entry, "cuda", 0))


def test_an_answer_with_other_values_names_them() -> None:
    t = target()
    wrong = [{"name": "CUDA_VISIBLE_DEVICES", "value": "3"}, CUDA[1]]
    problem = str(injection_problem(answered(wrong), t.entry, "cuda", 0))
    assert "came back with CUDA_VISIBLE_DEVICES='3', not '0,1'" in problem, problem
    # cuda-mode variables while the chart expects nvidia mode: NVIDIA_VISIBLE_DEVICES is missing.
    assert "without NVIDIA_VISIBLE_DEVICES" in str(injection_problem(answered(CUDA), t.entry, "nvidia", 0))
    from_secret = [{"name": "CUDA_VISIBLE_DEVICES", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
    assert "(valueFrom)" in str(injection_problem(answered([*from_secret, CUDA[1]]), t.entry, "cuda", 0))


# ---------------------------------------------------------------- verdicts and the command line
def test_the_verdicts_say_what_was_waited_for() -> None:
    t = target()
    ready = ready_summary(t, Poll(holder="sched-7f9-abc"), 12.34, 7)
    assert ready == (
        "placement path ready after 12.3 s (7 polls): a scheduler (sched-7f9-abc) holds Lease "
        "gpu-scheduler-system/gpu-scheduler; a dry-run pod for ordinal 0 came back with "
        "CUDA_VISIBLE_DEVICES=0,1, CUDA_DEVICE_ORDER=PCI_BUS_ID"
    )
    assert "Lease check skipped" in ready_summary(target(lease_name=""), Poll(), 0.2, 1)
    poll = Poll(lease="no scheduler holds Lease x in namespace y: gone", injection="dry-run ... without X")
    assert not poll.ready
    assert not_ready_summary(poll, 240.2, "timeout 240 s") == (
        "placement path NOT ready after 240 s (timeout 240 s): "
        "no scheduler holds Lease x in namespace y: gone; dry-run ... without X"
    )


def args(*extra: str) -> argparse.Namespace:
    return build_parser().parse_args(["wait-ready", "--namespace", "ns", *extra])


def test_the_command_line_defaults_match_the_scheduler_chart() -> None:
    a = args("--map", "0=node1:0")
    assert (a.lease_namespace, a.lease_name, a.scheduler_name, a.mode) == (
        "gpu-scheduler-system",
        "gpu-scheduler",
        "gpu-scheduler",
        "cuda",
    )
    assert a.timeout == 240.0 and a.interval == 2.0
    t = build_target(args("--map", "3=n:1\n5=m:0", "--lease-name", "", "--mode", "nvidia"))
    assert (t.ordinal, str(t.entry), t.lease_name, t.mode) == (3, "3=n:1", "", "nvidia")


@pytest.mark.parametrize(
    ("text", "words"), [("0=node1", "--map: "), ("", "--map: "), ("# only\n", "the map has no entries")]
)
def test_a_bad_map_is_a_usage_error_with_the_parsers_words(
    text: str, words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    message = tmp_path / "termination-log"
    message.write_text("")
    code = main(["wait-ready", "-n", "ns", "--map", text, "--termination-message-path", str(message)])
    assert code == 2
    assert words in message.read_text(), message.read_text()
    assert words in capsys.readouterr().err
