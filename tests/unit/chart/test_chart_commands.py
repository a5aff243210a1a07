"""Every container the charts start runs from the installed package: command, args and env from ``helm template``.

Both charts are rendered with their defaults and every ci/ scenario; each distinct
container (Deployments, StatefulSets, Jobs, helm test and Argo CD hook Pods) is
started as a host process from the venv the image gets (``image_venv``: the Dockerfile's
build stage run here, the hashed lock then the wheel, in a fresh venv that borrows nothing
from the tests'; tests/support/wheelvenv.py), with the command, args and literal env the manifest
gives and the downward-API values a pod would get. Nothing is copied from the
templates: a wrong entry point, subcommand, flag or setting in a template fails
here, not in a user's cluster.

What counts as "started" (a smoke run: until the process's first line on stderr, at most
FIRST_LINE_SECONDS, then SMOKE_SECONDS more):

* the process is still running SMOKE_SECONDS after its first line (a server, a probe
  retrying), or it exited with a status other than 2 (the programs' usage / bad-setting status);
* every line it wrote on stderr is a JSON log object: argparse's ``usage:`` text, a
  traceback or a shell's "not found" is not.

Outside a pod some things are necessarily missing, and the programs meet them
*after* parsing their command line and settings: no in-cluster API (``KUBECONFIG``
names a loopback address that refuses connections), no mounted TLS Secret, no
cluster DNS for the probes. Listening ports (an env value equal to one of the
container's ``containerPort``) are moved to free loopback ports so that nothing on
this machine is disturbed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from localcluster.cluster import free_port
from tests.support.charts import CHARTS, ci_values, render
from tests.support.fakenvml import nvml_env
from tests.support.wheelvenv import WheelVenv

SMOKE_SECONDS = 4.0
# A program's imports can take seconds on a loaded machine (six start at once here, beside the
# suite's other workers): the clock of SMOKE_SECONDS starts at its first line, not at its start.
# Stopped at SMOKE_SECONDS from the start, CI saw wait-ready and verify-release still silent.
FIRST_LINE_SECONDS = 60.0
RELEASE, NAMESPACE = "rel", "gpu-ns"


@dataclass(frozen=True)
class Container:
    where: str  # chart, scenario, kind/name, container
    command: tuple[str, ...]
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    ports: tuple[int, ...]

    def key(self) -> tuple[Any, ...]:
        return (self.command, self.args, self.env, self.ports)


def pod_specs(doc: Mapping[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(pod metadata, pod spec) of any workload kind: Pod, Deployment, StatefulSet, Job, CronJob..."""
    spec = doc.get("spec") or {}
    if doc.get("kind") == "Pod":
        return [(dict(doc.get("metadata") or {}), dict(spec))]
    template = (spec.get("jobTemplate", {}).get("spec") or spec).get("template")
    if not template:
        return []
    return [(dict(template.get("metadata") or {}), dict(template.get("spec") or {}))]


def field_value(path: str, workload: str, meta: Mapping[str, Any]) -> str:
    """A downward-API fieldRef as the kubelet would resolve it for the first replica on node1."""
    if path == "metadata.name":
        return f"{workload}-0"
    if path == "metadata.namespace":
        return NAMESPACE
    if path == "spec.nodeName":
        return "node1"
    for prefix, source in (
        ("metadata.labels", meta.get("labels")),
        ("metadata.annotations", meta.get("annotations")),
    ):
        if path.startswith(prefix + "['"):
            key = path[len(prefix) + 2 : -2]
            if key == "apps.kubernetes.io/pod-index":
                return "0"
            return str((source or {}).get(key, ""))
    if path in ("status.podIP", "status.hostIP"):
        return "127.0.0.1"
    pytest.fail(f"no stand-in for the downward-API field {path!r}: add one here")


def containers() -> list[Container]:
    found: dict[tuple[Any, ...], Container] = {}
    for chart in CHARTS:
        for values in [None, *ci_values(chart)]:
            docs = render(chart, [values] if values else [], release=RELEASE, namespace=NAMESPACE)
            for doc in docs:
                for meta, spec in pod_specs(doc):
                    for c in [*spec.get("initContainers", []), *spec.get("containers", [])]:
                        if str(c.get("image", "")).startswith("registry.k8s.io/"):
                            # The extender scenario's kube-scheduler: the upstream image, not our
                            # wheel; tests/integration/test_extender.py runs that binary with the
                            # chart's rendered configuration.
                            continue
                        env: dict[str, str] = {}
                        for e in c.get("env") or []:
                            if "value" in e:
                                env[e["name"]] = str(e["value"])
                            elif "fieldRef" in (e.get("valueFrom") or {}):
                                path = e["valueFrom"]["fieldRef"]["fieldPath"]
                                env[e["name"]] = field_value(path, doc["metadata"]["name"], meta)
                            else:
                                pytest.fail(
                                    f"{chart.name}: env {e['name']}: no stand-in for {e['valueFrom']}"
                                )
                        assert c.get("command"), (
                            f"{chart.name} {doc['kind']}: container {c['name']} has no command"
                        )
                        item = Container(
                            where=f"{chart.name} {values.name if values else 'defaults'} "
                            f"{doc['kind']}/{doc['metadata']['name']} {c['name']}",
                            command=tuple(c["command"]),
                            args=tuple(c.get("args") or ()),
                            env=tuple(sorted(env.items())),
                            ports=tuple(p["containerPort"] for p in c.get("ports") or []),
                        )
                        found.setdefault(item.key(), item)
    return list(found.values())


def refused_kubeconfig(path: Path) -> Path:
    """A kubeconfig whose server refuses connections: the programs load it, then cannot reach it."""
    port = free_port()  # nothing listens there once the probe socket is closed
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "none", "cluster": {"server": f"https://127.0.0.1:{port}"}}],
                "users": [{"name": "none", "user": {"token": "smoke"}}],
                "contexts": [{"name": "none", "context": {"cluster": "none", "user": "none"}}],
                "current-context": "none",
            }
        )
    )
    return path


@dataclass
class Outcome:
    container: Container
    argv: list[str]
    running: bool
    code: int | None
    stderr: str

    def problems(self) -> list[str]:
        out = []
        if not self.running and self.code == 2:
            out.append("exit status 2 (usage or settings error)")
        bad = [line for line in self.stderr.splitlines() if line.strip() and not _is_json(line)]
        if bad:
            out.append(f"non-JSON output: {bad[:5]}")
        return out


def _is_json(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def smoke(venv: WheelVenv, c: Container, work: Path, extra_env: Mapping[str, str]) -> Outcome:
    env = dict(c.env)
    for name, value in env.items():
        if value.isdigit() and int(value) in c.ports:
            env[name] = str(free_port())
    work.mkdir(parents=True, exist_ok=True)
    full = {
        "PATH": f"{venv.bin}:/usr/bin:/bin",  # the image's PATH starts with its venv's bin
        "HOME": str(work),
        "LANG": "C.UTF-8",
        "KUBECONFIG": str(refused_kubeconfig(work / "kubeconfig")),
        "TMPDIR": str(work),
        **extra_env,
        **env,
    }
    exe = venv.bin / c.command[0]
    argv = [str(exe) if exe.exists() else c.command[0], *c.command[1:], *c.args]
    try:
        proc = subprocess.Popen(
            argv, env=full, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
    except FileNotFoundError as err:
        return Outcome(c, argv, False, 127, f"{err}")
    lines: list[str] = []
    first = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            first.set()
        first.set()  # end of output: it exited

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    first.wait(FIRST_LINE_SECONDS)
    try:
        proc.wait(timeout=SMOKE_SECONDS)
        running = False
    except subprocess.TimeoutExpired:
        running = True
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    reader.join(timeout=15)
    return Outcome(c, argv, running, proc.returncode, "".join(lines))


def smoke_all(
    venv: WheelVenv, items: list[Container], tmp_path: Path, extra_env: Mapping[str, str]
) -> list[Outcome]:
    with ThreadPoolExecutor(max_workers=max(2, min(6, os.cpu_count() or 2))) as pool:
        return list(
            pool.map(lambda ic: smoke(venv, ic[1], tmp_path / f"c{ic[0]}", extra_env), enumerate(items))
        )


def test_every_chart_container_starts_from_the_image_venv(
    image_venv: WheelVenv, fake_nvml: Path, tmp_path: Path
) -> None:
    items = containers()
    commands = {c.command[0] for c in items}
    assert commands == {"gpu-scheduler", "gpu-scheduler-webhook", "gpu-scheduler-check"}, commands
    # The check pods' NVML: the fake library with 4 GPUs (the defaults map GPUs 0-2).
    outcomes = smoke_all(image_venv, items, tmp_path, nvml_env(fake_nvml, gpus=4))
    failed = {o.container.where: (o.argv, o.code, o.problems()) for o in outcomes if o.problems()}
    assert not failed, json.dumps(failed, indent=1)
    # Every program at least logged (so it ran its own code, not just an import).
    silent = [o.container.where for o in outcomes if not o.stderr.strip()]
    assert not silent, silent


def test_a_wrong_entry_point_or_flag_fails(image_venv: WheelVenv, tmp_path: Path) -> None:
    """The smoke run tells a template mistake from a container that starts."""
    good = next(c for c in containers() if c.args[:1] == ("verify-release",))
    wrong = [
        Container("misspelled command", ("gpu-scheduler-chek",), good.args, good.env, ()),
        Container("unknown flag", good.command, (*good.args, "--no-such-flag"), good.env, ()),
        Container("unknown subcommand", good.command, ("verify",), good.env, ()),
        Container("bad setting", ("gpu-scheduler",), (), (("GPU_SCHEDULER_WORKERS", "many"),), ()),
    ]
    outcomes = smoke_all(image_venv, [good, *wrong], tmp_path, {})
    assert outcomes[0].problems() == [], outcomes[0]
    for o in outcomes[1:]:
        assert o.problems(), (o.container.where, o.code, o.stderr)
