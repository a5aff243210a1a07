"""What ``make gitops-demo`` and the Argo CD tests watch: the release's names, kubectl reads,
and the timeline (what Argo CD recorded in its Applications, the product's pods, the hook pods,
the check chart's placement) with where each entry's time comes from."""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from localcluster.cluster import Cluster

SYSTEM_NS, CHECK_NS = "gpu-scheduler-system", "gpu-scheduler-tests"
RELEASE = "gpu-scheduler"
APPS = ("gpu-scheduler-in-cluster", "gpu-scheduler-check-in-cluster")


def say(msg: str) -> None:
    print(f"==> {msg}", file=sys.stderr, flush=True)


def get(cluster: Cluster, *args: str) -> dict[str, Any]:
    """``kubectl get <args> -o json`` (through the API client: these reads poll), {} if absent."""
    return cluster.get_json(*args)


HOOK_ANNOTATION = "argocd.argoproj.io/hook"


# Where a timeline entry's time comes from: a record Argo CD wrote (operationState,
# history, health), a condition Kubernetes objects carry (cert-manager's Ready), or the
# moment this program polled (what nothing records: a hook's outcome, an injected caBundle).
ARGOCD, RECORDED, POLLED = "argocd", "recorded", "polled"


@dataclass(frozen=True)
class Event:
    """One timeline entry: a key that dedupes it across polls, its text, and its time
    (None: the poll's moment) with where that time comes from."""

    key: str
    text: str
    at: datetime | None
    source: str


class Timeline:
    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.wall0 = datetime.now(UTC)
        self.events: list[tuple[float, str, str]] = []
        self.seen: set[str] = set()

    def mark(self, key: str, text: str, at: datetime | None = None, source: str | None = None) -> None:
        if key in self.seen:
            return
        self.seen.add(key)
        offset = (at - self.wall0).total_seconds() if at else time.monotonic() - self.t0
        src = source or (RECORDED if at else POLLED)
        self.events.append((offset, src, text))
        say(f"+{offset:6.1f}s  {src:<8}  {text}")

    def add(self, events: list[Event]) -> None:
        for e in events:
            self.mark(e.key, e.text, e.at, e.source)

    LEGEND = (
        "(argocd: the time Argo CD recorded in the Application's status, whole seconds; "
        "recorded: a condition's lastTransitionTime; polled: when this program saw it)"
    )

    def text(self) -> str:
        # sorted() is stable: entries with the same recorded second keep the order seen.
        lines = [f"+{t:6.1f}s  {src:<8}  {e}" for t, src, e in sorted(self.events, key=lambda x: x[0])]
        return "\n".join([self.LEGEND, *lines])


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _ts(s: str | None) -> datetime | None:
    return datetime.fromisoformat(s.replace("Z", "+00:00")) if s else None


def _rev(revision: Any) -> str:
    return str(revision)[:7] if revision else "?"


def app_events(app: dict[str, Any]) -> list[Event]:
    """What an Application's status records, at the times Argo CD recorded them:
    each sync's start (``operationState.startedAt``, ``history[].deployStartedAt``), its end
    (``operationState.finishedAt``, ``history[].deployedAt``), each health status
    (``health.lastTransitionTime``); hook Pods' outcomes (no time recorded) at the poll."""
    name = app.get("metadata", {}).get("name", "?")
    st = app.get("status") or {}
    out: list[Event] = []
    op = st.get("operationState") or {}
    # A running operation may not name its revision yet (RollingSync's syncs do not ask for
    # one): then it is syncing to the revision the Application is compared to.
    op_rev = (
        (op.get("syncResult") or {}).get("revision")
        or ((op.get("operation") or {}).get("sync") or {}).get("revision")
        or (st.get("sync") or {}).get("revision")
    )
    # Past syncs (history: only the successful ones), then the current operation. A sync's
    # events are keyed by its start time, so the history entry and the operation dedupe.
    for h in st.get("history") or []:
        started = h.get("deployStartedAt")
        if started:
            out.append(
                Event(
                    f"{name}/start/{started}",
                    f"{name}: sync started (revision {_rev(h.get('revision'))})",
                    _ts(started),
                    ARGOCD,
                )
            )
        if h.get("deployedAt"):
            out.append(
                Event(
                    f"{name}/end/{started or h.get('deployedAt')}",
                    f"{name}: sync Succeeded, revision {_rev(h.get('revision'))} deployed",
                    _ts(h["deployedAt"]),
                    ARGOCD,
                )
            )
    if op.get("startedAt"):
        started = op["startedAt"]
        out.append(
            Event(
                f"{name}/start/{started}",
                f"{name}: sync started (revision {_rev(op_rev)})",
                _ts(started),
                ARGOCD,
            )
        )
        phase = op.get("phase")
        if phase in ("Succeeded", "Failed", "Error") and op.get("finishedAt"):
            text = (
                f"{name}: sync Succeeded, revision {_rev(op_rev)} deployed"
                if phase == "Succeeded"
                else f"{name}: sync {phase}: {op.get('message', '')}"
            )
            out.append(Event(f"{name}/end/{started}", text, _ts(op["finishedAt"]), ARGOCD))
        for res in (op.get("syncResult") or {}).get("resources") or []:
            # The hook Pods (wait-ready, verify-release); their RBAC hooks would only repeat them.
            if (
                res.get("hookType")
                and res.get("kind") == "Pod"
                and res.get("hookPhase") in ("Succeeded", "Failed", "Error")
            ):
                out.append(
                    Event(
                        f"{name}/hook/{started}/{res['kind']}/{res['name']}",
                        f"{name}: {res['hookType']} hook {res['kind']} {res['name']} {res['hookPhase']}"
                        + (f": {res['message']}" if res.get("message") else ""),
                        None,
                        POLLED,
                    )
                )
    health = st.get("health") or {}
    if health.get("status"):
        changed = health.get("lastTransitionTime")
        out.append(
            Event(
                f"{name}/health/{health['status']}/{changed}",
                f"{name}: {health['status']}",
                _ts(changed),
                ARGOCD if changed else POLLED,
            )
        )
    return out


def observe(cluster: Cluster, tl: Timeline, apps: tuple[str, ...]) -> bool:
    """Record what happened since the last poll; True when every app is Synced and Healthy."""
    done = True
    for app in apps:
        a = get(cluster, "applications.argoproj.io", app, "-n", "argocd")
        tl.add(app_events(a) if a else [])
        st = a.get("status", {})
        op = st.get("operationState") or {}
        sync = st.get("sync", {}).get("status")
        health = st.get("health", {}).get("status")
        # Synced and Healthy say nothing of hooks: the sync operation itself must be over.
        done = done and sync == "Synced" and health == "Healthy" and op.get("phase") == "Succeeded"
    for cert in get(cluster, "certificates.cert-manager.io", "-A").get("items", []):
        for cond in (cert.get("status") or {}).get("conditions") or []:
            if cond["type"] == "Ready" and cond["status"] == "True":
                m = cert["metadata"]
                tl.mark(
                    f"cert/{m['namespace']}/{m['name']}",
                    f"certificate {m['namespace']}/{m['name']} issued by cert-manager",
                    _ts(cond.get("lastTransitionTime")),
                )
    for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        for w in get(cluster, kind, "-l", f"app.kubernetes.io/instance={RELEASE}").get("items", []):
            if all(h.get("clientConfig", {}).get("caBundle") for h in w.get("webhooks", [])):
                tl.mark(
                    f"ca/{kind}/{w['metadata']['name']}",
                    f"caBundle of {kind[:-1]} {w['metadata']['name']} filled by cainjector",
                )
    return done


def placement_table(cluster: Cluster) -> tuple[str, bool]:
    from kube_gpu_scheduler.domain.injection import format_devices, held_devices
    from kube_gpu_scheduler.domain.podinfo import entry_for

    pods = get(cluster, "pods", "-n", CHECK_NS, "-l", "app.kubernetes.io/name=gpu-scheduler-check").get(
        "items", []
    )
    # Not the verification hook pod: it carries the chart's labels too.
    pods = [p for p in pods if HOOK_ANNOTATION not in (p["metadata"].get("annotations") or {})]
    rows = [("ORDINAL", "POD", "NODE", "GPUS", "CUDA_VISIBLE_DEVICES", "PHASE", "MAP SAYS", "MATCH")]
    good = bool(pods)
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        ordinal, entry = entry_for(pod["metadata"])
        env = {e["name"]: e.get("value") for c in pod["spec"]["containers"] for e in c.get("env") or []}
        node = pod["spec"].get("nodeName") or "-"
        cuda = env.get("CUDA_VISIBLE_DEVICES") or "-"
        ok = (
            entry is not None
            and node == entry.node
            and cuda == entry.devices
            and pod["status"].get("phase") == "Running"
        )
        good = good and ok
        rows.append(
            (
                str(ordinal),
                pod["metadata"]["name"],
                node,
                format_devices(held_devices(pod.get("spec"))) if node != "-" else "-",
                cuda,
                pod["status"].get("phase", "?"),
                str(entry) if entry else "(no entry)",
                "yes" if ok else "NO",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ), good


class HookPods:
    """Every Argo CD hook pod as last seen, from a watch of all pods (a thread): Argo CD deletes
    a successful hook's pod at once, so polling could miss it."""

    def __init__(self, cluster: Cluster) -> None:
        from kubernetes import client, watch

        self.pods: dict[str, dict[str, Any]] = {}
        self.error = ""
        self._lock = threading.Lock()
        self._api = cluster.api_client()
        self._watch = watch.Watch()
        self._stream = self._watch.stream(
            client.CoreV1Api(self._api).list_pod_for_all_namespaces, timeout_seconds=3600
        )
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for ev in self._stream:
                pod = ev.get("raw_object") or {}
                meta = pod.get("metadata") or {}
                if HOOK_ANNOTATION not in (meta.get("annotations") or {}):
                    continue
                status = ((pod.get("status") or {}).get("containerStatuses") or [{}])[0]
                terminated = (status.get("state") or {}).get("terminated") or {}
                with self._lock:
                    self.pods[meta["uid"]] = {
                        "pod": f"{meta['namespace']}/{meta['name']}",
                        "hook": meta["annotations"][HOOK_ANNOTATION],
                        "node": (pod.get("spec") or {}).get("nodeName") or "-",
                        "phase": (pod.get("status") or {}).get("phase", "?"),
                        "exit": terminated.get("exitCode"),
                        "container": status.get("containerID", ""),
                        "started": _ts(terminated.get("startedAt")),
                        "finished": _ts(terminated.get("finishedAt")),
                        "deleted": ev["type"] == "DELETED",
                    }
        except Exception as e:  # the connection closed by stop(), or a broken watch
            self.error = repr(e)

    def seen(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(v) for v in self.pods.values()]

    def stop(self) -> None:
        """Stop watching. The thread ends at the next event, or when the control plane stops and
        the connection closes (a daemon thread: nothing waits for it)."""
        self._watch.stop()
        self._thread.join(timeout=1)
        self._api.close()


def component_pods(cluster: Cluster) -> list[dict[str, Any]]:
    """The scheduler chart's scheduler and webhook pods (not its helm test pods), with where and
    how they run."""
    rows = []
    for pod in get(cluster, "pods", "-n", SYSTEM_NS, "-l", f"app.kubernetes.io/instance={RELEASE}").get(
        "items", []
    ):
        meta, spec, st = pod["metadata"], pod["spec"], pod.get("status", {})
        component = (meta.get("labels") or {}).get("app.kubernetes.io/component", "")
        if component not in ("scheduler", "webhook") or meta.get("deletionTimestamp"):
            continue
        ready: dict[str, Any] = next((c for c in st.get("conditions") or [] if c["type"] == "Ready"), {})
        containers = st.get("containerStatuses") or []
        rows.append(
            {
                "component": component,
                "pod": meta["name"],
                "node": spec.get("nodeName") or "-",
                "phase": st.get("phase", "?"),
                "ready": ready.get("status") == "True",
                "ready_at": _ts(ready.get("lastTransitionTime")),
                "image": ",".join(c["image"] for c in spec["containers"]),
                "runtime": ",".join(c.get("containerID", "").partition("://")[0] or "-" for c in containers),
                "restarts": sum(int(c.get("restartCount", 0)) for c in containers),
            }
        )
    return sorted(rows, key=lambda r: (r["component"], r["pod"]))


def observe_pods(tl: Timeline, components: list[dict[str, Any]], hooks: list[dict[str, Any]]) -> None:
    """Timeline marks for the real pods: the scheduler's and webhook's Ready, each hook pod's run."""
    for r in components:
        if r["ready"]:
            tl.mark(f"pod/{r['pod']}/ready", f"pod {r['pod']} Ready on {r['node']}", r["ready_at"])
    for h in hooks:
        if h["finished"]:
            tl.mark(
                f"hook/{h['pod']}/{h['started']}",
                f"hook pod {h['pod']} ({h['hook']}) ran on {h['node']}: exit {h['exit']}",
                h["finished"],
            )


def rows_text(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = [head, *rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )
