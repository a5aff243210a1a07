"""The HTTP surface of the webhook app: bad input is 4xx with a message (never a 500), uid echoed, probes."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import kube_gpu_scheduler.webhook.app
from kube_gpu_scheduler.webhook.app import create_app
from kube_gpu_scheduler.webhook.settings import Settings, SettingsError
from localcluster.admission import admission_review, mapped_pod

REPO = Path(__file__).resolve().parents[3]
# Mapped pods of other schedulers are left alone: these are the GPU scheduler's.
SCHED = "gpu-scheduler"


class NoNodes:
    def get(self, name: str) -> None:
        return None


def client(**overrides: Any) -> Any:
    return create_app(Settings(**overrides), node_lookup=NoNodes()).test_client()


def pod_review(uid: str = "uid-h", **request: Any) -> dict[str, Any]:
    body = admission_review(mapped_pod("w-0", "0=node1:0", scheduler=SCHED), uid=uid)
    body["request"].update(request)
    return body


def test_wrong_content_type_is_415() -> None:
    resp = client().post("/mutate", data=json.dumps(pod_review()), content_type="text/plain")
    assert resp.status_code == 415
    assert "application/json" in resp.get_json()["error"]


def test_json_with_charset_is_accepted() -> None:
    resp = client().post(
        "/mutate", data=json.dumps(pod_review()), content_type="application/json; charset=utf-8"
    )
    assert resp.status_code == 200
    assert resp.get_json()["response"]["allowed"] is True


def test_oversized_body_is_413() -> None:
    body = json.dumps(pod_review()).encode()
    resp = client(max_body_bytes=len(body) - 1).post("/mutate", data=body, content_type="application/json")
    assert resp.status_code == 413
    assert "WEBHOOK_MAX_BODY_BYTES" in resp.get_json()["error"]


def test_oversized_body_without_a_length_is_413() -> None:
    # A chunked request: no Content-Length, the limit is enforced while reading (gunicorn marks the
    # stream terminated, as here).
    body = json.dumps(pod_review()).encode() + b" " * 5000
    resp = client(max_body_bytes=4096).post(
        "/mutate",
        input_stream=io.BytesIO(body),
        headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"},
        environ_overrides={"wsgi.input_terminated": True},
    )
    assert resp.status_code == 413
    assert "WEBHOOK_MAX_BODY_BYTES" in resp.get_json()["error"]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{not json", "malformed JSON"),
        (b"\xff\xfe\x00", "malformed JSON"),
        (b"[" * 100_000, "malformed JSON"),
        (b"", "malformed JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}', "has no 'request' object"),
    ],
)
def test_malformed_bodies_are_400(data: bytes, message: str) -> None:
    for path in ("/mutate", "/validate"):
        resp = client().post(path, data=data, content_type="application/json")
        assert resp.status_code == 400, (path, resp.get_data(as_text=True))
        assert message in resp.get_json()["error"]


def test_missing_uid_is_400() -> None:
    body = pod_review()
    del body["request"]["uid"]
    resp = client().post("/mutate", json=body)
    assert resp.status_code == 400
    assert "request.uid is missing" in resp.get_json()["error"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"apiVersion": "admission.k8s.io/v1beta1"}, "admissionReviewVersions: [v1]"),
        ({"kind": "Pod"}, "expected kind 'AdmissionReview'"),
    ],
)
def test_wrong_review_version_or_kind_is_400_and_echoes_uid(change: dict[str, str], message: str) -> None:
    body = {**pod_review("uid-echo"), **change}
    resp = client().post("/mutate", json=body)
    assert resp.status_code == 400
    out = resp.get_json()
    assert out["apiVersion"] == "admission.k8s.io/v1" and out["kind"] == "AdmissionReview"
    assert out["response"]["uid"] == "uid-echo"
    assert out["response"]["allowed"] is False
    assert out["response"]["status"]["code"] == 400
    assert message in out["response"]["status"]["message"]


def test_wrong_resource_kind_is_400_and_echoes_uid() -> None:
    body = pod_review("uid-k", kind={"group": "apps", "version": "v1", "kind": "StatefulSet"})
    resp = client().post("/mutate", json=body)
    assert resp.status_code == 400
    assert resp.get_json()["response"]["uid"] == "uid-k"
    assert (
        "/mutate admits v1 Pods, got apps/v1 StatefulSet" in resp.get_json()["response"]["status"]["message"]
    )


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"metadata": [], "spec": {}}, "metadata must be an object"),
        ({"metadata": {"name": "w-0", "labels": {"a": 1}}}, "metadata.labels['a'] must be a string"),
        (
            {"metadata": {"name": "w-0", "annotations": {"gpu-scheduling-map": 7}}},
            "metadata.annotations['gpu-scheduling-map'] must be a string",
        ),
        (
            {
                "metadata": {"annotations": {"gpu-scheduling-map": "0=n:0"}},
                "spec": {"schedulerName": SCHED, "containers": {}},
            },
            "must be a list",
        ),
        (
            {
                "metadata": {"annotations": {"gpu-scheduling-map": "0=n:0"}},
                "spec": {"schedulerName": SCHED, "containers": ["x"]},
            },
            "spec.containers[0] must be an object",
        ),
        (
            {
                "metadata": {"annotations": {"gpu-scheduling-map": "0=n:0"}},
                "spec": {"schedulerName": SCHED, "containers": [{"env": [3]}]},
            },
            "spec.containers[0].env[0] must be an object with a name",
        ),
        (
            {
                "metadata": {"annotations": {"gpu-scheduling-map": "0=n:0"}},
                "spec": {"schedulerName": SCHED, "containers": [{"resources": {"limits": "lots"}}]},
            },
            "spec.containers[0].resources.limits must be an object",
        ),
        ("a string", "request.object must be an object"),
    ],
)
def test_wrong_object_shapes_are_400_not_500(obj: Any, message: str) -> None:
    resp = client().post("/mutate", json=pod_review("uid-s", object=obj))
    assert resp.status_code == 400, resp.get_data(as_text=True)
    out = resp.get_json()["response"]
    assert out["uid"] == "uid-s"
    assert message in out["status"]["message"]


def test_internal_error_is_a_500_admission_review_with_the_uid(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def boom(*args: Any) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(kube_gpu_scheduler.webhook.app, "admit_pod", boom)
    resp = client().post("/mutate", json=pod_review("uid-500"))
    assert resp.status_code == 500
    out = resp.get_json()
    assert out["kind"] == "AdmissionReview"
    assert out["response"] == {
        "uid": "uid-500",
        "allowed": False,
        "status": {
            "code": 500,
            "message": "internal error in the gpu-scheduler webhook: RuntimeError",
            "status": "Failure",
            "reason": "InternalError",
        },
    }
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.exc_info is not None and getattr(record, "uid", None) == "uid-500"


def test_unknown_paths_and_methods_answer_json() -> None:
    c = client()
    assert c.get("/nope").status_code == 404
    resp = c.get("/mutate")
    assert resp.status_code == 405
    assert resp.get_json()["code"] == 405


def test_healthz_is_always_ok() -> None:
    resp = client(tls_cert_file="/nonexistent", tls_key_file="/nonexistent").get("/healthz")
    assert resp.status_code == 200
    assert resp.get_json() == {"status": "ok"}


def test_readyz_follows_the_certificate(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="webhook")
    settings = {"tls_cert_file": str(tmp_path / "tls.crt"), "tls_key_file": str(tmp_path / "tls.key")}
    c = client(**settings)
    resp = c.get("/readyz")
    assert resp.status_code == 503
    assert "cannot load" in resp.get_json()["reason"]
    subprocess.run(
        [sys.executable, str(REPO / "generate-webhook-certs.py"), "--output-dir", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    assert c.get("/readyz").status_code == 200
    probes = [r for r in caplog.records if r.getMessage() == "probe"]
    assert len(probes) == 2 and all(r.levelno == logging.DEBUG for r in probes)


def test_settings_from_env_defaults_and_values() -> None:
    assert Settings.from_env({}) == Settings()
    s = Settings.from_env(
        {
            "WEBHOOK_PORT": "9443",
            "WEBHOOK_TLS_CERT_FILE": "/c",
            "WEBHOOK_TLS_KEY_FILE": "/k",
            "WEBHOOK_INJECTION_MODE": "NVIDIA",
            "WEBHOOK_GPU_RESOURCE_POLICY": "deny",
            "WEBHOOK_MAX_BODY_BYTES": "4096",
            "WEBHOOK_LOG_LEVEL": "debug",
            "KUBECONFIG": "/kc",
        }
    )
    assert s == Settings(9443, "/c", "/k", "nvidia", "deny", 4096, "DEBUG", "/kc")
    assert Settings.from_env({"WEBHOOK_INJECTION_MODE": "nvidia-cdi"}).runtime_class_name == "nvidia"
    assert Settings.from_env({"WEBHOOK_RUNTIME_CLASS_NAME": ""}).runtime_class_name == ""  # none given
    assert (
        Settings.from_env({"WEBHOOK_RUNTIME_CLASS_NAME": " nvidia-cdi "}).runtime_class_name == "nvidia-cdi"
    )
    with pytest.raises(AttributeError):
        s.port = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"WEBHOOK_PORT": "https"}, "WEBHOOK_PORT='https' is not an integer"),
        ({"WEBHOOK_PORT": "70000"}, "WEBHOOK_PORT=70000 is outside"),
        ({"WEBHOOK_INJECTION_MODE": "rocm"}, "choose one of cuda, nvidia"),
        ({"WEBHOOK_RUNTIME_CLASS_NAME": "Nvidia"}, "is not a valid RuntimeClass name"),
        ({"WEBHOOK_GPU_RESOURCE_POLICY": "ignore"}, "choose one of warn, deny"),
        ({"WEBHOOK_LOG_LEVEL": "loud"}, "WEBHOOK_LOG_LEVEL"),
    ],
)
def test_bad_settings_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message.replace("(", r"\(").replace("[", r"\[")):
        Settings.from_env(env)
