"""``gpu-scheduler-check``: prove that a pod got the node and the GPUs its map names.

Subcommands (docs/dev-interfaces.md, docs/check.md):

* ``once``: run the checks from the environment, one JSON line per check, exit 0/1;
* ``serve``: the same every ``CHECK_INTERVAL_SECONDS``; ``/readyz`` answers 200
  while the last run matched and 503 (with the failing checks) while it did not;
* ``verify-release --namespace NS --selector SEL``: through the API, every
  selected pod is Running on its mapped node with the mapped env;
* ``wait-ready --namespace NS --map MAP``: wait until a scheduler holds its Lease and a
  server-side dry-run of a mapped pod comes back with its GPU variables (the check
  chart's first hook, before its StatefulSet exists);
* ``http-get URL``: a small HTTP(S) probe for ``helm test`` pods.

One module per program: ``once_serve.py`` (``once``, ``serve``; the checks
themselves in ``podcheck.py``), ``verify_release.py``, ``wait_ready.py``, ``probe.py``
(``http-get``) and ``cli.py`` (the command line); ``settings.py`` and
``results.py`` are shared; ``seen.py`` records what ``once``/``serve`` saw (UUID and
PCI bus ID per GPU index) for ``kubectl``.

Every check is logged as one JSON object with ``check``, ``expected``,
``actual``, ``ok`` (true, false, or null when skipped) and ``pod``.
"""

from __future__ import annotations

from kube_gpu_scheduler.check.cli import build_parser, main
from kube_gpu_scheduler.check.once_serve import _handler, _run_and_store, _State, cmd_once, cmd_serve
from kube_gpu_scheduler.check.podcheck import (
    NvmlQuery,
    env_results,
    expected_env,
    map_results,
    nvml_results,
    run_checks,
)
from kube_gpu_scheduler.check.probe import cmd_http_get
from kube_gpu_scheduler.check.results import EXIT_MISMATCH, EXIT_OK, EXIT_USAGE, Result, log_result, passed
from kube_gpu_scheduler.check.settings import MODES, Settings
from kube_gpu_scheduler.check.verify_release import PodRow, cmd_verify_release, evaluate_release
from kube_gpu_scheduler.check.wait_ready import cmd_wait_ready, injection_problem, lease_problem, probe_pod
from kube_gpu_scheduler.domain.injection import PCI_BUS_ID

__all__ = [
    "EXIT_MISMATCH",
    "EXIT_OK",
    "EXIT_USAGE",
    "MODES",
    "PCI_BUS_ID",
    "NvmlQuery",
    "PodRow",
    "Result",
    "Settings",
    "_State",
    "_handler",
    "_run_and_store",
    "build_parser",
    "cmd_http_get",
    "cmd_once",
    "cmd_serve",
    "cmd_verify_release",
    "cmd_wait_ready",
    "env_results",
    "evaluate_release",
    "expected_env",
    "injection_problem",
    "lease_problem",
    "log_result",
    "main",
    "map_results",
    "nvml_results",
    "passed",
    "probe_pod",
    "run_checks",
]
