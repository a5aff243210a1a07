"""Helpers and fixtures for the Helm charts (registered by tests/conftest.py).

* ``render(chart, ...)``: ``helm template`` of a chart folder -> list of manifests
  (test hooks included); ``template(...)`` returns the raw CompletedProcess (for
  expected failures).
* ``ci_values(chart)``: the chart's ``ci/*-values.yaml`` scenarios.
* ``hook_commands(cluster, release, namespace)``: the ``helm test`` hook pods of an
  installed release, from ``helm get hooks``, as ``HookCommand`` (argv = command + args,
  env), so a test can run them as host processes; ``hook_commands_from_manifest``
  does the same for a rendered manifest.
* fixture ``helm_release``: installs charts with ``localcluster.release.install_chart``
  and uninstalls them after the test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from localcluster.release import install_chart, uninstall
from tests.support.charts import (  # noqa: F401 (re-exported for the integration tests)
    CHARTS,
    CHECK_CHART,
    HOOK_ANNOTATION,
    KUBE_VERSIONS,
    REPO,
    SCHEDULER_CHART,
    HookCommand,
    ci_values,
    find,
    helm_bin,
    hook_commands_from_manifest,
    is_hook,
    one,
    pod_spec,
    render,
    template,
)


def hook_commands(cluster: Any, release: str, namespace: str, hook: str = "test") -> list[HookCommand]:
    """The ``helm test`` commands of an installed release (``helm get hooks``)."""
    text = cluster.helm("get", "hooks", release, "--namespace", namespace).stdout
    return hook_commands_from_manifest(text, hook)


# ---------------------------------------------------------------- fixtures
@pytest.fixture
def helm_release(cluster: Any) -> Iterator[Callable[..., str]]:
    """``install(release, namespace, values, chart=..., wait=False, hooks=True)`` -> release name;
    every release installed through it is uninstalled after the test."""
    installed: list[tuple[str, str]] = []

    def install(
        release: str,
        namespace: str,
        values: Mapping[str, Any] | None = None,
        chart: str | Path = SCHEDULER_CHART,
        wait: bool = False,
        hooks: bool = True,
    ) -> str:
        installed.append((release, namespace))
        install_chart(cluster, release, namespace, dict(values or {}), chart, wait=wait, hooks=hooks)
        return release

    yield install
    for release, namespace in reversed(installed):
        uninstall(cluster, release, namespace)
