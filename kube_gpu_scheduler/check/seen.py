"""What the in-pod check saw, in a form ``kubectl`` can read: node, NVML status, and per GPU index its UUID and PCI bus ID.

The record goes three places, none of which needs an API credential (the check
pods mount no ServiceAccount token; writing an annotation on its own pod would
need ``patch`` on pods, which would also let the pod rewrite its own
``gpu-scheduling-map``):

* the log line ``devices seen`` (``kubectl logs POD``), on the first run and
  whenever the verdict changes;
* ``serve``'s ``/checks`` and ``/readyz`` bodies, key ``seen``
  (``kubectl get --raw /api/v1/namespaces/NS/pods/POD:8080/proxy/checks``);
* the container's termination message when ``once`` or ``serve`` exits
  (``kubectl get pod POD -o jsonpath='{.status.containerStatuses[0].lastState.terminated.message}'``,
  or ``state.terminated`` for a ``once`` Job's pod). The file is written only when
  it already exists: the kubelet creates it; on a host it is not there.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kube_gpu_scheduler.check.results import Result, log, passed
from kube_gpu_scheduler.check.settings import Settings

# The kubelet keeps at most 4096 bytes of a container's termination message.
TERMINATION_MESSAGE_LIMIT = 4096


def seen(settings: Settings, results: Sequence[Result]) -> dict[str, Any]:
    """The record of one run: ``ok``, ``pod``, ``node``, ``mode``, ``nvml`` status, ``gpus``, the
    NVIDIA ``devices`` nodes in /dev, ``failed``, and when the GPUs are not the entry's the likely
    ``cause`` and its ``diagnosis`` (kube_gpu_scheduler.check.diagnose)."""
    gpus: list[dict[str, Any]] = []
    status = "not run"
    devices: Any = None
    why: dict[str, Any] = {}
    for r in results:
        if "cause" in r.extra and not why:
            why = {"cause": r.extra["cause"], "diagnosis": r.extra["diagnosis"]}
        if r.check == "dev":
            devices = r.actual
        if r.check != "nvml":
            continue
        if r.ok is None:
            status = f"skipped: {r.extra.get('skipped')}"
        elif isinstance(r.actual, dict):
            status = "ok" if r.ok else "errors: " + "; ".join(r.actual.get("errors") or [])
            gpus = [
                {"index": d.get("index"), "uuid": d.get("uuid"), "pci_bus_id": d.get("pci_bus_id")}
                for d in r.actual.get("devices") or []
            ]
        else:
            status = f"unavailable: {r.actual}"
    return {
        "ok": passed(results),
        "pod": settings.pod,
        "node": settings.node_name,
        "mode": settings.injection_mode,
        "nvml": status,
        # NVML's indices in this container: physical indices in cuda mode; 0..n-1 of the
        # mapped GPUs in nvidia mode (the runtime renumbers them), hence UUID and bus ID.
        "gpus": gpus,
        # /dev/nvidia<minor> per GPU the runtime (or DRA driver) gave, and /dev/nvidiactl.
        "devices": devices,
        "failed": [r.check for r in results if r.ok is False],
        **why,
    }


def termination_message(record: dict[str, Any], limit: int = TERMINATION_MESSAGE_LIMIT) -> str:
    """``record`` as compact JSON within ``limit`` bytes: GPUs that do not fit are left out and counted."""
    gpus = list(record.get("gpus") or [])
    keep = len(gpus)
    while True:
        doc = dict(record, gpus=gpus[:keep])
        if keep < len(gpus):
            doc["gpus_left_out"] = len(gpus) - keep
        text = json.dumps(doc, separators=(",", ":"), default=str)
        if len(text.encode()) <= limit or keep == 0:
            return text[:limit]
        keep -= 1


def write_termination_message(settings: Settings, record: dict[str, Any]) -> bool:
    """Write ``record`` to the termination message file when it exists; True when written."""
    path = Path(settings.termination_message_path)
    if not settings.termination_message_path or not path.is_file():
        log.debug("no termination message file", extra={"path": str(path), "pod": settings.pod})
        return False
    try:
        path.write_text(termination_message(record))
    except OSError as err:
        log.warning(
            "cannot write the termination message",
            extra={"path": str(path), "error": str(err), "pod": settings.pod},
        )
        return False
    return True
