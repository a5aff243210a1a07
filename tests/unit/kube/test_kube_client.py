"""kube_gpu_scheduler.kube.client and .errors: the loader's order and the error vocabulary."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from kube_gpu_scheduler.kube.client import KubeConfigError, load_client
from kube_gpu_scheduler.kube.errors import ApiError, api_error, status_kind


def kubeconfig(path: Path, server: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return str(path)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def host(api: object) -> str:
    return api.configuration.host  # type: ignore[attr-defined]


def test_explicit_kubeconfig_wins(tmp_path: Path, home: Path) -> None:
    explicit = kubeconfig(tmp_path / "a", "https://127.0.0.1:1001")
    env = {"KUBECONFIG": kubeconfig(tmp_path / "b", "https://127.0.0.1:1002"), "KUBERNETES_SERVICE_HOST": "x"}
    assert host(load_client(explicit, env=env)) == "https://127.0.0.1:1001"


def test_env_kubeconfig_then_home(tmp_path: Path, home: Path) -> None:
    env = {"KUBECONFIG": kubeconfig(tmp_path / "b", "https://127.0.0.1:1002")}
    assert host(load_client(None, env=env)) == "https://127.0.0.1:1002"
    kubeconfig(home / ".kube" / "config", "https://127.0.0.1:1003")
    assert host(load_client(None, env={})) == "https://127.0.0.1:1003"
    # without fallbacks neither $KUBECONFIG nor ~/.kube/config is read
    with pytest.raises(KubeConfigError, match="neither KUBECONFIG nor an in-cluster service account"):
        load_client(None, env=env, fallbacks=False)


def test_nothing_configured_is_a_clear_error(home: Path) -> None:
    with pytest.raises(KubeConfigError, match=r"neither KUBECONFIG .* and .*\.kube/config does not exist"):
        load_client(None, env={})


def test_in_cluster_without_a_token_names_the_source(home: Path) -> None:
    with pytest.raises(KubeConfigError, match="cannot load the in-cluster service account"):
        load_client(None, env={"KUBERNETES_SERVICE_HOST": "10.0.0.1"})


def test_unreadable_kubeconfig_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match=f"cannot load the kubeconfig {tmp_path}/missing"):
        load_client(str(tmp_path / "missing"), env={})


def test_pool_size_and_user_agent(tmp_path: Path) -> None:
    api = load_client(
        kubeconfig(tmp_path / "a", "https://127.0.0.1:1"), pool_size=7, user_agent="me/1", env={}
    )
    assert api.configuration.connection_pool_maxsize == 7
    assert api.user_agent == "me/1"


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (404, ApiError.NOT_FOUND),
        (409, ApiError.CONFLICT),
        (410, ApiError.GONE),
        (401, ApiError.UNAUTHORIZED),
        (403, ApiError.FORBIDDEN),
        (422, ApiError.INVALID),
        (429, ApiError.TOO_MANY_REQUESTS),
        (500, ApiError.SERVER_ERROR),
        (503, ApiError.SERVER_ERROR),
        (400, ApiError.OTHER),
    ],
)
def test_api_error_kinds(status: int, kind: ApiError) -> None:
    assert api_error(ApiException(status=status)) is kind
    assert status_kind(status) is kind


def test_not_an_api_answer() -> None:
    assert api_error(ConnectionRefusedError()) is ApiError.NO_ANSWER
    assert api_error(ApiException(status=None)) is ApiError.NO_ANSWER
    assert status_kind("410") is ApiError.NO_ANSWER


def test_denied() -> None:
    assert {k for k in ApiError if k.denied} == {ApiError.UNAUTHORIZED, ApiError.FORBIDDEN}
