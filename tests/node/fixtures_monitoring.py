"""A real Prometheus against the package's release (``product``), configured as a user's would be.

- The binary: tools/provision.sh ``prometheus`` (the same Prometheus module and version as
  promtool), run as a host process of this test, like the control plane's own components.
- What it scrapes: the chart's ServiceMonitors, rendered by helm from the release's own values
  (``helm get values``) with monitoring on, and translated into scrape configs the way the
  Prometheus Operator does: kubernetes_sd (role endpointslice) through the apiserver, keeping the
  endpoints of Services whose labels match the ServiceMonitor's selector and whose port has its
  name; ``job`` is the Service's name, ``namespace``/``pod``/``service`` come from discovery. The
  webhook's target is scraped over HTTPS, verified with the CA of the chart's TLS Secret as its
  Service's DNS name (the ServiceMonitor's tlsConfig). The targets are the pods' IPs, which this
  host reaches over the real node's CNI bridge, as Prometheus reaches pod IPs in a cluster.
  Besides, the apiserver's own /metrics (GPUSchedulerWebhookFailOpen reads its counter), as
  kube-prometheus-stack scrapes it.
- Its identity: a ServiceAccount with what a cluster's Prometheus holds (list/watch Services,
  EndpointSlices and Pods; GET /metrics), never the admin's certificate.
- Its rules: the chart's rendered PrometheusRule groups, with short ``for:`` and window values
  (prometheusRule.downFor, noLeaderFor, errorWindow), scrape and evaluation every second.
- The release in use: one mapped pod admitted (a dry run) when Prometheus starts, so the
  apiserver's admission metrics for the webhook exist, as in any cluster that runs GPU work.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster.clients import load_manifests
from localcluster.network import free_port
from localcluster.procs import ManagedProcess
from localcluster.release import SCHEDULER_CHART, chart_path
from localcluster.toolcache import tool
from tests.node.conftest import Product

PROM_NS, PROM_SA = "monitoring", "prometheus"
# The release's monitoring values in this test: alerts after 2 s instead of minutes, errors
# counted over 10 s, scrapes every second.
MONITORING_VALUES: dict[str, Any] = {
    "prometheusRule": {"enabled": True, "downFor": "2s", "noLeaderFor": "2s", "errorWindow": "10s"},
    "serviceMonitor": {"enabled": True, "interval": "1s", "scrapeTimeout": "1s"},
    "grafanaDashboard": {"enabled": True},
}
# What a cluster's Prometheus may read (kube-prometheus-stack's ClusterRole, cut to what it uses).
PROM_RBAC = [
    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": PROM_NS}},
    {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": PROM_SA, "namespace": PROM_NS}},
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "test-prometheus"},
        "rules": [
            {"apiGroups": [""], "resources": ["services", "pods"], "verbs": ["get", "list", "watch"]},
            {
                "apiGroups": ["discovery.k8s.io"],
                "resources": ["endpointslices"],
                "verbs": ["get", "list", "watch"],
            },
            {"nonResourceURLs": ["/metrics"], "verbs": ["get"]},
        ],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "test-prometheus"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "test-prometheus",
        },
        "subjects": [{"kind": "ServiceAccount", "name": PROM_SA, "namespace": PROM_NS}],
    },
]


def _label(name: str) -> str:
    """A Kubernetes label's name as a discovery meta label's suffix (Prometheus' sanitising)."""
    return "".join(c if c.isalnum() else "_" for c in name)


def scrape_config(
    sm: Mapping[str, Any], sd: Mapping[str, Any], files: Mapping[str, Path]
) -> list[dict[str, Any]]:
    """The scrape configs the Prometheus Operator generates for a ServiceMonitor (one per endpoint).

    ``sd``: the kubernetes_sd_config's connection (kubeconfig); ``files``: the CA file of each
    Secret key the endpoint's tlsConfig names (``name/key``)."""
    meta, spec = sm["metadata"], sm["spec"]
    out = []
    for i, ep in enumerate(spec["endpoints"]):
        relabel: list[dict[str, Any]] = []
        for k, v in spec["selector"]["matchLabels"].items():
            relabel.append(
                {
                    "action": "keep",
                    "source_labels": [
                        f"__meta_kubernetes_service_label_{_label(k)}",
                        f"__meta_kubernetes_service_labelpresent_{_label(k)}",
                    ],
                    "regex": f"({v});true",
                }
            )
        relabel += [
            {
                "action": "keep",
                "source_labels": ["__meta_kubernetes_endpointslice_port_name"],
                "regex": ep["port"],
            },
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"},
            {"target_label": "endpoint", "replacement": ep["port"]},
        ]
        job: dict[str, Any] = {
            "job_name": f"serviceMonitor/{meta['namespace']}/{meta['name']}/{i}",
            "scrape_interval": ep["interval"],
            "scrape_timeout": ep["scrapeTimeout"],
            "metrics_path": ep.get("path", "/metrics"),
            "scheme": ep.get("scheme", "http"),
            "kubernetes_sd_configs": [
                {
                    "role": "endpointslice",
                    "namespaces": {"names": spec["namespaceSelector"]["matchNames"]},
                    **sd,
                }
            ],
            "relabel_configs": relabel,
        }
        tls = ep.get("tlsConfig")
        if tls:
            ca = tls["ca"]["secret"]
            job["tls_config"] = {
                "ca_file": str(files[f"{ca['name']}/{ca['key']}"]),
                "server_name": tls["serverName"],
            }
        out.append(job)
    return out


@dataclass
class Prometheus:
    url: str
    proc: ManagedProcess
    rules: list[dict[str, Any]]  # the rendered PrometheusRule's groups
    dashboard: dict[str, Any]  # the rendered dashboard JSON
    namespace: str  # the release's
    scheduler_job: str
    webhook_job: str
    webhook_ca: Path  # the CA of the webhook's TLS Secret (its ServiceMonitor's tlsConfig)

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.url}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        with urllib.request.urlopen(url, timeout=5) as resp:  # loopback only
            body = json.loads(resp.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return list(self.get("/api/v1/query", query=expr)["result"])

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts pending or firing now (GET /api/v1/alerts)."""
        return list(self.get("/api/v1/alerts")["alerts"])

    def firing(self) -> dict[str, dict[str, str]]:
        return {a["labels"]["alertname"]: a["labels"] for a in self.alerts() if a["state"] == "firing"}

    def targets(self) -> list[str]:
        """Each active target, one line: job, instance, health, last error."""
        return [
            f"{t['labels'].get('job')} {t['labels'].get('instance')} {t['health']} {t.get('lastError', '')}".strip()
            for t in self.get("/api/v1/targets")["activeTargets"]
        ]

    def state(self) -> str:
        """What a failed wait prints: the alerts and the targets now."""
        alerts = [f"{a['labels']['alertname']} {a['state']} {a['labels']}" for a in self.alerts()]
        return (
            "alerts now:\n  "
            + "\n  ".join(alerts or ["(none)"])
            + "\ntargets now:\n  "
            + "\n  ".join(self.targets() or ["(none)"])
        )

    def wait(self, cond: Any, what: Any, timeout: float = 60, poke: Any = None) -> None:
        """Poll ``cond()`` every 0.5 s (``poke()`` first, when given) until it is true; fail with
        ``what`` (a string, or a function that says it then) and the alerts and targets
        Prometheus has when ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if poke is not None:
                poke()
            if cond():
                return
            time.sleep(0.5)
        pytest.fail(f"{what() if callable(what) else what}: not within {timeout:.0f}s\n{self.state()}")


MAPPED_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "w-0", "annotations": {"gpu-scheduling-map": "0=node1:0"}},
    "spec": {
        "schedulerName": "gpu-scheduler",
        "containers": [{"name": "main", "image": "registry.invalid/never-pulled:kwok"}],
    },
}


def admit_mapped_pod(product: Product, namespace: str) -> None:
    """Create a mapped pod as a dry run: the apiserver calls the webhook (or fails open), stores nothing."""
    from kubernetes import client

    core = client.CoreV1Api(product.cluster.admin_api())
    core.create_namespaced_pod(namespace, MAPPED_POD, dry_run="All")


def _release_values(product: Product) -> dict[str, Any]:
    out = product.cluster.helm("get", "values", product.release, "-n", product.namespace, "-o", "json")
    return dict(json.loads(out.stdout) or {})


def _render(product: Product, workdir: Path) -> list[dict[str, Any]]:
    values = {**_release_values(product), **MONITORING_VALUES}
    vf = workdir / "values.yaml"
    vf.write_text(yaml.safe_dump(values))
    out = product.cluster.helm(
        "template", product.release, str(chart_path(SCHEDULER_CHART)), "-n", product.namespace, "-f", str(vf)
    )
    return load_manifests(out.stdout)


def _secret_file(product: Product, name: str, key: str, out: Path) -> Path:
    import base64

    data = product.cluster.get_json("secret", name, "-n", product.namespace)["data"]
    out.write_bytes(base64.b64decode(data[key]))
    return out


def start_prometheus(product: Product, workdir: Path) -> Prometheus:
    docs = _render(product, workdir)
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    [rule] = by_kind["PrometheusRule"]
    monitors = by_kind["ServiceMonitor"]
    [dash_cm] = [c for c in by_kind["ConfigMap"] if c["metadata"]["name"].endswith("-dashboard")]
    cluster = product.cluster
    cluster.apply(PROM_RBAC)
    cluster.wait_until(
        lambda: len(cluster.get_json("serviceaccounts", "-n", PROM_NS).get("items") or []) >= 2,
        timeout=30,
        what=f"ServiceAccounts {PROM_NS}/{PROM_SA} and default",
    )
    kubeconfig = cluster.service_account_kubeconfig(PROM_NS, PROM_SA, workdir / "prometheus.kubeconfig")
    token = workdir / "token"
    token.write_text(yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"])
    files = {}
    for sm in monitors:
        for ep in sm["spec"]["endpoints"]:
            ca = ((ep.get("tlsConfig") or {}).get("ca") or {}).get("secret")
            if ca:
                files[f"{ca['name']}/{ca['key']}"] = _secret_file(
                    product, ca["name"], ca["key"], workdir / f"{ca['name']}-{ca['key']}"
                )
    scrape = [c for sm in monitors for c in scrape_config(sm, {"kubeconfig_file": str(kubeconfig)}, files)]
    api = urllib.parse.urlparse(cluster.server)
    scrape.append(
        {
            "job_name": "apiserver",
            "scheme": "https",
            "static_configs": [{"targets": [api.netloc]}],
            "authorization": {"credentials_file": str(token)},
            "tls_config": {"ca_file": str(cluster.ca_file)},
        }
    )
    rules_file = workdir / "rules.yaml"
    rules_file.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    config = workdir / "prometheus.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(rules_file)],
                "scrape_configs": scrape,
            },
            sort_keys=False,
        )
    )
    port = free_port()
    proc = ManagedProcess(
        "prometheus",
        [
            tool("prometheus"),
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        log_path=workdir / "prometheus.log",
    ).start()
    try:
        proc.wait_http(f"http://127.0.0.1:{port}/-/ready", timeout=60)
        admit_mapped_pod(product, PROM_NS)
    except BaseException:
        proc.stop()
        raise
    [dashboard] = dash_cm["data"].values()
    jobs = {
        m["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]: _service_of(docs, m)
        for m in monitors
    }
    return Prometheus(
        url=f"http://127.0.0.1:{port}",
        proc=proc,
        rules=rule["spec"]["groups"],
        dashboard=json.loads(dashboard),
        namespace=product.namespace,
        scheduler_job=jobs["scheduler"],
        webhook_job=jobs["webhook"],
        webhook_ca=next(iter(files.values())),
    )


def _service_of(docs: list[dict[str, Any]], sm: Mapping[str, Any]) -> str:
    """The name of the Service a ServiceMonitor selects (its ``job``)."""
    want = sm["spec"]["selector"]["matchLabels"]
    [svc] = [
        d["metadata"]["name"]
        for d in docs
        if d["kind"] == "Service"
        and all((d["metadata"].get("labels") or {}).get(k) == v for k, v in want.items())
    ]
    return str(svc)


@pytest.fixture(scope="module")
def prometheus(product: Product, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    prom = start_prometheus(product, tmp_path_factory.mktemp("prometheus"))
    try:
        yield prom
    finally:
        prom.proc.stop()
        product.cluster.kubectl("delete", "namespace", PROM_NS, "--wait=false", check=False)
        product.cluster.kubectl(
            "delete", "clusterrole,clusterrolebinding", "test-prometheus", "--ignore-not-found", check=False
        )
