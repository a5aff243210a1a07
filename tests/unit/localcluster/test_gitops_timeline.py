"""The gitops demo's timeline prints the times Argo CD recorded, not the moments it polled.

The Applications under tests/unit/localcluster/data/ were recorded from a real Argo CD (v3.5.7, the
pinned one) on the local control plane by tests/integration/test_argocd_real.py: the
scheduler and the check Application of the complete ApplicationSet after a first revision
and then one commit changing both charts (RollingSync synced each twice per revision).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from localcluster.gitops_timeline import ARGOCD, POLLED, Timeline, app_events

DATA = Path(__file__).parent / "data"
RECORDED = sorted(DATA.glob("argocd-application-*.json"))


def load(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def ts(s: str) -> datetime:
    return datetime.fromisoformat(s.replace("Z", "+00:00"))


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_every_recorded_time_is_on_the_timeline_at_that_time(path: Path) -> None:
    app = load(path)
    status = app["status"]
    events = app_events(app)
    at = {e.at for e in events if e.source == ARGOCD}
    name = app["metadata"]["name"]
    # Every sync: its start and its end, at the times Argo CD wrote down.
    for h in status["history"]:
        assert ts(h["deployStartedAt"]) in at, h
        assert ts(h["deployedAt"]) in at or ts(status["operationState"]["finishedAt"]) in at, h
    op = status["operationState"]
    assert ts(op["startedAt"]) in at and ts(op["finishedAt"]) in at
    # The health, at its lastTransitionTime.
    health = status["health"]
    (healthy,) = [e for e in events if e.text == f"{name}: {health['status']}"]
    assert healthy.at == ts(health["lastTransitionTime"]) and healthy.source == ARGOCD
    # Only hook outcomes (Argo CD records no time for them) are placed at the poll.
    assert {e.source for e in events if e.at is None} <= {POLLED}
    assert all("hook" in e.text for e in events if e.at is None)


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_a_sync_is_listed_once_whether_seen_in_history_or_in_the_operation(path: Path) -> None:
    app = load(path)
    tl = Timeline()
    for _ in range(3):  # three polls of the same status
        tl.add(app_events(app))
    starts = [e for _, _, e in tl.events if "sync started" in e]
    assert len(starts) == len({h["deployStartedAt"] for h in app["status"]["history"]}), tl.text()
    revisions = {h["revision"][:7] for h in app["status"]["history"]}
    assert {s.rsplit(" ", 1)[-1].rstrip(")") for s in starts} == revisions


def test_the_timeline_orders_by_recorded_time_and_says_where_times_come_from() -> None:
    sched = load(DATA / "argocd-application-scheduler.json")
    check = load(DATA / "argocd-application-check.json")
    tl = Timeline()
    tl.wall0 = ts(sched["status"]["operationState"]["startedAt"])
    tl.add(app_events(check))  # polled first: the order on the timeline is still the recorded one
    tl.add(app_events(sched))
    lines = tl.text().splitlines()
    assert lines[0].startswith("(argocd: the time Argo CD recorded")
    offsets = [float(line.split("s", 1)[0].lstrip("+")) for line in lines[1:]]
    assert offsets == sorted(offsets)
    text = "\n".join(lines)
    sched_name, check_name = sched["metadata"]["name"], check["metadata"]["name"]
    # The question, answered from the records: on the latest revision the check's
    # first sync started once the scheduler had turned Healthy (the same second here).
    revision = sched["status"]["sync"]["revision"]
    healthy = ts(sched["status"]["health"]["lastTransitionTime"])
    first_check = min(
        ts(h["deployStartedAt"]) for h in check["status"]["history"] if h["revision"] == revision
    )
    assert first_check >= healthy
    started = f"{check_name}: sync started (revision {revision[:7]})"
    at_healthy = next(
        o for o, line in zip(offsets, lines[1:], strict=True) if line.endswith(f"{sched_name}: Healthy")
    )
    at_check = next(o for o, line in zip(offsets, lines[1:], strict=True) if line.endswith(started))
    assert at_check >= at_healthy, text  # whole seconds: a tie keeps the order the polls saw
    assert f"{sched_name}: sync started (revision {revision[:7]})" in text


def test_a_status_without_records_yields_nothing_recorded() -> None:
    assert app_events({"metadata": {"name": "a"}, "status": {}}) == []
    events = app_events({"metadata": {"name": "a"}, "status": {"health": {"status": "Progressing"}}})
    assert [(e.text, e.at, e.source) for e in events] == [("a: Progressing", None, POLLED)]
