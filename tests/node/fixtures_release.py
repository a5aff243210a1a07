"""Releases pushed to a real OCI registry on this machine, for the real node to pull.

- ``registry``: the CNCF distribution registry (tools/provision.sh registry), plain HTTP on a
  loopback port, for the whole package; the real node's containerd is told about it
  (``RealNode.trust_registry``: a hosts.toml, as on any containerd node).
- ``current_release``: this tree released as its version (``make release``'s code,
  localcluster/publish.py): the image ``make image`` built (``product_image``) as linux/amd64
  and its arm64 build under one index, signed, with SBOMs attested (the local key of
  build/release-keys/).
- ``previous_release``: the previous release, PREVIOUS_RELEASE's tree (from git), its image
  built from its own Dockerfile and both its charts pushed the same way, as version N-1. Its
  image is kept in buildah's storage (``localhost/gpu-scheduler:release-<commit>``), so only
  the first run builds it (a few minutes).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcluster.cluster import Cluster
from localcluster.image import Image, buildah
from localcluster.publish import Release, build_tree_image, publish, tree_versions
from localcluster.registry import Registry
from localcluster.toolcache import REPO

# The previous release: the tree of this commit, released as its version (pyproject.toml's,
# 0.1.0). Bump it to the commit of the last release tag whenever one is made
# (`git rev-parse --short v<version>`); it must be an ancestor of main, and the checkout must
# have it (the CI test job clones the whole history, GIT_DEPTH 0; a shallow clone fails below,
# saying so).
PREVIOUS_RELEASE = "319fe1c"


def _git(*args: str, **kw: object) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(REPO), *args], check=False, capture_output=True, **kw)  # type: ignore[call-overload, no-any-return]


def previous_tree(out: Path) -> Path:
    """PREVIOUS_RELEASE's tree, extracted from git into ``out``."""
    have = f"{PREVIOUS_RELEASE}^{{commit}}"
    if _git("cat-file", "-e", have).returncode != 0 and _git("remote").stdout.strip():
        # A shallow clone (CI's, a --depth 1 checkout): its remote has the history.
        _git("fetch", "--quiet", "--unshallow", timeout=300)
    if _git("cat-file", "-e", have).returncode != 0:
        shallow = _git("rev-parse", "--is-shallow-repository").stdout.decode().strip()
        pytest.fail(
            f"the previous release is commit {PREVIOUS_RELEASE}, which this checkout does not have "
            f"(shallow clone: {shallow}): fetch the whole history (`git fetch --unshallow`; in GitLab "
            "CI GIT_DEPTH: 0) or bump PREVIOUS_RELEASE in tests/node/fixtures_release.py"
        )
    archive = _git("archive", "--format=tar", PREVIOUS_RELEASE)
    assert archive.returncode == 0, archive.stderr
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True, timeout=120)
    return out


@pytest.fixture(scope="package")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with Registry.start(tmp_path_factory.mktemp("registry")) as reg:
        yield reg


@pytest.fixture(scope="package")
def node_registry(node_cluster: Cluster, registry: Registry) -> Registry:
    """The registry, with the real node's containerd told to pull from it over plain HTTP."""
    assert node_cluster.node is not None
    node_cluster.node.trust_registry(registry.host)
    return registry


@pytest.fixture(scope="package")
def current_release(
    registry: Registry, product_image: Image, tmp_path_factory: pytest.TempPathFactory
) -> Release:
    version = tree_versions(REPO)["pyproject.toml"]
    assert version
    # As `make release`: this tree's archives (amd64: product_image's, arm64: built or reused),
    # pushed as one index, signed and attested, verified back.
    return publish(version, registry.host, out=tmp_path_factory.mktemp("release"))


@pytest.fixture(scope="package")
def previous_release(registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> Release:
    tree = previous_tree(tmp_path_factory.mktemp("previous-release") / "tree")
    version = tree_versions(tree)["pyproject.toml"]
    assert version
    ref = f"localhost/gpu-scheduler:release-{PREVIOUS_RELEASE}"
    if buildah("inspect", "--type", "image", ref, check=False).returncode != 0:
        build_tree_image(tree, ref)
    return publish(
        version, registry.host, source=tree, local_image=ref, out=tmp_path_factory.mktemp("release-previous")
    )
