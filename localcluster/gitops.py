"""Real cert-manager and Argo CD on the local control plane, as host processes.

Opt-in (they cost a few seconds and ~300 MB): a control plane started with
``service_network=True`` (webhook Services reachable, see localcluster.svcproxy), then::

    start_cert_manager(cluster)   # controller, cainjector, webhook; CRDs and webhook
                                  # configurations rendered from cert-manager's own chart
    argocd = start_argocd(cluster)  # redis (miniredis), repo-server, application-controller,
                                    # applicationset-controller --enable-progressive-syncs
    repo = bare_repository(cluster.workdir / "git", REPO)   # this checkout, committed

Every process is adopted by the cluster, so ``cluster.stop()`` stops them with the rest.
The binaries and upstream files come from the cache tools/provision.sh fills
(``argocd``, ``cert-manager`` targets).
"""

from __future__ import annotations

import base64
import os
import secrets
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from localcluster.clients import load_manifests
from localcluster.cluster import REPO, Cluster, free_port, tool
from localcluster.procs import ManagedProcess
from localcluster.release import REAL_NODE_PLACEMENT

ARGOCD_NS = "argocd"
CERT_MANAGER_NS = "cert-manager"
CM_WEBHOOK_SERVICE = "cert-manager-webhook"


def _spawn(
    cluster: Cluster, name: str, argv: list[str | os.PathLike[str]], env: dict[str, str]
) -> ManagedProcess:
    proc = ManagedProcess(name, argv, env=env, log_path=cluster.workdir / "logs" / f"{name}.log").start()
    cluster.adopt(name, proc)
    return proc


def _base_env(cluster: Cluster) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "ARGOCD_"))}
    env["KUBECONFIG"] = str(cluster.kubeconfig)
    return env


# ---------------------------------------------------------------- cert-manager
def cert_manager_manifests(cluster: Cluster) -> list[dict[str, Any]]:
    """What the API needs of cert-manager, rendered from the chart in the pinned module:
    its CRDs, its webhook configurations and its webhook's Service (no workloads, no RBAC:
    the components run as host processes with the admin kubeconfig)."""
    chart = tool("cert-manager-controller").parent.parent / "chart"
    out = cluster.helm(
        "template",
        "cert-manager",
        str(chart),
        "--namespace",
        CERT_MANAGER_NS,
        "--set",
        "crds.enabled=true",
    ).stdout
    keep = {"CustomResourceDefinition", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
    docs = load_manifests(out)
    # The webhook's Service too: the apiserver looks it up before it dials NAME.NS.svc.
    return [
        d
        for d in docs
        if d.get("kind") in keep
        or (d.get("kind") == "Service" and d["metadata"]["name"] == CM_WEBHOOK_SERVICE)
    ]


def start_cert_manager(cluster: Cluster, timeout: float = 120) -> None:
    """Start cert-manager's controller, cainjector and webhook; return when the webhook's
    CA is injected into its own webhook configurations (cert-manager fully working)."""
    cluster.kubectl("create", "namespace", CERT_MANAGER_NS)
    docs = cert_manager_manifests(cluster)
    cluster.apply(docs)
    env = _base_env(cluster)
    port, healthz = free_port(), free_port()
    svc_port = next(d for d in docs if d["kind"] == "Service")["spec"]["ports"][0]["port"]
    cluster.register_service(CERT_MANAGER_NS, CM_WEBHOOK_SERVICE, svc_port, port)
    _spawn(
        cluster,
        "cert-manager-webhook",
        [
            tool("cert-manager-webhook"),
            f"--kubeconfig={cluster.kubeconfig}",
            f"--secure-port={port}",
            f"--healthz-port={healthz}",
            f"--namespace={CERT_MANAGER_NS}",
        ],
        env,
    ).wait_http(f"http://127.0.0.1:{healthz}/healthz", timeout=timeout)
    _spawn(
        cluster,
        "cert-manager-cainjector",
        [tool("cert-manager-cainjector"), f"--kubeconfig={cluster.kubeconfig}"],
        env,
    )
    _spawn(
        cluster,
        "cert-manager-controller",
        [
            tool("cert-manager-controller"),
            f"--kubeconfig={cluster.kubeconfig}",
            f"--cluster-resource-namespace={CERT_MANAGER_NS}",
        ],
        env,
    )
    names = [d["metadata"]["name"] for d in docs if d["kind"] == "ValidatingWebhookConfiguration"]

    def injected() -> bool:
        for name in names:
            res = cluster.kubectl(
                "get",
                "validatingwebhookconfiguration",
                name,
                "-o",
                "jsonpath={.webhooks[*].clientConfig.caBundle}",
                check=False,
            )
            if res.returncode != 0 or not res.stdout.strip():
                return False
        return True

    cluster.wait_until(injected, timeout, "cainjector to fill cert-manager's webhook caBundle", interval=0.5)


# ---------------------------------------------------------------- Argo CD
@dataclass
class ArgoCD:
    repo_server: str
    redis: str
    namespace: str = ARGOCD_NS


def _argocd_dir() -> Path:
    return tool("argocd").parent.parent


def start_argocd(cluster: Cluster, timeout: float = 120, reconciliation: str = "20s") -> ArgoCD:
    """Install Argo CD's CRDs and config (argocd-cm, argocd-secret, ... from the pinned
    module's manifests/base/config) and start redis (miniredis), the repo-server, the
    application-controller and the applicationset-controller (Progressive Syncs on)."""
    home = _argocd_dir()
    cluster.kubectl("create", "namespace", ARGOCD_NS)
    cluster.kubectl("apply", "--server-side", "-f", str(home / "crds"))
    for crd in ("applications.argoproj.io", "applicationsets.argoproj.io", "appprojects.argoproj.io"):
        cluster.wait_until(
            lambda crd=crd: (
                cluster.kubectl(
                    "get",
                    "crd",
                    crd,
                    "-o",
                    "jsonpath={.status.conditions[?(@.type=='Established')].status}",
                    check=False,
                ).stdout.strip()
                == "True"
            ),
            timeout,
            f"CRD {crd} Established",
        )
    configs = []
    for f in sorted((home / "config").glob("argocd-*.yaml")):
        doc = yaml.safe_load(f.read_text())
        doc["metadata"]["namespace"] = ARGOCD_NS
        if doc["metadata"]["name"] == "argocd-secret":
            doc.setdefault("data", {})["server.secretkey"] = base64.b64encode(
                secrets.token_bytes(32)
            ).decode()
        if doc["metadata"]["name"] == "argocd-cm":
            doc["data"] = {**(doc.get("data") or {}), "timeout.reconciliation": reconciliation}
        configs.append(doc)
    cluster.apply(configs)

    work = cluster.workdir / "argocd"
    (work / "tmp").mkdir(parents=True, exist_ok=True)
    (work / "home").mkdir(parents=True, exist_ok=True)
    env = _base_env(cluster)
    env.update(
        {
            "ARGOCD_FAKE_IN_CLUSTER": "true",
            "ARGOCD_GPG_ENABLED": "false",
            "HOME": str(work / "home"),
            "TMPDIR": str(work / "tmp"),
            # helm (charts) and hack/git-verify-wrapper.sh (next to argocd) for the repo-server.
            "PATH": os.pathsep.join(
                [str(tool("argocd").parent), str(tool("helm").parent), env.get("PATH", "")]
            ),
            "ARGOCD_APPLICATIONSET_CONTROLLER_ENABLE_PROGRESSIVE_SYNCS": "true",
        }
    )
    redis = f"127.0.0.1:{free_port()}"
    _spawn(cluster, "argocd-redis", [tool("miniredis"), f"--addr={redis}"], env)
    cluster.wait_until(lambda: _open(redis), timeout, "miniredis")
    repo_port = free_port()
    repo_metrics = free_port()
    _spawn(
        cluster,
        "argocd-repo-server",
        [
            tool("argocd"),
            "--address=127.0.0.1",
            f"--port={repo_port}",
            "--metrics-address=127.0.0.1",
            f"--metrics-port={repo_metrics}",
            f"--redis={redis}",
            "--disable-tls",
            "--client-ca-path=",
            "--loglevel=info",
        ],
        {**env, "ARGOCD_BINARY_NAME": "argocd-repo-server"},
    ).wait_http(f"http://127.0.0.1:{repo_metrics}/metrics", timeout=timeout)
    repo_server = f"127.0.0.1:{repo_port}"
    ctrl_metrics = free_port()
    _spawn(
        cluster,
        "argocd-application-controller",
        [
            tool("argocd"),
            f"--kubeconfig={cluster.kubeconfig}",
            f"--namespace={ARGOCD_NS}",
            f"--repo-server={repo_server}",
            "--repo-server-plaintext",
            f"--redis={redis}",
            f"--metrics-port={ctrl_metrics}",
            "--status-processors=4",
            "--operation-processors=4",
            "--self-heal-timeout-seconds=2",
            "--loglevel=info",
        ],
        {**env, "ARGOCD_BINARY_NAME": "argocd-application-controller"},
    ).wait_http(f"http://127.0.0.1:{ctrl_metrics}/metrics", timeout=timeout)
    probe = free_port()
    _spawn(
        cluster,
        "argocd-applicationset-controller",
        [
            tool("argocd"),
            f"--kubeconfig={cluster.kubeconfig}",
            f"--namespace={ARGOCD_NS}",
            f"--argocd-repo-server={repo_server}",
            "--repo-server-plaintext",
            f"--metrics-addr=127.0.0.1:{free_port()}",
            f"--probe-addr=127.0.0.1:{probe}",
            f"--webhook-addr=127.0.0.1:{free_port()}",
            "--enable-leader-election=false",
            "--enable-progressive-syncs",
            "--loglevel=info",
        ],
        {**env, "ARGOCD_BINARY_NAME": "argocd-applicationset-controller", "NAMESPACE": ARGOCD_NS},
    )
    # Its probe server registers no checks (404 on /healthz): wait for the port.
    cluster.wait_until(lambda: _open(f"127.0.0.1:{probe}"), timeout, "the applicationset-controller")
    return ArgoCD(repo_server=repo_server, redis=redis)


def _open(addr: str) -> bool:
    import socket

    host, _, port = addr.rpartition(":")
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, int(port))) == 0


# ---------------------------------------------------------------- Git
def bare_repository(dest: Path, source: Path = REPO, branch: str = "main") -> str:
    """Commit ``source``'s working tree (tracked and untracked, not ignored files) on
    ``branch`` of a new bare repository at ``dest``; return its ``file://`` URL."""
    dest = Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    work = dest.with_name(dest.name + "-work")
    if work.exists():
        shutil.rmtree(work)
    files = subprocess.run(
        ["git", "-C", str(source), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for rel in filter(None, files):
        src = source / rel.decode()
        if src.is_file():
            target = work / rel.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    git = [
        "git",
        "-c",
        "user.name=gitops-demo",
        "-c",
        "user.email=gitops-demo@localhost",
        "-c",
        "commit.gpgsign=false",
    ]
    subprocess.run([*git, "init", "-q", "-b", branch, str(work)], check=True)
    subprocess.run([*git, "-C", str(work), "add", "-A"], check=True)
    subprocess.run([*git, "-C", str(work), "commit", "-q", "-m", "local checkout"], check=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(dest)], check=True)
    shutil.rmtree(work)
    return f"file://{dest}"


def commit_changes(repo_url: str, changes: Mapping[str, str], message: str, branch: str = "main") -> str:
    """Commit ``changes`` (path relative to the repository root -> new text) as ONE commit on
    ``branch`` of the bare repository at ``repo_url``, push it; return the commit's SHA."""
    bare = Path(repo_url.removeprefix("file://"))
    work = bare.with_name(bare.name + "-edit")
    if work.exists():
        shutil.rmtree(work)
    git = [
        "git",
        "-c",
        "user.name=gitops-test",
        "-c",
        "user.email=gitops-test@localhost",
        "-c",
        "commit.gpgsign=false",
    ]
    subprocess.run(["git", "clone", "-q", "-b", branch, str(bare), str(work)], check=True)
    for rel, text in changes.items():
        (work / rel).write_text(text)
    subprocess.run([*git, "-C", str(work), "commit", "-q", "-am", message], check=True)
    sha = subprocess.run(
        ["git", "-C", str(work), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    subprocess.run(["git", "-C", str(work), "push", "-q", "origin", branch], check=True)
    shutil.rmtree(work)
    return sha


def commit_change(repo_url: str, rel: str, text: str, message: str, branch: str = "main") -> str:
    """Commit one file change on ``branch`` of the bare repository at ``repo_url``; its SHA."""
    return commit_changes(repo_url, {rel: text}, message, branch)


# ---------------------------------------------------------------- argocd/ manifests
ARGOCD_DIR = REPO / "argocd"
REPO_URL_ANNOTATION = "gpu-scheduler.io/repo-url"


# What argocd/README.md ("Webhook mode") tells users to put in the scheduler chart's values
# on a cluster without MutatingAdmissionPolicy v1: the webhook, its certificate from cert-manager.
WEBHOOK_MODE_VALUES: dict[str, Any] = {
    "enabled": True,
    "failurePolicy": "Ignore",
    "certManager": {"enabled": True},
}


def argocd_manifest(
    name: str, repo_url: str | None = None, image: str | None = None, *, webhook: bool = False
) -> list[dict[str, Any]]:
    """The documents of ``argocd/<name>``; with ``repo_url``, the cluster Secret's
    ``gpu-scheduler.io/repo-url`` annotation (the one place, argocd/README.md) and the
    AppProject's allow-list entry that must equal it are rewritten. With ``image``
    (``REPOSITORY:TAG``, an image already on the nodes), every ApplicationSet's Helm values
    get ``image.repository``, ``image.tag`` and ``image.pullPolicy: Never``, where
    argocd/README.md tells users to set their image (each list element's ``helmValues``, or
    the template's ``helm.values``), and the placement on the real node that runs it
    (``REAL_NODE_PLACEMENT``: the control-plane node required, not only preferred). With ``webhook``, the scheduler chart's values also get
    ``webhook`` = ``WEBHOOK_MODE_VALUES`` (argocd/README.md, "Webhook mode": the webhook with
    cert-manager instead of the default injection policy). Nothing else changes."""
    docs = [d for d in yaml.safe_load_all((ARGOCD_DIR / name).read_text()) if d]
    for d in docs:
        if repo_url:
            if d["kind"] == "Secret" and REPO_URL_ANNOTATION in d["metadata"].get("annotations", {}):
                d["metadata"]["annotations"][REPO_URL_ANNOTATION] = repo_url
            if d["kind"] == "AppProject":
                # The Git entry; the registry's charts (oci://) stay allowed.
                oci = [r for r in d["spec"]["sourceRepos"] if r.startswith("oci://")]
                d["spec"]["sourceRepos"] = [repo_url, *oci]
        if image and d["kind"] == "ApplicationSet":
            _set_appset_image(d, image)
            # The image is on the real node only: the pods that must run go there.
            for chart, placement in REAL_NODE_PLACEMENT.items():
                _rewrite_values(d, _merged(placement), chart=chart)
        if webhook and d["kind"] == "ApplicationSet":
            _rewrite_values(
                d,
                lambda values: {
                    **values,
                    "webhook": {**(values.get("webhook") or {}), **WEBHOOK_MODE_VALUES},
                },
                chart="gpu-scheduler-chart",
            )
    return docs


def _merged(extra: dict[str, Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A change of Helm values that adds ``extra``'s keys (replacing theirs)."""
    return lambda values: {**values, **extra}


def _set_appset_image(appset: dict[str, Any], image: str) -> None:
    repository, _, tag = image.rpartition(":")
    if not repository or "/" in tag:
        raise ValueError(f"image {image!r} is not REPOSITORY:TAG")
    _rewrite_values(
        appset,
        lambda values: {
            **values,
            "image": {
                **(values.get("image") or {}),
                "repository": repository,
                "tag": tag,
                "pullPolicy": "Never",
            },
        },
    )


def _rewrite_values(
    appset: dict[str, Any], change: Callable[[dict[str, Any]], dict[str, Any]], chart: str | None = None
) -> None:
    """Apply ``change`` to the Helm values of every Application ``appset`` generates (of
    ``chart`` only, when given): each list element's ``helmValues``, or the template's
    ``helm.values`` when it is not itself a template."""

    def rewrite(text: str) -> str:
        return yaml.safe_dump(change(yaml.safe_load(text) or {}), sort_keys=False)

    found = 0
    for gen in appset["spec"].get("generators") or []:
        for sub in [gen, *((gen.get("matrix") or {}).get("generators") or [])]:
            for element in (sub.get("list") or {}).get("elements") or []:
                if "helmValues" in element and chart in (None, element.get("chartPath")):
                    element["helmValues"] = rewrite(element["helmValues"])
                    found += 1
    source = appset["spec"]["template"]["spec"]["source"]
    helm = source.get("helm") or {}
    if "{{" not in str(helm.get("values", "{{")) and chart in (None, source.get("path")):
        helm["values"] = rewrite(helm["values"])
        found += 1
    if not found and chart is None:
        raise ValueError(
            f"ApplicationSet {appset['metadata']['name']} has no Helm values to set the image in"
        )


__all__ = [
    "ARGOCD_NS",
    "CERT_MANAGER_NS",
    "WEBHOOK_MODE_VALUES",
    "ArgoCD",
    "argocd_manifest",
    "bare_repository",
    "cert_manager_manifests",
    "commit_change",
    "commit_changes",
    "start_argocd",
    "start_cert_manager",
]
