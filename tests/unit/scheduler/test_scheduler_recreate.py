"""The backoff key of recreations of pods admitted without injection."""

from __future__ import annotations

from typing import Any

from kube_gpu_scheduler.scheduler.state.pods import recreate_slot


def pod(namespace: str, owner_uid: str | None) -> dict[str, Any]:
    refs = [{"kind": "StatefulSet", "name": "w", "uid": owner_uid, "controller": True}] if owner_uid else []
    return {"metadata": {"name": "w-1", "namespace": namespace, "uid": "p", "ownerReferences": refs}}


def test_a_bare_pod_has_no_slot() -> None:
    assert recreate_slot(pod("a", None), 1) is None


def test_a_tenant_naming_another_namespaces_controller_gets_its_own_slot() -> None:
    victim = recreate_slot(pod("team-a", "uid-of-a"), 1)
    forged = recreate_slot(pod("team-b", "uid-of-a"), 1)
    assert victim is not None and forged is not None and victim != forged
    assert recreate_slot(pod("team-a", "uid-of-a"), 2) != victim
