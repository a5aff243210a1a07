"""The product and Argo CD's hook pods as host processes, for a control plane whose nodes are
all kwok nodes (kwok runs no containers): tests/integration/test_argocd_real.py. The scheduler
and the webhook start once the chart has made their identities; every hook pod's command runs
on the host with the pod's ServiceAccount, and its outcome is written into the pod's status
as a kubelet would. ``make gitops-demo`` runs them for real, on the real node."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localcluster.cluster import Cluster, free_port
from localcluster.gitops_timeline import HOOK_ANNOTATION, RELEASE, SYSTEM_NS, get, now_rfc3339
from localcluster.procs import ManagedProcess
from localcluster.release import release_service_account
from localcluster.scheduler_host import run_scheduler
from localcluster.webhook_host import HOST, webhook_command

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
            run.current.finished = now_rfc3339()
            if run.current.proc.returncode == 0 and run.pending:
                run.runs.append(self._spawn(run.pod, run.pending.pop(0)))
                continue
            del self.hooks[uid]
            self._finish(run)
        try:
            pods = c.get_json("pods", "-A").get("items", [])
        except Exception:  # the apiserver not answering this once: the next poll reads again
            return
        for pod in pods:
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
        return ContainerRun(container, proc, log, message_file, now_rfc3339())

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
            "finishedAt": run.finished or now_rfc3339(),
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
                {"type": t, "status": "False", "reason": "PodCompleted", "lastTransitionTime": now_rfc3339()}
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
