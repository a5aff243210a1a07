"""Helm chart helpers that need no cluster: render charts, pick documents, read hook commands.

Shared by the unit tests (rendering, schemas, lint) and the integration tests
(installs); tests/integration/fixtures_chart.py adds the cluster fixtures.
"""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster.clients import load_manifests

REPO = Path(__file__).resolve().parents[2]
SCHEDULER_CHART = REPO / "gpu-scheduler-chart"
CHECK_CHART = REPO / "gpu-scheduler-check-chart"
CHARTS = (SCHEDULER_CHART, CHECK_CHART)
# The oldest (Chart.yaml kubeVersion) and the newest Kubernetes the charts are checked against.
KUBE_VERSIONS = ("1.31.0", "1.37.0")
HOOK_ANNOTATION = "helm.sh/hook"


def helm_bin() -> str:
    """The pinned helm built by tools/provision.sh (`make test` and `make test-unit` build it)."""
    from localcluster.toolcache import tool

    try:
        return str(tool("helm"))
    except FileNotFoundError as exc:
        pytest.fail(f"{exc}: run `make tools` (make test does it)")


def ci_values(chart: Path) -> list[Path]:
    return sorted((chart / "ci").glob("*-values.yaml"))


def template(
    chart: Path,
    values_files: Sequence[Path] = (),
    values: Mapping[str, Any] | None = None,
    *,
    release: str = "rel",
    namespace: str = "gpu-ns",
    kube_version: str = KUBE_VERSIONS[-1],
    set_args: Sequence[str] = (),
    extra: Sequence[str] = (),
    tmp_dir: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """``helm template`` (never raises; see ``render``).

    Its result is remembered for the run, keyed by the arguments and the contents of the chart
    and of every values file: the chart tests render the same chart with the same values many
    times over (a helm process each, about 0.3 s of CPU)."""
    args = [
        helm_bin(),
        "template",
        release,
        str(chart),
        "--namespace",
        namespace,
        "--kube-version",
        kube_version,
    ]
    for f in values_files:
        args += ["--values", str(f)]
    tmp: Path | None = None
    if values:
        import tempfile

        fd, name = tempfile.mkstemp(suffix=".yaml", dir=tmp_dir)
        tmp = Path(name)
        with open(fd, "w") as fh:
            yaml.safe_dump(dict(values), fh)
        args += ["--values", str(tmp)]
    for s in set_args:
        args += ["--set", s]
    args += list(extra)
    try:
        key = _render_key(chart, values_files, values, args, tmp)
        if key not in _RENDERED:
            _RENDERED[key] = subprocess.run(args, check=False, capture_output=True, text=True, timeout=120)
        return _RENDERED[key]
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)


_RENDERED: dict[str, subprocess.CompletedProcess[str]] = {}


def _render_key(
    chart: Path,
    values_files: Sequence[Path],
    values: Mapping[str, Any] | None,
    args: list[str],
    tmp: Path | None,
) -> str:
    """What a rendering depends on: helm's arguments (the temporary values file's name left out),
    the values given, and the bytes of every file of the chart and every values file."""
    h = hashlib.sha256()
    for a in args:
        h.update((b"<values>" if tmp is not None and a == str(tmp) else a.encode()) + b"\0")
    h.update(yaml.safe_dump(dict(values or {}), sort_keys=True).encode() + b"\0")
    files = sorted(f for f in chart.rglob("*") if f.is_file()) if chart.is_dir() else [chart]
    for f in [*files, *values_files]:
        h.update(str(f).encode() + b"\0" + (f.read_bytes() if f.is_file() else b"<missing>") + b"\0")
    return h.hexdigest()


def render(
    chart: Path,
    values_files: Sequence[Path] = (),
    values: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> list[dict[str, Any]]:
    """The manifests ``helm template`` renders (hooks included), failing the test with
    helm's message when it cannot render."""
    res = template(chart, values_files, values, **kwargs)
    if res.returncode != 0:
        pytest.fail(f"helm template {chart.name} failed:\n{res.stderr}")
    return load_manifests(res.stdout)


def is_hook(doc: Mapping[str, Any]) -> bool:
    return HOOK_ANNOTATION in ((doc.get("metadata") or {}).get("annotations") or {})


def find(docs: Iterable[Mapping[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [
        dict(d)
        for d in docs
        if d.get("kind") == kind and (name is None or d.get("metadata", {}).get("name") == name)
    ]


def one(docs: Iterable[Mapping[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = find(docs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def pod_spec(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The pod spec of a Pod, Deployment or StatefulSet."""
    if doc["kind"] == "Pod":
        return dict(doc["spec"])
    return dict(doc["spec"]["template"]["spec"])


# ---------------------------------------------------------------- helm test hooks
@dataclass(frozen=True)
class HookCommand:
    """One container of a ``helm test`` hook pod."""

    pod: str
    container: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    weight: int = 0

    def replace(self, old: str, new: str) -> list[str]:
        """argv with ``old`` replaced by ``new`` in every argument (e.g. an in-cluster
        Service URL by the host process's http://127.0.0.1:PORT)."""
        return [a.replace(old, new) for a in self.argv]


def hook_commands_from_manifest(text: str, hook: str = "test") -> list[HookCommand]:
    """The containers of the hook Pods (``helm.sh/hook`` containing ``hook``) in a
    multi-document manifest, ordered by ``helm.sh/hook-weight`` then name."""
    out: list[HookCommand] = []
    for doc in load_manifests(text):
        if not doc or doc.get("kind") != "Pod":
            continue
        annotations = doc.get("metadata", {}).get("annotations") or {}
        hooks = [h.strip() for h in str(annotations.get(HOOK_ANNOTATION, "")).split(",")]
        if hook not in hooks:
            continue
        weight = int(annotations.get("helm.sh/hook-weight", 0))
        for c in doc["spec"].get("containers", []):
            env = {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
            out.append(
                HookCommand(
                    pod=doc["metadata"]["name"],
                    container=c["name"],
                    argv=[*c.get("command", []), *c.get("args", [])],
                    env=env,
                    weight=weight,
                )
            )
    return sorted(out, key=lambda h: (h.weight, h.pod, h.container))
