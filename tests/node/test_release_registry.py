"""Installed from a registry, as a user does: ``helm install oci://.../gpu-scheduler --version X``.

The release (this tree, ``make release``'s code) is pushed to a real OCI registry started here
(fixtures_release.py): a two-platform image index whose linux/amd64 image is the very one the
suite ran (``make image``'s archive, by digest), signed, with an SPDX SBOM per platform attested,
which cosign verifies with the release's public key and rejects with another; the arm64 image's
Python is started once under qemu-user. Both charts are installed from the registry on the local
control plane, and the real node's kubelet pulls the image by the index's digest from that
registry: nothing is side-loaded on this path (the image the tests built is in containerd under
another name). Then the same chart as a subchart of an umbrella chart, on a cluster where no
node is a control-plane node (a managed cluster).
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster import cosign, ocilayout
from localcluster.cluster import Cluster
from localcluster.image import Image
from localcluster.multiarch import SBOM_TYPE
from localcluster.node import NODE_NAME
from localcluster.publish import Release
from localcluster.registry import Registry
from localcluster.release import CHECK_CHART, REAL_NODE_PLACEMENT, SCHEDULER_CHART, release_status
from localcluster.sbom import normalize
from localcluster.webhook_host import make_certs
from tests.node.conftest import RELEASE, SYSTEM_NS, Product
from tests.support.waiting import wait_for

CHECK_RELEASE, CHECK_NS = "gpu-scheduler-check", "oci-check"
KWOK_NODES = ("node1", "node2", "node3")


def write_values(path: Path, values: dict[str, Any]) -> str:
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    return str(path)


@pytest.fixture(scope="module")
def vacated(
    node_cluster: Cluster, product_image: Image, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """The package's product is uninstalled for this module (its release name and scheduler name
    are the ones installed here) and installed again after, if it was there."""
    had = release_status(node_cluster, RELEASE, SYSTEM_NS) is not None
    if had:
        node_cluster.helm("uninstall", RELEASE, "-n", SYSTEM_NS, "--wait", "--timeout", "120s")
    # helm uninstall leaves hooks: the helm test pods an earlier `helm test` kept for --logs
    # (docs/charts.md "helm test").
    node_cluster.kubectl(
        "delete", "pod", "-n", SYSTEM_NS, "-l", f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=test",
        "--ignore-not-found", "--wait",
    )  # fmt: skip
    try:
        yield
    finally:
        if had:
            certs = make_certs(
                tmp_path_factory.mktemp("registry-certs") / "webhook",
                service=f"{RELEASE}-webhook",
                namespace=SYSTEM_NS,
            )
            product = Product(node_cluster, product_image, certs)
            from localcluster.release import install_chart

            install_chart(node_cluster, RELEASE, SYSTEM_NS, product.values())
            product.rollout()
            product.wait_serving()


def containerd_digest(cluster: Cluster, ref: str) -> str:
    """The manifest digest containerd holds for ``ref`` on the real node (``ctr images ls``)."""
    assert cluster.node is not None
    rows = [line.split() for line in cluster.node.ctr("images", "ls").stdout.splitlines()[1:]]
    (digest,) = [row[2] for row in rows if row and row[0] == ref]
    return digest


def test_the_release_is_a_two_platform_index_whose_amd64_image_is_the_one_the_suite_ran(
    node_cluster: Cluster, registry: Registry, current_release: Release, product_image: Image
) -> None:
    release = current_release
    status, headers, body = registry.get(f"/v2/gpu-scheduler/manifests/{release.version}")
    assert status == 200 and headers["Docker-Content-Digest"] == release.digest
    index = json.loads(body)
    assert index["mediaType"] == ocilayout.INDEX_MEDIA_TYPE
    platforms = {
        f"{m['platform']['os']}/{m['platform']['architecture']}": m["digest"] for m in index["manifests"]
    }
    assert platforms == release.platforms and set(platforms) == {"linux/amd64", "linux/arm64"}
    assert index["annotations"]["org.opencontainers.image.version"] == release.version
    # linux/amd64 is make image's archive, the image the real node's containerd imported and the
    # suite's pods ran, digest for digest; the registry serves each platform's manifest by it.
    assert release.archives["linux/amd64"] == str(product_image.archive)
    ran = containerd_digest(node_cluster, product_image.ref)
    assert platforms["linux/amd64"] == ran == ocilayout.archive_manifest(product_image.archive)["digest"]
    for platform, digest in platforms.items():
        assert registry.manifest_digest("gpu-scheduler", digest) == digest, platform
        config_digest = json.loads(registry.get(f"/v2/gpu-scheduler/manifests/{digest}")[2])["config"][
            "digest"
        ]
        config = json.loads(registry.get(f"/v2/gpu-scheduler/blobs/{config_digest}", accept="*/*")[2])
        assert f"{config['os']}/{config['architecture']}" == platform
        assert config["config"]["User"] == "65532:65532"
        assert config["config"]["Labels"]["org.opencontainers.image.version"] == release.version


def test_cosign_verifies_the_signature_and_each_sbom_with_the_release_key_and_not_with_another(
    registry: Registry, current_release: Release, tmp_path: Path
) -> None:
    release = current_release
    public = Path(release.public_key)
    signed = cosign.verify(release.image_ref, public, plain_http=True)
    assert [p["critical"]["image"]["docker-manifest-digest"] for p in signed] == [release.digest]
    for platform, digest in release.platforms.items():
        arch = platform.split("/")[1]
        (statement,) = cosign.verify_attestation(
            f"{release.image}@{digest}", public, SBOM_TYPE, plain_http=True
        )
        assert [s["digest"]["sha256"] for s in statement["subject"]] == [digest.removeprefix("sha256:")]
        assert statement["predicateType"] == "https://spdx.dev/Document"
        packages = {normalize(p["name"]): p for p in statement["predicate"]["packages"]}
        assert packages["kube-gpu-scheduler"]["versionInfo"] == release.version, platform
        assert "kubernetes" in packages and "flask" in packages
        # dpkg's database of each base: the interpreter's package, for this platform.
        purls = {p["externalRefs"][0]["referenceLocator"] for p in statement["predicate"]["packages"][1:]}
        pythons = [u for u in purls if u.startswith("pkg:deb/debian/libpython3.11-minimal@")]
        assert len(pythons) == 1 and pythons[0].endswith(f"?arch={arch}"), (platform, sorted(purls))
    other = cosign.generate_key(tmp_path / "other", "another key")
    with pytest.raises(RuntimeError, match="accepted signatures do not match threshold"):
        cosign.verify(release.image_ref, other.public, plain_http=True)
    with pytest.raises(RuntimeError, match="accepted signatures do not match threshold"):
        cosign.verify_attestation(
            f"{release.image}@{release.platforms['linux/arm64']}", other.public, SBOM_TYPE, plain_http=True
        )


def elf_machine(path: Path) -> int:
    """e_machine of an ELF file (62: x86-64, 183: AArch64)."""
    head = path.read_bytes()[:20]
    assert head[:4] == b"\x7fELF", path
    return int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")


def test_the_arm64_images_python_starts_under_qemu_user(current_release: Release, tmp_path: Path) -> None:
    """The arm64 image as pushed (its archive's manifest is the index's arm64 entry), unpacked, and
    its venv's Python started by qemu-user: the programs' imports, compiled extensions included."""
    archive = Path(current_release.archives["linux/arm64"])
    assert ocilayout.archive_manifest(archive)["digest"] == current_release.platforms["linux/arm64"]
    root = ocilayout.unpack_rootfs(archive, tmp_path / "rootfs")
    python = root / "opt" / "venv" / "bin" / "python"
    assert elf_machine(python.resolve()) == 183
    qemu = shutil.which("qemu-aarch64-static")
    assert qemu, "qemu-aarch64-static is missing: tools/provision.sh host (Debian package qemu-user-static)"
    code = (
        "import platform, sys; import gevent, orjson, yaml, cryptography.hazmat.bindings._rust, kubernetes, flask; "
        "from kube_gpu_scheduler.scheduler.main import main; print(platform.machine(), sys.prefix); "
        "sys.argv = ['gpu-scheduler', '--help']; main()"
    )
    res = subprocess.run(
        [qemu, "-L", str(root), str(python), "-c", code],
        capture_output=True,
        text=True,
        check=False,
        timeout=240,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    machine, prefix = res.stdout.splitlines()[0].split()
    assert machine == "aarch64" and prefix.endswith("/opt/venv"), out[-3000:]
    assert "usage: gpu-scheduler" in res.stdout, out[-3000:]


def release_pods(cluster: Cluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout
    return [p for p in json.loads(out)["items"] if p["metadata"].get("deletionTimestamp") is None]


def ready(pod: dict[str, Any]) -> bool:
    statuses = pod["status"].get("containerStatuses") or []
    return (
        pod["status"].get("phase") == "Running" and bool(statuses) and all(c.get("ready") for c in statuses)
    )


def pulled_events(cluster: Cluster, namespace: str) -> list[str]:
    """The kubelet's ``Pulled`` event messages in ``namespace``."""
    out = cluster.kubectl(
        "get", "events", "-n", namespace, "--field-selector", "reason=Pulled", "-o", "json"
    ).stdout
    return [str(e.get("message") or e.get("note") or "") for e in json.loads(out)["items"]]


def assert_pulled_by_digest(
    cluster: Cluster, registry: Registry, release: Release, pods: list[dict[str, Any]]
) -> None:
    """Each pod runs the release's image by digest, the kubelet pulled it, and the registry served
    that manifest by digest to containerd."""
    for pod in pods:
        assert pod["spec"]["nodeName"] == NODE_NAME, pod["metadata"]["name"]
        for c in pod["spec"]["containers"]:
            assert c["image"] == release.image_ref, (pod["metadata"]["name"], c["image"])
        for cs in pod["status"]["containerStatuses"]:
            assert cs["imageID"].endswith(release.digest), (pod["metadata"]["name"], cs["imageID"])
    assert cluster.node is not None
    assert any(i.startswith(f"{registry.host}/gpu-scheduler@{release.digest}") for i in cluster.node.images())
    served = [
        r
        for r in registry.pulls("gpu-scheduler")
        if r["path"].endswith(f"/manifests/{release.digest}") and "containerd" in r["agent"]
    ]
    assert served, registry.requests()[-20:]


def test_both_charts_install_from_the_registry_and_the_kubelet_pulls_the_image_by_digest(
    node_cluster: Cluster, node_registry: Registry, current_release: Release, vacated: None, tmp_path: Path
) -> None:
    cluster, registry, release = node_cluster, node_registry, current_release
    assert cluster.node is not None
    before = [i for i in cluster.node.images() if i.startswith(registry.host)]
    assert before == [], f"the node already had images of the registry: {before}"
    chart = release.charts["gpu-scheduler"]
    # What the registry's chart installs: the image pushed with it, by digest.
    shown = yaml.safe_load(
        cluster.helm("show", "values", chart.ref, "--version", chart.version, "--plain-http").stdout
    )
    assert shown["image"] == {
        "registry": "",  # the mirror's, empty: global.imageRegistry or this one replace the host
        "repository": release.image,
        "tag": "",
        "digest": release.digest,
        "pullPolicy": "IfNotPresent",
    }
    values = write_values(tmp_path / "scheduler.yaml", dict(REAL_NODE_PLACEMENT[SCHEDULER_CHART]))
    try:
        cluster.helm(
            "install", RELEASE, chart.ref, "--version", chart.version, "--plain-http",
            "-n", SYSTEM_NS, "--create-namespace", "-f", values, "--wait", "--timeout", "240s",
        )  # fmt: skip
        pods = release_pods(cluster, SYSTEM_NS, f"app.kubernetes.io/instance={RELEASE}")
        assert pods and all(ready(p) for p in pods), [p["status"] for p in pods]
        assert_pulled_by_digest(cluster, registry, release, pods)
        assert any(
            f'Successfully pulled image "{release.image_ref}"' in m for m in pulled_events(cluster, SYSTEM_NS)
        )

        # The check chart from the registry: its pre-install wait-ready hook pod runs the same image
        # by digest on the real node and waits for this scheduler's Lease and the injection policy.
        check = release.charts["gpu-scheduler-check"]
        check_values = write_values(
            tmp_path / "check.yaml", {**REAL_NODE_PLACEMENT[CHECK_CHART], "check": {"expectNoGPU": True}}
        )
        cluster.helm(
            "install", CHECK_RELEASE, check.ref, "--version", check.version, "--plain-http",
            "-n", CHECK_NS, "--create-namespace", "-f", check_values, "--wait", "--timeout", "300s",
        )  # fmt: skip
        sts = json.loads(cluster.kubectl("get", "statefulsets", "-n", CHECK_NS, "-o", "json").stdout)["items"]
        assert [s["spec"]["template"]["spec"]["containers"][0]["image"] for s in sts] == [release.image_ref]
        hooks = [
            m
            for m in pulled_events(cluster, CHECK_NS)
            if release.image_ref in m  # the hook pod on the real node (kwok pods pull nothing)
        ]
        assert hooks, pulled_events(cluster, CHECK_NS)
        status = release_status(cluster, CHECK_RELEASE, CHECK_NS)
        assert status is not None and status["info"]["status"] == "deployed"
    finally:
        cluster.helm("uninstall", CHECK_RELEASE, "-n", CHECK_NS, "--ignore-not-found", "--wait", check=False)
        cluster.kubectl("delete", "namespace", CHECK_NS, "--wait=false", "--ignore-not-found", check=False)
        cluster.helm("uninstall", RELEASE, "-n", SYSTEM_NS, "--ignore-not-found", "--wait", check=False)


@contextmanager
def no_control_plane_node(cluster: Cluster) -> Iterator[None]:
    """A cluster as EKS, GKE or AKS show it: no node is a control-plane node. The real node loses
    its control-plane role label and taint, and the kwok nodes (which run nothing) are cordoned,
    so the real node is the only worker a pod can really run on. All given back after."""
    label, taint = "node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/control-plane:NoSchedule"
    cluster.kubectl("label", "node", NODE_NAME, f"{label}-")
    cluster.kubectl("taint", "node", NODE_NAME, f"{taint}-")
    cluster.kubectl("cordon", *KWOK_NODES)
    try:
        nodes = json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
        assert not [n for n in nodes if label in n["metadata"]["labels"]]
        yield
    finally:
        cluster.kubectl("uncordon", *KWOK_NODES, check=False)
        cluster.kubectl("label", "node", NODE_NAME, "--overwrite", f"{label}=", check=False)
        cluster.kubectl("taint", "node", NODE_NAME, taint, "--overwrite", check=False)


def test_as_a_subchart_of_an_umbrella_chart_on_a_cluster_without_a_control_plane_node(
    node_cluster: Cluster, node_registry: Registry, current_release: Release, vacated: None, tmp_path: Path
) -> None:
    """A parent chart depends on ours from the registry and passes its own `global` (a pull
    secret, and a key of its own, which our schema lets through). With the chart's defaults,
    nothing requires a control-plane node: the scheduler runs, pulled by digest."""
    cluster, registry, release = node_cluster, node_registry, current_release
    chart = release.charts["gpu-scheduler"]
    parent = tmp_path / "platform"
    (parent / "templates").mkdir(parents=True)
    (parent / "Chart.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v2",
                "name": "platform",
                "version": "1.0.0",
                "dependencies": [
                    {
                        "name": "gpu-scheduler",
                        "version": chart.version,
                        "repository": chart.ref.rsplit("/", 1)[0],
                    }
                ],
            }
        )
    )
    (parent / "values.yaml").write_text(
        yaml.safe_dump({"global": {"imagePullSecrets": ["registry-credentials"], "environment": "test"}})
    )
    cluster.helm("dependency", "update", str(parent), "--plain-http")
    assert (parent / "charts" / f"gpu-scheduler-{chart.version}.tgz").is_file()
    auth = base64.b64encode(b"puller:unused").decode()
    config = json.dumps({"auths": {registry.host: {"auth": auth}}})
    cluster.kubectl("create", "namespace", SYSTEM_NS, check=False)
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/dockerconfigjson",
            "metadata": {"name": "registry-credentials", "namespace": SYSTEM_NS},
            "stringData": {".dockerconfigjson": config},
        }
    )
    selector = "app.kubernetes.io/instance=platform,app.kubernetes.io/component=scheduler"
    try:
        with no_control_plane_node(cluster):
            cluster.helm("install", "platform", str(parent), "-n", SYSTEM_NS, "--wait", "--timeout", "240s")
            wait_for(
                lambda: any(ready(p) for p in release_pods(cluster, SYSTEM_NS, selector)),
                timeout=120,
                what="the scheduler pod Ready",
            )
            pods = release_pods(cluster, SYSTEM_NS, selector)
            for pod in pods:
                spec = pod["spec"]
                assert "nodeSelector" not in spec or set(spec["nodeSelector"]) <= {"kubernetes.io/os"}, spec
                assert spec["imagePullSecrets"] == [{"name": "registry-credentials"}]
                preferred = spec["affinity"]["nodeAffinity"][
                    "preferredDuringSchedulingIgnoredDuringExecution"
                ]
                assert preferred[0]["preference"]["matchExpressions"][0]["key"] == (
                    "node-role.kubernetes.io/control-plane"
                )
            assert_pulled_by_digest(cluster, registry, release, pods)
    finally:
        cluster.helm("uninstall", "platform", "-n", SYSTEM_NS, "--ignore-not-found", "--wait", check=False)
        cluster.kubectl(
            "delete", "secret", "registry-credentials", "-n", SYSTEM_NS, "--ignore-not-found", check=False
        )
