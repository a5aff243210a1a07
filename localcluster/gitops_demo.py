"""``make gitops-demo``: argocd/ synced by a real Argo CD, the product running as real pods.

Builds the image of this tree (localcluster/image.py) and starts the control plane with the
kwok GPU nodes and one real kubelet node (localcluster/node.py) holding it, as ``make demo``
does; Argo CD runs as host processes (an upstream program, not ours). This checkout is
committed into a local bare repository and argocd/ is applied with only the repository URL
(the cluster Secret's annotation, and the AppProject allow-list entry that must equal it)
and the image (``image.*`` in each ApplicationSet's Helm values: the image built here,
``pullPolicy: Never``) rewritten. Argo CD then syncs the charts in the ApplicationSets'
default, policy mode: the apiserver injects the GPU variables (MutatingAdmissionPolicy), no
webhook, no certificate, no cert-manager. The scheduler runs as a pod on the real node, so
the scheduler Application's Healthy is the real readiness of real pods; the check chart's
verification hook pod runs there too. Prints a timeline, the product's pods, the hook pods
and the check chart's placement.

``--webhook`` (``make gitops-demo GITOPS_ARGS=--webhook``): argocd/README.md's webhook mode
instead, the webhook running as pods too, its certificate issued by a real cert-manager (host
processes; the apiserver reaches cert-manager's webhook through its Service, routed by the
node's kube-proxy) whose cainjector fills the caBundle.

``HostComponents`` (the scheduler, the webhook and the hook pods' commands as host
processes) serves tests/integration/test_argocd_real.py, which runs on kwok nodes only.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from localcluster.cluster import REPO, Cluster, free_port
from localcluster.gitops import argocd_manifest, bare_repository, start_argocd, start_cert_manager
from localcluster.image import Image
from localcluster.image import build as build_image
from localcluster.node import NODE_NAME
from localcluster.procs import ManagedProcess
from localcluster.release import release_service_account
from localcluster.scheduler_host import run_scheduler
from localcluster.webhook_host import HOST, webhook_command

SYSTEM_NS, CHECK_NS = "gpu-scheduler-system", "gpu-scheduler-tests"
RELEASE = "gpu-scheduler"
APPS = ("gpu-scheduler-in-cluster", "gpu-scheduler-check-in-cluster")


def say(msg: str) -> None:
    print(f"==> {msg}", file=sys.stderr, flush=True)


def get(cluster: Cluster, *args: str) -> dict[str, Any]:
    res = cluster.kubectl("get", *args, "-o", "json", check=False)
    return yaml.safe_load(res.stdout) if res.returncode == 0 else {}


def apply_argocd(
    cluster: Cluster, repo_url: str, *files: str, image: str | None = None, webhook: bool = False
) -> None:
    for name in files:
        cluster.apply(argocd_manifest(name, repo_url, image=image, webhook=webhook))


HOOK_ANNOTATION = "argocd.argoproj.io/hook"
# What a kubelet keeps of a container's log as its termination message
# (terminationMessagePolicy: FallbackToLogsOnError): the last 80 lines, at most 2048 bytes.
FALLBACK_LINES, FALLBACK_BYTES = 80, 2048


@dataclass
class ContainerRun:
    """One container of a hook pod, run as a host process."""

    container: dict[str, Any]
    proc: subprocess.Popen[bytes]
    log: Path
    message_file: Path | None
    started: str
    finished: str = ""


@dataclass
class HookRun:
    """An Argo CD hook pod's containers, run on the host (kwok runs no containers) as a
    kubelet runs them: each init container to success, in order, then the container."""

    pod: dict[str, Any]
    runs: list[ContainerRun]  # started so far; the last one may be running
    pending: list[dict[str, Any]]  # not started yet

    @property
    def current(self) -> ContainerRun:
        return self.runs[-1]

    @property
    def log(self) -> Path:
        return self.current.log


@dataclass
class HostComponents:
    """The scheduler and the webhook as host processes, started once their identities exist;
    and every Argo CD hook pod's command, run on the host with the pod's ServiceAccount, its
    outcome written into the pod's status as a kubelet would. For a control plane whose
    nodes are all kwok nodes (tests/integration/test_argocd_real.py); the demo runs them
    for real on the real node."""

    cluster: Cluster
    procs: list[ManagedProcess] = field(default_factory=list)
    scheduler: ManagedProcess | None = None
    webhook: ManagedProcess | None = None
    notes: list[str] = field(default_factory=list)
    hooks: dict[str, HookRun] = field(default_factory=dict)
    hooks_done: dict[str, tuple[str, int, str]] = field(default_factory=dict)

    def stop(self) -> None:
        """Stop the host scheduler and webhook (their identities are about to go)."""
        for name, proc in (("gpu-scheduler", self.scheduler), ("gpu-scheduler-webhook", self.webhook)):
            if proc is not None:
                self.cluster.procs.pop(name, None)
                proc.stop()
        self.scheduler = self.webhook = None

    def run_hooks(self) -> None:
        c = self.cluster
        for uid, run in list(self.hooks.items()):
            if run.current.proc.poll() is None:
                continue
            run.current.finished = _now()
            if run.current.proc.returncode == 0 and run.pending:
                run.runs.append(self._spawn(run.pod, run.pending.pop(0)))
                continue
            del self.hooks[uid]
            self._finish(run)
        res = c.kubectl("get", "pods", "-A", "-o", "json", check=False)
        if res.returncode != 0:
            return
        for pod in json.loads(res.stdout).get("items", []):
            meta = pod["metadata"]
            uid = meta["uid"]
            if (
                HOOK_ANNOTATION not in (meta.get("annotations") or {})
                or uid in self.hooks
                or uid in self.hooks_done
                or pod.get("status", {}).get("phase") != "Running"
                or meta.get("deletionTimestamp")
            ):
                continue
            self.hooks[uid] = self._start(pod)

    def _start(self, pod: dict[str, Any]) -> HookRun:
        spec = pod["spec"]
        containers = [*(spec.get("initContainers") or []), *spec["containers"]]
        assert len(spec["containers"]) == 1, "hook pods have one container (after their init containers)"
        return HookRun(pod, [self._spawn(pod, containers[0])], containers[1:])

    def _spawn(self, pod: dict[str, Any], container: dict[str, Any]) -> ContainerRun:
        c = self.cluster
        meta, spec = pod["metadata"], pod["spec"]
        work = c.workdir / "hooks" / f"{meta['namespace']}-{meta['name']}-{meta['uid'][:8]}"
        if container is not spec["containers"][0]:  # an init container: a folder of its own
            work = work / container["name"]
        work.mkdir(parents=True, exist_ok=True)
        argv = [*container["command"], *(container.get("args") or [])]
        exe = Path(sys.executable).parent / argv[0]
        if exe.exists():
            argv[0] = str(exe)
        message_file = None
        path = container.get("terminationMessagePath", "/dev/termination-log")
        if path in argv:  # the file the kubelet creates: a file here
            message_file = work / "termination-log"
            message_file.write_text("")
            argv[argv.index(path)] = str(message_file)
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBECONFIG")}
        for e in container.get("env") or []:
            if "value" in e:
                env[e["name"]] = str(e["value"])
            elif (e.get("valueFrom") or {}).get("fieldRef"):
                field_path = e["valueFrom"]["fieldRef"]["fieldPath"]
                env[e["name"]] = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"]}[
                    field_path
                ]
        kubeconfig = work / "kubeconfig"
        if not kubeconfig.exists():
            c.service_account_kubeconfig(
                meta["namespace"], spec.get("serviceAccountName", "default"), path=kubeconfig
            )
        env["KUBECONFIG"] = str(kubeconfig)
        log = work / "output.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
        return ContainerRun(container, proc, log, message_file, _now())

    @staticmethod
    def _said(run: ContainerRun, states: dict[str, dict[str, Any]]) -> str:
        """What a container said: its termination message, else its last JSON log line's msg
        (wait-ready writes no termination message on success)."""
        message = str(states[run.container["name"]]["terminated"].get("message", ""))
        if message.strip():
            return message
        for line in reversed(run.log.read_text(errors="replace").splitlines()):
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    return str(json.loads(line).get("msg", ""))
        return ""

    @staticmethod
    def _terminated(run: ContainerRun) -> dict[str, Any]:
        container, code = run.container, run.proc.returncode
        message = run.message_file.read_text() if run.message_file else ""
        if not message and code != 0 and container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            tail = "\n".join(run.log.read_text(errors="replace").splitlines()[-FALLBACK_LINES:])
            message = tail.encode()[-FALLBACK_BYTES:].decode(errors="ignore")
        terminated = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": run.started,
            "finishedAt": run.finished or _now(),
        }
        if message:
            terminated["message"] = message
        return terminated

    def _finish(self, run: HookRun) -> None:
        meta, spec = run.pod["metadata"], run.pod["spec"]
        states: dict[str, dict[str, Any]] = {
            r.container["name"]: {"terminated": self._terminated(r)} for r in run.runs
        }
        waiting = {"waiting": {"reason": "PodInitializing"}}

        def statuses(containers: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [
                {
                    "name": ctr["name"],
                    "image": ctr.get("image", ""),
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "started": False,
                    "state": states.get(ctr["name"], waiting),
                }
                for ctr in containers
            ]

        last = run.current
        code = last.proc.returncode
        ran_all = not run.pending and last.container is spec["containers"][0]
        phase = "Succeeded" if code == 0 and ran_all else "Failed"
        status: dict[str, Any] = {
            "phase": phase,
            "conditions": [
                {"type": t, "status": "False", "reason": "PodCompleted", "lastTransitionTime": _now()}
                for t in ("Ready", "ContainersReady")
            ],
            "containerStatuses": statuses(spec["containers"]),
        }
        if spec.get("initContainers"):
            status["initContainerStatuses"] = statuses(spec["initContainers"])
        self.cluster.kubectl(
            "patch",
            "pod",
            meta["name"],
            "-n",
            meta["namespace"],
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": status}),
            check=False,
        )
        message = str(states[last.container["name"]]["terminated"].get("message", ""))
        self.hooks_done[meta["uid"]] = (f"{meta['namespace']}/{meta['name']}", code, message)
        ran = ", ".join(
            f"{r.container['name']} exit {r.proc.returncode}"
            + (f": {m.strip()[:200]}" if (m := self._said(r, states)).strip() else "")
            for r in run.runs
        )
        self.notes.append(
            f"Argo CD hook pod {meta['namespace']}/{meta['name']}: its containers ran on the host as "
            f"ServiceAccount {spec.get('serviceAccountName', 'default')}: {ran}"
        )

    def poll(self) -> None:
        self.run_hooks()
        c = self.cluster
        if self.scheduler is None:
            sas = get(c, "serviceaccount", "-n", SYSTEM_NS, "-l", f"app.kubernetes.io/instance={RELEASE}")
            roles = get(c, "roles", "-n", SYSTEM_NS, "-l", f"app.kubernetes.io/instance={RELEASE}")
            names = {
                s["metadata"]["labels"].get("app.kubernetes.io/component"): s["metadata"]["name"]
                for s in sas.get("items", [])
            }
            lease = next(
                (
                    r["resourceNames"][0]
                    for role in roles.get("items", [])
                    for r in role.get("rules") or []
                    if "leases" in r.get("resources", []) and r.get("resourceNames")
                ),
                None,
            )
            if "scheduler" in names and lease:
                kc = c.service_account_kubeconfig(SYSTEM_NS, names["scheduler"])
                self.scheduler = run_scheduler(
                    kc,
                    env={
                        "GPU_SCHEDULER_LEASE_NAME": lease,
                        "GPU_SCHEDULER_LEASE_NAMESPACE": SYSTEM_NS,
                        "POD_NAMESPACE": SYSTEM_NS,
                    },
                    log_path=c.workdir / "logs" / "gpu-scheduler.log",
                )
                c.adopt("gpu-scheduler", self.scheduler)
                self.notes.append(
                    f"scheduler: host process as ServiceAccount {SYSTEM_NS}/{names['scheduler']}"
                )
        if self.webhook is None:
            certs = get(c, "certificates.cert-manager.io", "-n", SYSTEM_NS)
            serving = [x for x in certs.get("items", []) if not x["spec"].get("isCA")]
            svc = get(c, "services", "-n", SYSTEM_NS, "-l", "app.kubernetes.io/component=webhook")
            if not serving or not svc.get("items"):
                return
            secret = get(c, "secret", serving[0]["spec"]["secretName"], "-n", SYSTEM_NS)
            if not secret.get("data", {}).get("tls.crt"):
                return
            try:
                sa = release_service_account(c, RELEASE, SYSTEM_NS, "webhook")
            except RuntimeError:
                return
            certdir = c.workdir / "webhook-certs"
            certdir.mkdir(exist_ok=True)
            for key in ("tls.crt", "tls.key", "ca.crt"):
                (certdir / key).write_bytes(base64.b64decode(secret["data"][key]))
            (certdir / "tls.key").chmod(0o600)
            port = free_port()
            kc = c.service_account_kubeconfig(SYSTEM_NS, sa)
            env = {
                **os.environ,
                "KUBECONFIG": str(kc),
                "WEBHOOK_TLS_CERT_FILE": str(certdir / "tls.crt"),
                "WEBHOOK_TLS_KEY_FILE": str(certdir / "tls.key"),
                "WEBHOOK_PORT": str(port),
            }
            proc = ManagedProcess(
                "gpu-scheduler-webhook",
                [webhook_command(), "--host", HOST, "--port", str(port), "--workers", "1"],
                env=env,
                log_path=c.workdir / "logs" / "gpu-scheduler-webhook.log",
            ).start()
            c.adopt("gpu-scheduler-webhook", proc)
            # cert-manager's certificate names the Service, not 127.0.0.1: skip the name check here only.
            proc.wait_http(f"https://{HOST}:{port}/readyz", timeout=60, insecure=True)
            name = svc["items"][0]["metadata"]["name"]
            c.register_service(SYSTEM_NS, name, 443, port)
            self.webhook = proc
            self.notes.append(
                f"webhook: host process as ServiceAccount {SYSTEM_NS}/{sa}, serving cert-manager's "
                f"certificate (Secret {serving[0]['spec']['secretName']}), Service {name} routed to it"
            )


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


def _now() -> str:
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
        for cond in cert.get("status", {}).get("conditions", []):
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


@dataclass
class Outcome:
    """What the demo saw once both Applications settled (or the time ran out)."""

    synced: bool  # both Applications Synced and Healthy, their sync operations Succeeded
    settled: bool  # the RollingSync over: both steps Healthy, no sync queued or running
    timeline: Timeline
    components: list[dict[str, Any]]
    hooks: list[dict[str, Any]]
    hook_results: list[dict[str, Any]]  # the check sync's hook entries, from Argo CD's syncResult
    placement: str
    placed: bool
    webhook: bool = False  # webhook mode (else policy mode: no webhook pods)

    @property
    def components_ok(self) -> bool:
        """The scheduler (and in webhook mode the webhook) each run as Ready pods on the real
        node, in containers."""
        expected = {"scheduler", "webhook"} if self.webhook else {"scheduler"}
        return {r["component"] for r in self.components} == expected and all(
            r["node"] == NODE_NAME and r["phase"] == "Running" and r["ready"] and r["runtime"] == "containerd"
            for r in self.components
        )

    @property
    def hooks_ok(self) -> bool:
        """Argo CD's check sync ran its Pod hook(s), each Succeeded, and each of those pods ran on
        the real node and exited 0."""
        pods = [h for h in self.hook_results if h.get("kind") == "Pod"]
        if not pods or any(h.get("hookPhase") != "Succeeded" for h in pods):
            return False
        for h in pods:
            ran = [s for s in self.hooks if s["pod"] == f"{h.get('namespace') or CHECK_NS}/{h['name']}"]
            if not ran or not all(s["node"] == NODE_NAME for s in ran) or ran[-1]["exit"] != 0:
                return False
        return True

    @property
    def ok(self) -> bool:
        return self.synced and self.settled and self.components_ok and self.hooks_ok and self.placed


COMPLETE_APPSET = "gpu-scheduler-complete"


def rollout_settled(cluster: Cluster) -> tuple[bool, dict[str, Any]]:
    """Whether the RollingSync is over: the ApplicationSet reports both Applications Healthy
    (it stops triggering syncs) and neither has a sync queued or running; with the check
    Application's last sync operation. While the ApplicationSet waits to see step 2 start it
    may trigger its sync again, so a Succeeded sync can be followed by another one."""
    appset = get(cluster, "applicationsets.argoproj.io", COMPLETE_APPSET, "-n", "argocd")
    steps = {
        s["application"]: s.get("status") for s in appset.get("status", {}).get("applicationStatus") or []
    }
    settled = set(steps) == set(APPS) and all(s == "Healthy" for s in steps.values())
    op: dict[str, Any] = {}
    for name in APPS:
        app = get(cluster, "applications.argoproj.io", name, "-n", "argocd")
        op = app.get("status", {}).get("operationState") or {}
        settled = settled and not app.get("operation") and op.get("phase") == "Succeeded"
    return settled, op


def sync_argocd(
    cluster: Cluster, image: Image, repo_url: str, timeout: float = 300, webhook: bool = False
) -> Outcome:
    """Apply argocd/ (repository URL and image rewritten; with ``webhook``, in webhook mode) to
    a control plane with a real node and Argo CD (and, with ``webhook``, cert-manager) running,
    and follow it until both Applications are Synced and Healthy, the scheduler's (and the
    webhook's) pods Ready on the real node and the RollingSync settled (no sync queued or
    running), or ``timeout``."""
    tl = Timeline()
    hooks = HookPods(cluster)
    op: dict[str, Any] = {}
    settled = False
    try:
        apply_argocd(
            cluster,
            repo_url,
            "gpu-scheduler-project.yaml",
            "local-cluster-secret.yaml",
            "gpu-scheduler-complete-applicationset.yaml",
            image=image.ref,
            webhook=webhook,
        )
        deadline = time.monotonic() + timeout
        synced = False
        components: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            synced = observe(cluster, tl, APPS)
            components = component_pods(cluster)
            observe_pods(tl, components, hooks.seen())
            if synced and components and all(r["ready"] for r in components):
                settled, op = rollout_settled(cluster)
                if settled:
                    break
            time.sleep(0.5)
        # A pod's last events (its exit, its deletion) arrive within a moment of Argo CD's record.
        time.sleep(1)
        observe_pods(tl, components, hooks.seen())
    finally:
        hooks.stop()
    results = [r for r in (op.get("syncResult") or {}).get("resources") or [] if r.get("hookType")]
    placement, placed = placement_table(cluster)
    return Outcome(synced, settled, tl, components, hooks.seen(), results, placement, placed, webhook)


def report(outcome: Outcome) -> None:
    print("\nTimeline (seconds after argocd/ was applied):")
    print(outcome.timeline.text())
    print(f"\nThe scheduler chart's pods (Argo CD synced them; they run on the real node {NODE_NAME}):")
    print(
        rows_text(
            ("COMPONENT", "POD", "NODE", "PHASE", "READY", "RUNTIME", "RESTARTS", "IMAGE"),
            [
                (
                    r["component"],
                    r["pod"],
                    r["node"],
                    r["phase"],
                    "yes" if r["ready"] else "no",
                    r["runtime"],
                    str(r["restarts"]),
                    r["image"],
                )
                for r in outcome.components
            ],
        )
    )
    print("\nArgo CD hook pods (a successful hook's pod is deleted by Argo CD; seen by a watch):")
    print(
        rows_text(
            ("POD", "HOOK", "NODE", "PHASE", "EXIT"),
            [
                (h["pod"], h["hook"], h["node"], h["phase"], "-" if h["exit"] is None else str(h["exit"]))
                for h in outcome.hooks
            ],
        )
    )
    print("\nPlacement of the check chart's StatefulSet (gpu-scheduler-tests):")
    print(outcome.placement)


def run(workdir: Path | None = None, timeout: float = 300, webhook: bool = False) -> int:
    workdir = workdir or Path(tempfile.mkdtemp(prefix="gpu-scheduler-gitops-"))
    started = time.monotonic()
    say("building the image from the Dockerfile (make image: mmdebstrap base + buildah, no Docker)")
    image = build_image()
    say(
        "starting the local control plane (etcd, kube-apiserver, controller-manager, kube-scheduler, "
        "kwok GPU nodes) and a real kubelet node (containerd, runc, CNI bridge, kube-proxy)"
    )
    cluster = Cluster.start(workdir, gpu_nodes=3, gpus_per_node=4, real_node=True, images=[image.archive])
    try:
        if webhook:
            say("webhook mode: starting cert-manager (controller, cainjector, webhook) as host processes")
            start_cert_manager(cluster)
        else:
            say(
                "policy mode (argocd/'s default): no cert-manager; the apiserver will inject the GPU "
                "variables (MutatingAdmissionPolicy)"
            )
        say(
            "starting Argo CD (miniredis, repo-server, application-controller, applicationset-controller "
            "with --enable-progressive-syncs) as host processes"
        )
        start_argocd(cluster)
        repo_url = bare_repository(workdir / "git" / "gpu-scheduler.git", REPO)
        say(f"this checkout committed into {repo_url} (branch main)")
        say(
            f"applying argocd/ with gpu-scheduler.io/repo-url={repo_url} and image {image.ref} "
            "(pullPolicy Never) in the ApplicationSets' Helm values"
            + (", and webhook mode (argocd/README.md)" if webhook else "; nothing else changed")
        )
        outcome = sync_argocd(cluster, image, repo_url, timeout, webhook=webhook)
        report(outcome)
        print(f"\ngitops-demo took {time.monotonic() - started:.0f}s")
        if not outcome.ok:
            say(
                "NOT done: "
                + "; ".join(
                    what
                    for what, good in (
                        ("Applications not Synced+Healthy or their syncs not Succeeded", outcome.synced),
                        ("the RollingSync did not settle (a sync still queued or running)", outcome.settled),
                        (
                            f"scheduler{'/webhook' if webhook else ''} not Ready pods on {NODE_NAME}",
                            outcome.components_ok,
                        ),
                        (f"the verification hook did not Succeed on {NODE_NAME}", outcome.hooks_ok),
                        ("placement wrong", outcome.placed),
                    )
                    if not good
                )
                + f"; logs in {workdir / 'logs'}"
            )
            with contextlib.suppress(Exception):
                print(cluster.kubectl("get", "applications.argoproj.io", "-n", "argocd", "-o", "wide").stdout)
                print(cluster.kubectl("get", "pods", "-A", "-o", "wide").stdout)
                print(
                    cluster.kubectl(
                        "logs",
                        "-n",
                        SYSTEM_NS,
                        "-l",
                        f"app.kubernetes.io/instance={RELEASE}",
                        "--tail=30",
                        "--all-containers",
                        "--prefix",
                        check=False,
                    ).stdout
                )
            return 1
        say(
            "both Applications Synced and Healthy, in order; the scheduler"
            + (" and the webhook" if webhook else "")
            + f" Ready as pods on {NODE_NAME}; the verification hook Succeeded there; every replica on its "
            "mapped node with its GPUs" + ("" if webhook else "; no certificate anywhere (policy mode)")
        )
        return 0
    finally:
        cluster.stop()
        with contextlib.suppress(OSError):
            shutil.rmtree(workdir)


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m localcluster.gitops_demo", description=__doc__)
    parser.add_argument(
        "--webhook", action="store_true", help="argocd/README.md's webhook mode, with cert-manager"
    )
    args = parser.parse_args(argv)
    sys.exit(run(webhook=args.webhook))


if __name__ == "__main__":
    main()
