"""The one Kubernetes client loader.

:func:`load_client` is how every product component (the scheduler, the
webhook's node cache, ``gpu-scheduler-check verify-release``) gets an
``ApiClient``. The configuration is looked for in this order:

1. the kubeconfig file the caller names (``--kubeconfig``, or the setting read
   from ``KUBECONFIG`` by the component's settings);
2. ``$KUBECONFIG`` (a user who sets it means it, in a pod too);
3. the pod's ServiceAccount (in-cluster), when ``KUBERNETES_SERVICE_HOST`` is set;
4. ``~/.kube/config`` when it exists;

and otherwise :class:`KubeConfigError` says which of them were tried.

The apiserver's errors are read with :mod:`kube_gpu_scheduler.kube.errors`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from kubernetes import client, config

IN_CLUSTER_ENV = "KUBERNETES_SERVICE_HOST"


class KubeConfigError(Exception):
    """No usable Kubernetes client configuration; the message says what was tried."""


def _source(kubeconfig: str | None, env: Mapping[str, str], fallbacks: bool) -> str | None:
    """The kubeconfig file to load, ``""`` for in-cluster; raises KubeConfigError when none applies."""
    if kubeconfig:
        return kubeconfig
    if fallbacks and env.get("KUBECONFIG"):
        return env["KUBECONFIG"]
    if env.get(IN_CLUSTER_ENV):
        return ""
    home = Path(os.path.expanduser("~/.kube/config"))
    if fallbacks and home.is_file():
        return str(home)
    why = "neither KUBECONFIG nor an in-cluster service account is available"
    raise KubeConfigError(why + (f", and {home} does not exist" if fallbacks else ""))


def load_client(
    kubeconfig: str | None = None,
    *,
    pool_size: int | None = None,
    user_agent: str | None = None,
    fallbacks: bool = True,
    env: Mapping[str, str] | None = None,
) -> client.ApiClient:
    """An ApiClient (see the module docstring for the order); raises KubeConfigError.

    ``fallbacks=False`` tries only ``kubeconfig`` and in-cluster (steps 1 and 3): for a
    component whose settings already read ``KUBECONFIG`` and that runs without API
    access rather than with a developer's own ``~/.kube/config``.
    ``pool_size`` bounds the connections kept open to the apiserver (the scheduler's
    watches, lease and workers share them); ``user_agent`` names the component in
    the apiserver's audit log.
    """
    env = os.environ if env is None else env
    source = _source(kubeconfig, env, fallbacks)
    configuration = client.Configuration()
    try:
        if source:
            config.load_kube_config(config_file=source, client_configuration=configuration)
        else:
            config.load_incluster_config(client_configuration=configuration)
    except (config.ConfigException, OSError, ValueError, TypeError) as err:
        where = f"kubeconfig {source}" if source else "in-cluster service account"
        raise KubeConfigError(f"cannot load the {where}: {type(err).__name__}: {err}") from err
    if pool_size is not None:
        configuration.connection_pool_maxsize = pool_size
    api = client.ApiClient(configuration)
    if user_agent:
        api.user_agent = user_agent
    return api
