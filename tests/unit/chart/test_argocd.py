"""Argo CD manifests: ordering (RollingSync steps, sync waves), namespaces, generators,
goTemplate options, sync policy, the AppProject's allow-lists against what the charts
render, and the Applications the ApplicationSets generate for the cluster Secret."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.charts import CHECK_CHART, SCHEDULER_CHART, ci_values, is_hook, render

ARGOCD = Path(__file__).resolve().parents[3] / "argocd"
APPSETS = {
    "complete": ARGOCD / "gpu-scheduler-complete-applicationset.yaml",
    "scheduler": ARGOCD / "gpu-scheduler-applicationset.yaml",
    "check": ARGOCD / "gpu-scheduler-check-applicationset.yaml",
    "oci": ARGOCD / "gpu-scheduler-oci-applicationset.yaml",
}
# The ApplicationSets whose source is this Git repository (the OCI one: the released charts).
GIT_APPSETS = {k: v for k, v in APPSETS.items() if k != "oci"}
# What each released chart (oci://<registry>/<name>) is in this tree.
OCI_CHARTS = {"gpu-scheduler": "gpu-scheduler-chart", "gpu-scheduler-check": "gpu-scheduler-check-chart"}
SERVER = "https://kubernetes.default.svc"
MAP_API = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"
NAMESPACES = {
    "gpu-scheduler-chart": "gpu-scheduler-system",
    "gpu-scheduler-check-chart": "gpu-scheduler-tests",
}
SYNC_OPTIONS = {
    "CreateNamespace=true",
    "PrunePropagationPolicy=foreground",
    "ApplyOutOfSyncOnly=true",
    "ServerSideApply=true",
}


def load(path: Path) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text())
    assert isinstance(doc, dict)
    return doc


@pytest.fixture(scope="module")
def secret() -> dict[str, Any]:
    return load(ARGOCD / "local-cluster-secret.yaml")


@pytest.fixture(scope="module")
def project() -> dict[str, Any]:
    return load(ARGOCD / "gpu-scheduler-project.yaml")


# ---------------------------------------------------------------- a small goTemplate renderer
# Enough of Go's text/template for these manifests: {{ .a.b }} and {{ index .a "k" }},
# with missingkey=error semantics for field access (a missing key raises KeyError).
TOKEN = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}")


def lookup(params: dict[str, Any], path: str) -> Any:
    value: Any = params
    for part in path.lstrip(".").split("."):
        value = value[part]  # KeyError = missingkey=error
    return value


def eval_expr(expr: str, params: dict[str, Any]) -> Any:
    m = re.fullmatch(r'index\s+(\.[\w.]+)\s+"([^"]+)"', expr)
    if m:
        return lookup(params, m.group(1)).get(m.group(2), "")
    if re.fullmatch(r"\.[\w.]+", expr):
        return lookup(params, expr)
    raise AssertionError(f"template expression not understood by the test renderer: {expr}")


def render_string(text: str, params: dict[str, Any]) -> str:
    return TOKEN.sub(lambda m: str(eval_expr(m.group(1), params)), text)


def render_tree(node: Any, params: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        return {render_string(k, params): render_tree(v, params) for k, v in node.items()}
    if isinstance(node, list):
        return [render_tree(v, params) for v in node]
    if isinstance(node, str):
        return render_string(node, params)
    return node


def cluster_params(secret: dict[str, Any], gen: dict[str, Any]) -> dict[str, Any]:
    """What the cluster generator passes for the cluster Secret (goTemplate mode)."""
    data = secret["stringData"]
    params: dict[str, Any] = {
        "name": data["name"],
        "nameNormalized": data["name"],
        "server": data["server"],
        "project": "",
        "metadata": {
            "labels": secret["metadata"]["labels"],
            "annotations": secret["metadata"]["annotations"],
        },
    }
    params["values"] = {k: render_string(v, params) for k, v in (gen.get("values") or {}).items()}
    return params


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def generate(appset: dict[str, Any], secret: dict[str, Any]) -> list[dict[str, Any]]:
    """The Applications the ApplicationSet generates for the cluster Secret."""
    param_sets: list[dict[str, Any]] = []
    for gen in appset["spec"]["generators"]:
        if "clusters" in gen:
            if matches(gen["clusters"]["selector"], secret["metadata"]["labels"]):
                param_sets.append(cluster_params(secret, gen["clusters"]))
        elif "matrix" in gen:
            clusters, lists = gen["matrix"]["generators"]
            assert matches(clusters["clusters"]["selector"], secret["metadata"]["labels"])
            base = cluster_params(secret, clusters["clusters"])
            param_sets += [{**base, **element} for element in lists["list"]["elements"]]
        else:
            raise AssertionError(f"generator not modelled: {gen}")
    return [render_tree(appset["spec"]["template"], p) for p in param_sets]


# ---------------------------------------------------------------- tests
def test_all_manifests_parse_and_lint() -> None:
    files = sorted(ARGOCD.glob("*.yaml"))
    assert {f.name for f in files} >= {
        "gpu-scheduler-project.yaml",
        "gpu-scheduler-complete-applicationset.yaml",
        "gpu-scheduler-applicationset.yaml",
        "gpu-scheduler-check-applicationset.yaml",
        "local-cluster-secret.yaml",
        "gpu-scheduler-oci-applicationset.yaml",
    }
    repo = ARGOCD.parent
    res = subprocess.run(
        [
            str(repo / ".venv" / "bin" / "yamllint"),
            "--strict",
            "-c",
            str(repo / "lintconf.yaml"),
            *map(str, files),
        ],
        check=False,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert (ARGOCD / "README.md").is_file()


def test_cluster_secret(secret: dict[str, Any]) -> None:
    assert secret["kind"] == "Secret" and secret["metadata"]["namespace"] == "argocd"
    assert secret["metadata"]["labels"] == {
        "argocd.argoproj.io/secret-type": "cluster",
        "environment": "gpu-enabled",
    }
    assert secret["stringData"]["server"] == SERVER
    annotations = secret["metadata"]["annotations"]
    assert annotations["gpu-scheduler.io/repo-url"].startswith("https://")
    assert annotations["gpu-scheduler.io/target-revision"]
    # The released charts: the registry CI pushes them to, and a version that is released.
    assert (
        annotations["gpu-scheduler.io/chart-registry"]
        == "oci://registry.gitlab.com/evgenii19/gpu-scheduler/charts"
    )
    assert re.fullmatch(r"\d+\.\d+\.\d+", annotations["gpu-scheduler.io/chart-version"])


@pytest.mark.parametrize("name", APPSETS)
def test_appset_basics(name: str, secret: dict[str, Any]) -> None:
    appset = load(APPSETS[name])
    spec = appset["spec"]
    assert appset["kind"] == "ApplicationSet" and appset["metadata"]["namespace"] == "argocd"
    assert spec["goTemplate"] is True
    assert spec["goTemplateOptions"] == ["missingkey=error"]
    text = APPSETS[name].read_text()
    # The repository URL is never written in an ApplicationSet: it comes from the cluster Secret.
    assert secret["metadata"]["annotations"]["gpu-scheduler.io/repo-url"] not in text
    tmpl = spec["template"]["spec"]
    assert tmpl["project"] == "gpu-scheduler"
    policy = tmpl["syncPolicy"]
    assert policy["automated"] == {"prune": True, "selfHeal": True, "allowEmpty": False}
    assert set(policy["syncOptions"]) >= SYNC_OPTIONS
    assert policy["retry"] == {"limit": 5, "backoff": {"duration": "5s", "factor": 2, "maxDuration": "3m"}}


def clusters_generator(appset: dict[str, Any]) -> dict[str, Any]:
    gen = appset["spec"]["generators"][0]
    if "matrix" in gen:
        gen = gen["matrix"]["generators"][0]
    return dict(gen["clusters"])


@pytest.mark.parametrize("name", APPSETS)
def test_cluster_generator_selects_gpu_enabled(name: str) -> None:
    gen = clusters_generator(load(APPSETS[name]))
    assert gen["selector"] == {"matchLabels": {"environment": "gpu-enabled"}}
    want = {"chartRegistry", "chartVersion"} if name == "oci" else {"repoURL", "targetRevision"}
    assert set(gen["values"]) == want


def test_complete_appset_orders_scheduler_before_check(secret: dict[str, Any]) -> None:
    appset = load(APPSETS["complete"])
    strategy = appset["spec"]["strategy"]
    assert strategy["type"] == "RollingSync"
    steps = strategy["rollingSync"]["steps"]
    step_values = []
    for step in steps:
        (expr,) = step["matchExpressions"]
        assert expr["key"] == "gpu-scheduler.io/rollout-step" and expr["operator"] == "In"
        step_values.append(expr["values"])
    assert step_values == [["scheduler"], ["check"]]
    apps = generate(appset, secret)
    by_step = {a["metadata"]["labels"]["gpu-scheduler.io/rollout-step"]: a for a in apps}
    assert set(by_step) == {"scheduler", "check"}
    # Every generated Application falls in exactly one step (else RollingSync never syncs it).
    for app in apps:
        label = app["metadata"]["labels"]["gpu-scheduler.io/rollout-step"]
        assert sum(label in v for v in step_values) == 1
    assert by_step["scheduler"]["spec"]["source"]["path"] == "gpu-scheduler-chart"
    assert by_step["check"]["spec"]["source"]["path"] == "gpu-scheduler-check-chart"
    waves = {s: a["metadata"]["annotations"]["argocd.argoproj.io/sync-wave"] for s, a in by_step.items()}
    assert waves == {"scheduler": "1", "check": "2"}


@pytest.mark.parametrize("name", APPSETS)
def test_sync_waves_are_quoted_strings(name: str) -> None:
    text = APPSETS[name].read_text()
    for value in re.findall(r"(?:sync-wave|syncWave):\s*(\S+)", text):
        assert value[0] in "'\"", f"sync wave {value} is not a quoted string"


@pytest.mark.parametrize("name", APPSETS)
def test_generated_applications(name: str, secret: dict[str, Any], project: dict[str, Any]) -> None:
    apps = generate(load(APPSETS[name]), secret)
    assert apps, "no Application generated for the local cluster Secret"
    allowed = {(d["server"], d["namespace"]) for d in project["spec"]["destinations"]}
    annotations = secret["metadata"]["annotations"]
    for app in apps:
        src, dest = app["spec"]["source"], app["spec"]["destination"]
        values = yaml.safe_load(src["helm"]["values"])
        if name == "oci":
            registry, _, released = src["repoURL"].rpartition("/")
            assert registry == annotations["gpu-scheduler.io/chart-registry"]
            assert f"{registry}/*" in project["spec"]["sourceRepos"]
            assert src["targetRevision"] == annotations["gpu-scheduler.io/chart-version"]
            assert src["path"] == "."
            path = OCI_CHARTS[released]
            assert "image" not in values  # each released chart pins the image it was released with
        else:
            assert src["repoURL"] == annotations["gpu-scheduler.io/repo-url"]
            assert src["repoURL"] in project["spec"]["sourceRepos"]
            assert src["targetRevision"] == annotations["gpu-scheduler.io/target-revision"]
            path = src["path"]
        assert (dest["server"], dest["namespace"]) in allowed
        assert dest["namespace"] == NAMESPACES[path]
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", app["metadata"]["name"])
        wave = app["metadata"]["annotations"]["argocd.argoproj.io/sync-wave"]
        assert wave == ("1" if path == "gpu-scheduler-chart" else "2")
        # The Helm values render with the chart (schema included).
        chart = SCHEDULER_CHART if path == "gpu-scheduler-chart" else CHECK_CHART
        docs = render(chart, values=values, release=src["helm"]["releaseName"], namespace=dest["namespace"])
        assert docs


def test_missing_annotation_fails_generation(secret: dict[str, Any]) -> None:
    bare = yaml.safe_load(yaml.safe_dump(secret))
    del bare["metadata"]["annotations"]
    with pytest.raises(KeyError):
        generate(load(APPSETS["complete"]), bare)


def test_the_scheduler_chart_injects_with_the_policy_by_default(secret: dict[str, Any]) -> None:
    """No webhook, no cert-manager: injection.mode auto, which Argo CD renders with the
    destination cluster's API versions (policy where MutatingAdmissionPolicy v1 is served)."""
    for name in ("complete", "scheduler"):
        for app in generate(load(APPSETS[name]), secret):
            if app["spec"]["source"]["path"] != "gpu-scheduler-chart":
                continue
            values = yaml.safe_load(app["spec"]["source"]["helm"]["values"])
            assert values["injection"] == {"mode": "auto"}
            assert "webhook" not in values
            docs = render(SCHEDULER_CHART, values=values, extra=["--api-versions", MAP_API])
            kinds = {d["kind"] for d in docs}
            assert "MutatingAdmissionPolicy" in kinds
            assert not kinds & {"MutatingWebhookConfiguration", "Certificate", "Issuer", "Secret"}


def test_webhook_mode_ignores_the_ca_bundle_cert_manager_injects(secret: dict[str, Any]) -> None:
    """argocd/README.md's webhook mode (localcluster.gitops.WEBHOOK_MODE_VALUES): the caBundle
    cert-manager's injector writes is ignored, and the webhook stays on a cluster serving
    MutatingAdmissionPolicy (auto never replaces an enabled webhook)."""
    from localcluster.gitops import argocd_manifest

    for name in ("complete", "scheduler"):
        (appset,) = argocd_manifest(APPSETS[name].name, webhook=True)
        for app in generate(appset, secret):
            values = yaml.safe_load(app["spec"]["source"]["helm"]["values"])
            if app["spec"]["source"]["path"] != "gpu-scheduler-chart":
                assert "webhook" not in values
                continue
            assert values["webhook"]["certManager"]["enabled"] is True
            ignored = {d["kind"]: d["jqPathExpressions"] for d in app["spec"]["ignoreDifferences"]}
            for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
                assert ignored[kind] == [".webhooks[]?.clientConfig.caBundle"]
            assert "RespectIgnoreDifferences=true" in app["spec"]["syncPolicy"]["syncOptions"]
            docs = render(SCHEDULER_CHART, values=values, extra=["--api-versions", MAP_API])
            kinds = {d["kind"] for d in docs}
            assert {"MutatingWebhookConfiguration", "Certificate"} <= kinds
            assert "MutatingAdmissionPolicy" not in kinds


def test_project(project: dict[str, Any], secret: dict[str, Any]) -> None:
    spec = project["spec"]
    annotations = secret["metadata"]["annotations"]
    assert spec["sourceRepos"] == [
        annotations["gpu-scheduler.io/repo-url"],
        annotations["gpu-scheduler.io/chart-registry"] + "/*",  # the released charts only
    ]
    assert "*" not in str(spec["sourceRepos"][0]) + str(spec["destinations"])
    assert sorted(spec["destinations"], key=lambda d: d["namespace"]) == [
        {"server": SERVER, "namespace": "gpu-scheduler-system"},
        {"server": SERVER, "namespace": "gpu-scheduler-tests"},
    ]


def chart_kinds() -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """(cluster-scoped, namespaced) group/kind Argo CD creates from the charts,
    over every ci scenario and every optional feature."""
    cluster_scoped = {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "MutatingAdmissionPolicy",
        "CustomResourceDefinition",
        "MutatingAdmissionPolicyBinding",
    }
    all_features = {
        "replicaCount": 2,
        "serviceMonitor": {"enabled": True},
        "networkPolicy": {"enabled": True},
        "webhook": {"enabled": True, "certManager": {"enabled": True}},
    }
    docs: list[dict[str, Any]] = []
    for chart in (SCHEDULER_CHART, CHECK_CHART):
        for f in ci_values(chart):
            docs += render(chart, [f])
    docs += render(SCHEDULER_CHART, values=all_features)
    # Policy mode, on a cluster that serves MutatingAdmissionPolicy v1 (the ApplicationSets' default).
    docs += render(SCHEDULER_CHART, extra=["--api-versions", MAP_API])
    docs += render(
        SCHEDULER_CHART,
        values={"webhook": {"enabled": True, "caBundle": "QQ==", "tls": {"crt": "c", "key": "k"}}},
    )
    # Helm hooks are skipped by Argo CD when they say so (the check chart's pre-install
    # wait-ready: hook Skip) and Helm test hooks unless they are also Argo CD hooks (the
    # check chart's verification pod and its RBAC: a Sync hook, still permission-checked).
    found = {
        (d["apiVersion"].rpartition("/")[0], d["kind"])
        for d in docs
        if not is_hook(d) or d["metadata"]["annotations"].get("argocd.argoproj.io/hook", "Skip") != "Skip"
    }
    found.add(("", "Namespace"))  # CreateNamespace=true
    return {gk for gk in found if gk[1] in cluster_scoped}, {
        gk for gk in found if gk[1] not in cluster_scoped
    }


def test_project_whitelists_exactly_what_the_charts_create(project: dict[str, Any]) -> None:
    cluster, namespaced = chart_kinds()
    spec = project["spec"]
    assert {(r["group"], r["kind"]) for r in spec["clusterResourceWhitelist"]} == cluster
    assert {(r["group"], r["kind"]) for r in spec["namespaceResourceWhitelist"]} == namespaced


def test_readme_documents_what_argocd_must_enable() -> None:
    text = (ARGOCD / "README.md").read_text()
    assert "applicationsetcontroller.enable.progressive.syncs" in text
    assert "argocd-cmd-params-cm" in text
    assert "RollingSync" in text
    assert "resource.customizations" in text and "argocd-cm" in text


def test_validate_script_pins_the_argocd_version() -> None:
    versions = (ARGOCD.parent / "tools" / "versions.env").read_text()
    assert re.search(r"^ARGOCD_VERSION=v3\.\d+\.\d+$", versions, re.M)
    script = (ARGOCD / "validate.sh").read_text()
    assert "ARGOCD_VERSION" in script and "--dry-run=server" in script
    assert "go mod download" in script


@pytest.mark.parametrize("name", sorted(GIT_APPSETS))
def test_the_local_rewrite_changes_only_the_repository_and_the_image(
    name: str, secret: dict[str, Any]
) -> None:
    """What `make gitops-demo` applies (localcluster.gitops.argocd_manifest): the files users
    apply, with the image of this tree where argocd/README.md says to set one (each Application's
    Helm values) and nothing else of them changed."""
    from localcluster.gitops import argocd_manifest
    from localcluster.release import REAL_NODE_PLACEMENT

    ref = "localhost/gpu-scheduler:dev-0123456789ab"
    (original,) = [d for d in yaml.safe_load_all(APPSETS[name].read_text()) if d]
    (rewritten,) = argocd_manifest(APPSETS[name].name, "file:///tmp/repo.git", image=ref)
    apps, before = generate(rewritten, secret), generate(original, secret)
    assert len(apps) == len(before) >= 1
    for app, old in zip(apps, before, strict=True):
        values = yaml.safe_load(app["spec"]["source"]["helm"]["values"])
        old_values = yaml.safe_load(old["spec"]["source"]["helm"]["values"])
        assert values.pop("image") == {
            "repository": "localhost/gpu-scheduler",
            "tag": "dev-0123456789ab",
            "pullPolicy": "Never",
        }
        old_values.pop("image")
        # And the pods that must run go to the real node, the one the image is on.
        chart = app["spec"]["source"]["path"]
        for key, placement in REAL_NODE_PLACEMENT[chart].items():
            assert values.pop(key) == placement
        assert values == old_values
        for a in (app, old):
            del a["spec"]["source"]["helm"]["values"]
        assert app == old
    assert argocd_manifest(APPSETS[name].name, "file:///tmp/repo.git") == [original]


def test_every_namespace_the_check_chart_writes_to_is_a_project_destination(project: dict[str, Any]) -> None:
    """The check chart's verification Pod waits first (wait-ready), reading the scheduler's Lease
    through a Role in the scheduler's namespace: the check Application writes there too, so
    the project must allow it."""
    allowed = {d["namespace"] for d in project["spec"]["destinations"] if d["server"] == SERVER}
    docs = [
        d
        for d in render(CHECK_CHART, namespace=NAMESPACES["gpu-scheduler-check-chart"])
        if not is_hook(d)
        or d["metadata"]["annotations"].get("argocd.argoproj.io/hook", "Skip")
        != "Skip"  # what Argo CD creates
    ]
    written = {d["metadata"].get("namespace") for d in docs}
    assert "gpu-scheduler-system" in written, written  # the Lease Role
    assert written <= allowed, (written, allowed)


def test_the_oci_appset_orders_the_released_charts_as_the_complete_one(secret: dict[str, Any]) -> None:
    """The same RollingSync steps, waves, sync policy and values (less the image) as the Git
    ApplicationSet: only the source differs."""
    oci, git = load(APPSETS["oci"]), load(APPSETS["complete"])
    assert oci["spec"]["strategy"] == git["spec"]["strategy"]
    oci_apps = {a["metadata"]["labels"]["gpu-scheduler.io/rollout-step"]: a for a in generate(oci, secret)}
    git_apps = {a["metadata"]["labels"]["gpu-scheduler.io/rollout-step"]: a for a in generate(git, secret)}
    assert set(oci_apps) == set(git_apps) == {"scheduler", "check"}
    for step, app in oci_apps.items():
        other = git_apps[step]
        assert app["metadata"] == other["metadata"]
        for key in ("project", "destination", "ignoreDifferences"):
            assert app["spec"][key] == other["spec"][key], key
        assert app["spec"]["syncPolicy"]["syncOptions"] == other["spec"]["syncPolicy"]["syncOptions"]
        values, git_values = (yaml.safe_load(a["spec"]["source"]["helm"]["values"]) for a in (app, other))
        git_values.pop("image")
        assert values == git_values
