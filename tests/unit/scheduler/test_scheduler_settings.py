"""Settings: environment, flags over environment, validation."""

from __future__ import annotations

import dataclasses

import pytest

from kube_gpu_scheduler.scheduler.runtime.settings import Settings, SettingsError, load


def test_defaults() -> None:
    s = load([], {"POD_NAME": "sched-0"})
    assert s.scheduler_name == "gpu-scheduler"
    assert s.http_port == 8080
    assert s.leader_elect is True
    assert s.lease_name == "gpu-scheduler"
    assert s.lease_namespace == "default"
    assert (s.lease_duration, s.renew_deadline, s.retry_period) == (15.0, 10.0, 2.0)
    assert s.identity == "sched-0"
    assert s.kubeconfig is None
    assert s.log_level == "INFO"
    assert (s.backoff_initial, s.backoff_max) == (1.0, 60.0)


def test_identity_without_pod_name_is_hostname_and_pid() -> None:
    import os
    import socket

    assert load([], {}).identity == f"{socket.gethostname()}_{os.getpid()}"


def test_environment() -> None:
    env = {
        "GPU_SCHEDULER_NAME": "my-sched",
        "GPU_SCHEDULER_HTTP_PORT": "9090",
        "GPU_SCHEDULER_LEADER_ELECT": "false",
        "GPU_SCHEDULER_LEASE_NAME": "l",
        "POD_NAMESPACE": "gpu-system",
        "GPU_SCHEDULER_LOG_LEVEL": "debug",
        "KUBECONFIG": "/tmp/kc",
        "GPU_SCHEDULER_WORKERS": "8",
        "GPU_SCHEDULER_GC_MAX_DEFER": "0",
    }
    s = load([], env)
    assert s.scheduler_name == "my-sched"
    assert s.http_port == 9090
    assert s.leader_elect is False
    assert s.lease_name == "l"
    assert s.lease_namespace == "gpu-system"  # from POD_NAMESPACE
    assert s.log_level == "DEBUG"
    assert s.kubeconfig == "/tmp/kc"
    assert s.workers == 8
    assert s.gc_max_defer == 0
    assert load([], {}).gc_max_defer == 300


def test_explicit_lease_namespace_beats_pod_namespace() -> None:
    s = load([], {"POD_NAMESPACE": "a", "GPU_SCHEDULER_LEASE_NAMESPACE": "b"})
    assert s.lease_namespace == "b"


def test_flags_override_environment() -> None:
    s = load(
        ["--scheduler-name", "flagged", "--http-port", "0", "--leader-elect", "no", "--identity", "me"],
        {"GPU_SCHEDULER_NAME": "env", "GPU_SCHEDULER_HTTP_PORT": "1"},
    )
    assert (s.scheduler_name, s.http_port, s.leader_elect, s.identity) == ("flagged", 0, False, "me")


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"GPU_SCHEDULER_HTTP_PORT": "http"}, "not a valid int"),
        ({"GPU_SCHEDULER_HTTP_PORT": "70000"}, "between 0 and 65535"),
        ({"GPU_SCHEDULER_LEADER_ELECT": "maybe"}, "not a boolean"),
        ({"GPU_SCHEDULER_RENEW_DEADLINE": "20"}, "renew deadline < lease duration"),
        ({"GPU_SCHEDULER_RETRY_PERIOD": "0"}, "0 < retry period"),
        ({"GPU_SCHEDULER_LOG_LEVEL": "loud"}, "log level"),
        ({"GPU_SCHEDULER_WORKERS": "0"}, "workers"),
        ({"GPU_SCHEDULER_GC_MAX_DEFER": "-1"}, "gc max defer must not be negative"),
        ({"GPU_SCHEDULER_BACKOFF_INITIAL": "90"}, "backoff"),
    ],
)
def test_invalid_values_are_refused_with_the_name(env: dict[str, str], words: str) -> None:
    with pytest.raises(SettingsError, match=words):
        load([], env)


def test_settings_are_frozen() -> None:
    s = load([], {})
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.http_port = 1  # type: ignore[misc]
    assert isinstance(s, Settings)
