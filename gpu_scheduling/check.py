"""``gpu-scheduler-check``: prove that a pod got the node and the GPUs its map names.

Subcommands (docs/dev-interfaces.md, docs/check.md):

* ``once``: run the checks from the environment, one JSON line per check, exit 0/1;
* ``serve``: the same every ``CHECK_INTERVAL_SECONDS``; ``/readyz`` answers 200
  while the last run matched and 503 (with the failing checks) while it did not;
* ``verify-release --namespace NS --selector SEL``: through the API, every
  selected pod is Running on its mapped node with the mapped env;
* ``http-get URL``: a small HTTP(S) probe for ``helm test`` pods.

Every check is logged as one JSON object with ``check``, ``expected``,
``actual``, ``ok`` (true, false, or null when skipped) and ``pod``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any

from gpu_scheduling import logs, nvml
from gpu_scheduling.argtypes import non_negative_float, non_negative_int
from gpu_scheduling.injection import INJECTION_MODES, desired_env
from gpu_scheduling.podinfo import POD_INDEX_LABEL, ordinal_of
from gpu_scheduling.schedmap import ANNOTATION, Entry, MapError, SchedulingMap, parse

log = logging.getLogger("gpu_scheduling.check")

MODES = INJECTION_MODES
_RESERVED = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}
EXIT_OK = 0
EXIT_MISMATCH = 1
EXIT_USAGE = 2


# --- settings ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """Everything the check reads from the environment, read once."""

    pod_name: str | None = None
    pod_namespace: str | None = None
    node_name: str | None = None
    pod_index: str | None = None
    map_text: str | None = None
    cuda_visible_devices: str | None = None
    cuda_device_order: str | None = None
    nvidia_visible_devices: str | None = None
    injection_mode: str = "cuda"
    interval_seconds: float = 30.0
    port: int = 8080
    log_level: str = "INFO"

    @property
    def pod(self) -> str:
        return f"{self.pod_namespace or '-'}/{self.pod_name or '-'}"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Raises ValueError naming the variable when a number is malformed."""

        def number(name: str, default: float, kind: Callable[[str], float]) -> float:
            raw = env.get(name, "").strip()
            if not raw:
                return default
            try:
                value = kind(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not a number") from None
            if value < 0:
                raise ValueError(f"{name}={raw!r} is negative")
            return value

        level = (env.get("CHECK_LOG_LEVEL") or "INFO").upper()
        if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ValueError(f"CHECK_LOG_LEVEL={level!r} is not a log level")
        return cls(
            pod_name=env.get("POD_NAME"),
            pod_namespace=env.get("POD_NAMESPACE"),
            node_name=env.get("NODE_NAME"),
            pod_index=env.get("POD_INDEX"),
            map_text=env.get("GPU_SCHEDULING_MAP"),
            cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
            cuda_device_order=env.get("CUDA_DEVICE_ORDER"),
            nvidia_visible_devices=env.get("NVIDIA_VISIBLE_DEVICES"),
            injection_mode=(env.get("GPU_INJECTION_MODE") or "cuda").strip().lower(),
            interval_seconds=max(1.0, number("CHECK_INTERVAL_SECONDS", 30.0, float)),
            port=int(number("CHECK_PORT", 8080, int)),
            log_level=level,
        )


# --- results -------------------------------------------------------------------------------------


@dataclass
class Result:
    """One check. ``ok`` is None when the check was skipped (``skipped`` says why)."""

    check: str
    expected: Any
    actual: Any
    ok: bool | None
    pod: str
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "expected": self.expected,
            "actual": self.actual,
            "ok": self.ok,
            "pod": self.pod,
            **self.extra,
        }


def passed(results: Sequence[Result]) -> bool:
    """True when no check failed (skipped checks do not fail a run)."""
    return bool(results) and all(r.ok is not False for r in results)


def log_result(result: Result, level: int | None = None) -> None:
    if level is None:
        level = logging.INFO if result.ok is not False else logging.WARNING
    verdict = {True: "passed", False: "FAILED", None: "skipped"}[result.ok]
    # logging refuses extra keys that name LogRecord attributes ("message", "name"...): suffix them.
    extra = {(f"{k}_" if k in _RESERVED else k): v for k, v in result.to_json().items()}
    log.log(level, f"check {result.check} {verdict}", extra=extra)


# --- the checks ----------------------------------------------------------------------------------


def expected_env(entry: Entry, mode: str) -> dict[str, str]:
    """The variables the webhook sets for ``entry`` in injection ``mode`` (gpu_scheduling.injection)."""
    return dict(desired_env(entry, "nvidia" if mode == "nvidia" else "cuda"))


def env_results(entry: Entry, mode: str, env: Mapping[str, str | None], pod: str) -> list[Result]:
    """One result per variable the mode requires: equal strings, nothing looser."""
    return [
        Result(f"env:{name}", want, env.get(name), env.get(name) == want, pod)
        for name, want in expected_env(entry, mode).items()
    ]


def map_results(settings: Settings) -> tuple[list[Result], Entry | None]:
    """The checks that need no GPU: map, ordinal, node, env. Returns the entry when one applies."""
    pod = settings.pod
    results: list[Result] = []
    if settings.injection_mode not in MODES:
        results.append(Result("mode", list(MODES), settings.injection_mode, False, pod))
    if settings.map_text is None:
        results.append(
            Result("map", "a valid map", None, False, pod, {"detail": "GPU_SCHEDULING_MAP is not set"})
        )
        return results, None
    try:
        smap: SchedulingMap = parse(settings.map_text)
    except MapError as err:
        results.append(
            Result(
                "map",
                "a valid map",
                settings.map_text,
                False,
                pod,
                {"problems": [str(p) for p in err.problems]},
            )
        )
        return results, None
    results.append(Result("map", "a valid map", smap.format().strip().replace("\n", "; "), True, pod))
    labels = {POD_INDEX_LABEL: settings.pod_index} if settings.pod_index is not None else {}
    ordinal = ordinal_of(settings.pod_name, labels)
    entry = smap.get(ordinal) if ordinal is not None else None
    results.append(
        Result(
            "ordinal",
            f"an entry for the pod's ordinal (POD_INDEX={settings.pod_index!r}, POD_NAME={settings.pod_name!r})",
            {"ordinal": ordinal, "entry": str(entry) if entry else None},
            entry is not None,
            pod,
        )
    )
    if entry is None:
        return results, None
    results.append(Result("node", entry.node, settings.node_name, settings.node_name == entry.node, pod))
    if settings.injection_mode in MODES:
        env = {
            "CUDA_VISIBLE_DEVICES": settings.cuda_visible_devices,
            "CUDA_DEVICE_ORDER": settings.cuda_device_order,
            "NVIDIA_VISIBLE_DEVICES": settings.nvidia_visible_devices,
        }
        results.extend(env_results(entry, settings.injection_mode, env, pod))
    return results, entry


def nvml_results(settings: Settings, entry: Entry | None, report: nvml.NvmlReport) -> list[Result]:
    """Report NVML's GPUs; compare them with the entry when there is one."""
    pod = settings.pod
    if not report.available:
        return [Result("nvml", None, None, None, pod, {"skipped": report.reason})]
    results = [Result("nvml", None, report.to_json(), not report.errors, pod)]
    if entry is None:
        return results
    isolated = settings.injection_mode == "nvidia" or settings.nvidia_visible_devices == entry.devices
    if isolated:
        # The container runtime exposes only the mapped GPUs: NVML must count exactly those.
        results.append(
            Result(
                "nvml:count",
                len(entry.gpus),
                report.count,
                report.count == len(entry.gpus),
                pod,
                {"why": "NVIDIA_VISIBLE_DEVICES isolates the mapped GPUs"},
            )
        )
    if settings.injection_mode == "cuda":
        # CUDA_VISIBLE_DEVICES holds physical indices: each must exist among NVML's GPUs.
        missing = [g for g in entry.gpus if g >= report.count]
        devices = [d.to_json() for g in entry.gpus if (d := report.by_index(g)) is not None]
        results.append(
            Result(
                "nvml:indices",
                list(entry.gpus),
                {"count": report.count, "missing": missing},
                not missing and len(devices) == len(entry.gpus),
                pod,
                {"devices": devices},
            )
        )
    return results


NvmlQuery = Callable[[], nvml.NvmlReport]


def run_checks(settings: Settings, nvml_query: NvmlQuery = nvml.query) -> list[Result]:
    """Every check, in order: mode, map, ordinal, node, env, NVML."""
    results, entry = map_results(settings)
    try:
        report = nvml_query()
    except Exception as err:  # a crash in the NVML bindings must not take the check down
        report = nvml.NvmlReport(True, errors=(f"NVML query failed: {err.__class__.__name__}: {err}",))
    results.extend(nvml_results(settings, entry, report))
    return results


# --- once / serve --------------------------------------------------------------------------------


def cmd_once(settings: Settings, nvml_query: NvmlQuery = nvml.query) -> int:
    results = run_checks(settings, nvml_query)
    for r in results:
        log_result(r)
    ok = passed(results)
    log.log(
        logging.INFO if ok else logging.ERROR,
        "placement matches the map" if ok else "placement does NOT match the map",
        extra={"pod": settings.pod, "ok": ok, "failed": [r.check for r in results if r.ok is False]},
    )
    return EXIT_OK if ok else EXIT_MISMATCH


class _State:
    """The last run's results, shared with the HTTP handler."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.results: list[Result] = []
        self.checked_at: float | None = None

    def set(self, results: list[Result]) -> bool | None:
        """Store a run; returns the previous verdict (None before the first run)."""
        with self.lock:
            before = passed(self.results) if self.checked_at is not None else None
            self.results = results
            self.checked_at = time.time()
            return before

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        with self.lock:
            results = list(self.results)
            checked_at = self.checked_at
        ok = checked_at is not None and passed(results)
        body: dict[str, Any] = {
            "ok": ok,
            "checked_at": checked_at,
            "failed": [r.to_json() for r in results if r.ok is False],
            "checks": [r.to_json() for r in results],
        }
        return ok, body


def _handler(state: _State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "gpu-scheduler-check"

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = (json.dumps(body, default=str) + "\n").encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path in ("/healthz", "/livez"):
                self._send(HTTPStatus.OK, {"ok": True})
            elif path == "/readyz":
                ok, body = state.readiness()
                self._send(HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE, body)
            elif path in ("/", "/checks"):
                _, body = state.readiness()
                self._send(HTTPStatus.OK, body)
            else:
                self._send(HTTPStatus.NOT_FOUND, {"error": f"no such path {path!r}"})

        do_HEAD = do_GET

        def log_message(self, format: str, *args: Any) -> None:
            # Probes arrive every few seconds: keep them at DEBUG.
            log.debug("http " + format % args, extra={"client": self.client_address[0]})

    return Handler


def _run_and_store(settings: Settings, state: _State, nvml_query: NvmlQuery) -> None:
    try:
        results = run_checks(settings, nvml_query)
    except Exception as err:
        log.exception("check run crashed", extra={"pod": settings.pod})
        results = [Result("run", "no crash", repr(err), False, settings.pod)]
    before = state.set(results)
    now = passed(results)
    changed = before is None or before != now
    for r in results:
        # Every check on the first run and whenever the verdict flips; DEBUG in between.
        log_result(r, None if changed else logging.DEBUG)
    if changed:
        log.log(
            logging.INFO if now else logging.ERROR,
            "ready: placement matches the map" if now else "NOT ready: placement does not match the map",
            extra={"pod": settings.pod, "ok": now, "failed": [r.check for r in results if r.ok is False]},
        )


def cmd_serve(settings: Settings, nvml_query: NvmlQuery = nvml.query) -> int:
    state = _State()
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("stopping", extra={"signal": signal.Signals(signum).name, "pod": settings.pod})
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    _run_and_store(settings, state, nvml_query)
    try:
        server = ThreadingHTTPServer(("", settings.port), _handler(state))
    except OSError as err:
        log.error("cannot listen", extra={"port": settings.port, "error": str(err), "pod": settings.pod})
        return EXIT_USAGE
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    thread.start()
    log.info(
        "serving",
        extra={
            "port": server.server_address[1],
            "interval_s": settings.interval_seconds,
            "pod": settings.pod,
        },
    )
    while not stop.wait(settings.interval_seconds):
        _run_and_store(settings, state, nvml_query)
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)
    return EXIT_OK


# --- verify-release ------------------------------------------------------------------------------


@dataclass
class PodRow:
    name: str
    ordinal: int | None
    phase: str
    node: str | None
    expected_node: str | None
    devices: str | None
    expected_devices: str | None
    ok: bool


def _api_client(kubeconfig: str | None) -> Any:
    from kubernetes import client, config

    cfg = client.Configuration()
    if kubeconfig or os.environ.get("KUBECONFIG"):
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    else:
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException:
            config.load_kube_config(client_configuration=cfg)
    return client.ApiClient(cfg)


def _container_env(container: Mapping[str, Any]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for var in container.get("env") or []:
        name = var.get("name")
        if name:
            # valueFrom is not what the webhook writes: it shows as None and fails the comparison.
            out[name] = var.get("value") if "valueFrom" not in var else None
    return out


def _detect_mode(env: Mapping[str, str | None], mode: str) -> str:
    if mode != "auto":
        return mode
    return "nvidia" if "NVIDIA_VISIBLE_DEVICES" in env else "cuda"


def _parse_or_none(text: str | None) -> SchedulingMap | None:
    if text is None:
        return None
    try:
        return parse(text)
    except MapError:
        return None


def _owner_of(pod: Mapping[str, Any]) -> str | None:
    """Name of the StatefulSet that controls ``pod``, if one does."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "StatefulSet" and ref.get("controller"):
            return str(ref.get("name"))
    return None


def _map_of(obj: Mapping[str, Any]) -> str | None:
    value = ((obj.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION)
    return value if isinstance(value, str) else None


def evaluate_release(
    pods: Sequence[Mapping[str, Any]],
    owners: Mapping[str, Mapping[str, Any] | None],
    namespace: str,
    mode: str = "auto",
    owner_errors: Mapping[str, str] | None = None,
) -> tuple[list[Result], list[PodRow]]:
    """Pure logic of verify-release: pods and their owning StatefulSets (by name) as API dicts."""
    results: list[Result] = []
    rows: list[PodRow] = []
    # A pod with no map and no owning StatefulSet is not part of the placement (the
    # `helm test` pod itself carries the release's labels): leave it out.
    placed = [p for p in pods if _owner_of(p) is not None or _map_of(p) is not None]
    for p in pods:
        if p not in placed:
            log.debug(
                "ignoring pod without a map",
                extra={"pod": f"{namespace}/{(p.get('metadata') or {}).get('name')}"},
            )
    pods = placed
    if not pods:
        results.append(Result("pods", "at least one pod with a map", 0, False, f"{namespace}/-"))
        return results, rows
    seen: dict[str, set[int]] = {}
    for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("name"))):
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        name = str(meta.get("name"))
        who = f"{meta.get('namespace') or namespace}/{name}"
        before = len(results)
        owner_name = _owner_of(pod)
        pod_text = _map_of(pod)
        owner = owners.get(owner_name) if owner_name else None
        if owner is not None:
            tmpl_meta = ((owner.get("spec") or {}).get("template") or {}).get("metadata") or {}
            want_text = (tmpl_meta.get("annotations") or {}).get(ANNOTATION)
            source = f"StatefulSet {owner_name}"
        else:
            want_text = pod_text
            source = "the pod's annotation"
        ordinal = ordinal_of(name, meta.get("labels"))
        if owner_name and ordinal is not None and not meta.get("deletionTimestamp"):
            seen.setdefault(owner_name, set()).add(ordinal)
        try:
            smap = parse(want_text) if isinstance(want_text, str) else None
        except MapError as err:
            results.append(
                Result("map", f"a valid map in {source}", want_text, False, who, {"detail": str(err)})
            )
            smap = None
        if smap is None:
            if len(results) == before:
                results.append(Result("map", f"a map in {source}", None, False, who))
            rows.append(
                PodRow(
                    name, ordinal, status.get("phase") or "?", spec.get("nodeName"), None, None, None, False
                )
            )
            continue
        if owner is not None:
            # A pod from an older revision still carries the older map: not converged yet.
            results.append(Result("pod:map", smap.format(), pod_text, _parse_or_none(pod_text) == smap, who))
        entry = smap.get(ordinal) if ordinal is not None else None
        results.append(
            Result(
                "ordinal",
                "an entry for the pod's ordinal",
                {"ordinal": ordinal, "entry": str(entry) if entry else None},
                entry is not None,
                who,
            )
        )
        phase = "Terminating" if meta.get("deletionTimestamp") else (status.get("phase") or "Pending")
        results.append(Result("phase", "Running", phase, phase == "Running", who))
        node = spec.get("nodeName")
        devices_shown: str | None = None
        if entry is not None:
            results.append(Result("node", entry.node, node, node == entry.node, who))
            for container in spec.get("containers") or []:
                env = _container_env(container)
                cmode = _detect_mode(env, mode)
                devices_shown = devices_shown or env.get("CUDA_VISIBLE_DEVICES")
                for r in env_results(entry, cmode, env, who):
                    r.extra.update({"container": container.get("name"), "mode": cmode})
                    results.append(r)
        ok = all(r.ok is not False for r in results[before:])
        rows.append(
            PodRow(
                name,
                ordinal,
                phase,
                node,
                entry.node if entry else None,
                devices_shown,
                entry.devices if entry else None,
                ok,
            )
        )
    for owner_name, owner in sorted(owners.items()):
        if owner is None:
            results.append(
                Result(
                    "statefulset",
                    f"StatefulSet {owner_name} readable",
                    (owner_errors or {}).get(owner_name),
                    False,
                    f"{namespace}/{owner_name}",
                    {"why": "its spec.replicas is the expected replica count"},
                )
            )
            continue
        spec = owner.get("spec") or {}
        replicas = spec.get("replicas", 1)
        start = (spec.get("ordinals") or {}).get("start", 0)
        want = list(range(start, start + replicas))
        have = sorted(seen.get(owner_name, set()))
        results.append(
            Result("replicas", want, have, have == want, f"{namespace}/{owner_name}", {"kind": "StatefulSet"})
        )
    return results, rows


def _print_rows(rows: Sequence[PodRow]) -> None:
    table = [("POD", "ORDINAL", "PHASE", "NODE", "WANT-NODE", "GPUS", "WANT-GPUS", "OK")]
    for r in rows:
        table.append(
            (
                r.name,
                "-" if r.ordinal is None else str(r.ordinal),
                r.phase,
                r.node or "-",
                r.expected_node or "-",
                r.devices or "-",
                r.expected_devices or "-",
                "yes" if r.ok else "NO",
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


@dataclass
class _Fetched:
    pods: list[dict[str, Any]]
    owners: dict[str, Mapping[str, Any] | None]
    owner_errors: dict[str, str]
    forbidden: bool  # a 401/403: waiting will not help


def _fetch_release(api: Any, core: Any, apps: Any, namespace: str, selector: str) -> _Fetched:
    """The selected pods and their owning StatefulSets, as API-shaped dicts (camelCase keys)."""
    from kubernetes.client.exceptions import ApiException

    pods: list[dict[str, Any]] = (
        api.sanitize_for_serialization(core.list_namespaced_pod(namespace, label_selector=selector)).get(
            "items"
        )
        or []
    )
    out = _Fetched(pods, {}, {}, forbidden=False)
    for pod in pods:
        for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
            name = ref.get("name")
            if ref.get("kind") != "StatefulSet" or not ref.get("controller") or name in out.owners:
                continue
            try:
                out.owners[name] = api.sanitize_for_serialization(
                    apps.read_namespaced_stateful_set(name, namespace)
                )
            except ApiException as err:
                out.owners[name] = None
                out.owner_errors[name] = (
                    f"{err.status} {err.reason}: get statefulsets.apps {namespace}/{name}"
                )
                out.forbidden = out.forbidden or err.status in (401, 403)
    return out


def cmd_verify_release(args: argparse.Namespace) -> int:
    from kubernetes.client import AppsV1Api, CoreV1Api
    from kubernetes.client.exceptions import ApiException

    try:
        api = _api_client(args.kubeconfig)
    except Exception as err:  # no kubeconfig, no in-cluster token, unreadable file...
        log.error(
            "cannot configure the Kubernetes client", extra={"error": f"{err.__class__.__name__}: {err}"}
        )
        return EXIT_USAGE
    core, apps = CoreV1Api(api), AppsV1Api(api)
    deadline = time.monotonic() + args.timeout
    ctx = {"namespace": args.namespace, "selector": args.selector}
    results: list[Result] = []
    rows: list[PodRow] = []
    while True:
        try:
            got = _fetch_release(api, core, apps, args.namespace, args.selector)
            results, rows = evaluate_release(
                got.pods, got.owners, args.namespace, args.mode, got.owner_errors
            )
            if got.forbidden:
                break  # permissions will not change while we wait
        except ApiException as err:
            results = [
                Result(
                    "api",
                    "pods listed",
                    f"{err.status} {err.reason}",
                    False,
                    f"{args.namespace}/-",
                    {"detail": (err.body or "")[:500] if isinstance(err.body, str) else None},
                )
            ]
            rows = []
            if err.status in (401, 403):
                break  # permissions will not change while we wait
        except Exception as err:  # connection refused while the apiserver restarts, and the like
            results = [
                Result("api", "pods listed", f"{err.__class__.__name__}: {err}", False, f"{args.namespace}/-")
            ]
            rows = []
        if passed(results) or time.monotonic() >= deadline:
            break
        failing = [f"{r.pod} {r.check}" for r in results if r.ok is False]
        log.info("waiting for the release to converge", extra={**ctx, "failing": failing[:20]})
        time.sleep(min(args.interval, max(0.0, deadline - time.monotonic())))
    for r in results:
        log_result(r)
    if rows:
        _print_rows(rows)
    ok = passed(results)
    log.log(
        logging.INFO if ok else logging.ERROR,
        "release matches its maps" if ok else "release does NOT match its maps",
        extra={**ctx, "ok": ok, "pods": len(rows)},
    )
    return EXIT_OK if ok else EXIT_MISMATCH


# --- http-get ------------------------------------------------------------------------------------


def cmd_http_get(args: argparse.Namespace) -> int:
    url: str = args.url
    if not url.startswith(("http://", "https://")):
        log.error("only http:// and https:// URLs", extra={"url": url})
        return EXIT_USAGE
    context = ssl.create_default_context(cafile=args.cafile) if url.startswith("https://") else None
    attempts = args.retries + 1
    for attempt in range(1, attempts + 1):
        actual: Any
        try:
            req = urllib.request.Request(url, method="GET")  # noqa: S310 - scheme checked above
            with urllib.request.urlopen(req, timeout=args.timeout, context=context) as resp:  # noqa: S310
                actual = resp.status
                resp.read(65536)
        except urllib.error.HTTPError as err:
            actual = err.code
        except (urllib.error.URLError, OSError, ValueError) as err:
            reason = getattr(err, "reason", err)
            actual = f"{err.__class__.__name__}: {reason}"
        ok = actual == args.expect
        result = Result(
            "http", args.expect, actual, ok, "-", {"url": url, "attempt": attempt, "of": attempts}
        )
        last = attempt == attempts
        log_result(result, logging.INFO if ok else (logging.ERROR if last else logging.WARNING))
        if ok:
            return EXIT_OK
        if not last:
            time.sleep(args.delay)
    return EXIT_MISMATCH


# --- entry point ---------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu-scheduler-check",
        description="Check that a pod runs on the node and with the GPUs its gpu-scheduling-map names.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("once", help="run the checks from the environment once; exit 0 match, 1 mismatch")
    sub.add_parser("serve", help="re-check every CHECK_INTERVAL_SECONDS; /readyz 200 match, 503 mismatch")
    v = sub.add_parser("verify-release", help="through the API: every selected pod placed as its map says")
    v.add_argument("--namespace", "-n", required=True)
    v.add_argument("--selector", "-l", required=True, help="label selector of the release's pods")
    v.add_argument(
        "--timeout", type=non_negative_float, default=120.0, help="seconds to wait for convergence"
    )
    v.add_argument("--interval", type=non_negative_float, default=2.0, help="seconds between attempts")
    v.add_argument(
        "--mode", choices=["auto", *MODES], default="auto", help="injection mode; auto: per container"
    )
    v.add_argument("--kubeconfig", help="default: $KUBECONFIG, else in-cluster, else ~/.kube/config")
    h = sub.add_parser("http-get", help="GET a URL and expect a status (helm test)")
    h.add_argument("url")
    h.add_argument("--cafile", help="CA bundle to verify an https:// server with")
    h.add_argument("--expect", type=int, default=200, help="status code wanted (default 200)")
    h.add_argument("--timeout", type=non_negative_float, default=5.0, help="seconds per attempt")
    h.add_argument("--retries", type=non_negative_int, default=3, help="attempts after the first")
    h.add_argument("--delay", type=non_negative_float, default=2.0, help="seconds between attempts")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = Settings.from_env(os.environ)
    except ValueError as err:
        logs.setup()
        log.error(f"bad environment: {err}")
        return EXIT_USAGE
    logs.setup(settings.log_level)
    if args.command == "once":
        return cmd_once(settings)
    if args.command == "serve":
        return cmd_serve(settings)
    if args.command == "verify-release":
        return cmd_verify_release(args)
    return cmd_http_get(args)


if __name__ == "__main__":
    sys.exit(main())
