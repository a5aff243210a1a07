"""The webhook's Flask application: ``create_app(settings)``.

Routes: ``POST /mutate`` (Pods), ``POST /validate`` (StatefulSets),
``GET /healthz`` (the process answers), ``GET /readyz`` (the serving
certificate and key load) and ``GET /metrics`` (Prometheus text). Every answer
but ``/metrics`` is JSON.

With ``WEBHOOK_CLIENT_CA_FILE`` set, ``/mutate`` and ``/validate`` answer 403 unless
the server (kube_gpu_scheduler/webhook/serve.py) put ``webhook.client_verified`` = True in the WSGI
environ: the TLS client presented a certificate that verified against that CA.

HTTP status codes:

* 200: an AdmissionReview answer, allowed or denied (a denial carries
  ``response.status.code`` 400 or 403 and a message for the user);
* 400, 413, 415: the request is not an AdmissionReview this webhook can answer;
  the body says why and, when the request's uid could be read, is an
  AdmissionReview echoing it;
* 500: a bug in the webhook. The body is still an AdmissionReview echoing the
  uid when known, with ``status.code`` 500; the apiserver treats the call as
  failed and applies the configuration's ``failurePolicy``.
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import Callable
from typing import Any

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from kube_gpu_scheduler.kube import tls
from kube_gpu_scheduler.webhook import serving_stats
from kube_gpu_scheduler.webhook.mutate import admit_pod
from kube_gpu_scheduler.webhook.nodes import NodeCache, NodeLookup
from kube_gpu_scheduler.webhook.review import (
    API_VERSION,
    KIND,
    BadRequest,
    Request,
    Verdict,
    parse_request,
    review,
    uid_of,
)
from kube_gpu_scheduler.webhook.settings import Settings
from kube_gpu_scheduler.webhook.tenancy import GrantsCache, GrantsLookup, tenancy_lookup
from kube_gpu_scheduler.webhook.validate import admit_statefulset

log = logging.getLogger("webhook.app")
_refusals = serving_stats.RateLimitedWarning(log)

ADMISSION_PATHS = ("/mutate", "/validate")

Handler = Callable[[Request], Verdict]


def _json(body: Any, status: int = 200) -> Response:
    return Response(json.dumps(body, separators=(",", ":")), status=status, mimetype="application/json")


def _error(code: int, message: str, uid: str | None = None) -> Response:
    """An error answer: an AdmissionReview echoing ``uid`` when there is one, else a small JSON object."""
    if uid:
        return _json(review(uid, Verdict.deny(code, message)), code)
    return _json({"code": code, "error": message}, code)


def _read_body(limit: int) -> bytes:
    """The request body, at most ``limit`` bytes; RequestEntityTooLarge beyond.

    A body of unknown length (chunked) is read to its end here, because werkzeug's
    own limit silently truncates it at the limit instead of refusing it.
    """
    length = request.content_length
    if length is not None:
        if length > limit:
            raise RequestEntityTooLarge(f"body of {length} bytes")
        return request.get_data(cache=False)
    if not request.environ.get("wsgi.input_terminated"):
        return b""  # the server cannot tell where the body ends: nothing is safe to read
    stream = request.environ["wsgi.input"]
    chunks: list[bytes] = []
    total = 0
    while chunk := stream.read(64 * 1024):
        total += len(chunk)
        if total > limit:
            raise RequestEntityTooLarge(f"chunked body of more than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def certs_loaded(settings: Settings) -> tuple[bool, str]:
    """Whether the serving certificate and key load (the same files gunicorn serves with)."""
    try:
        tls.server_context(settings.tls_cert_file, settings.tls_key_file)
    except (OSError, ssl.SSLError) as exc:
        return False, f"cannot load {settings.tls_cert_file} / {settings.tls_key_file}: {exc}"
    return True, "certificate and key loaded"


def create_app(
    settings: Settings, node_lookup: NodeLookup | None = None, grants: GrantsLookup | None = None
) -> Flask:
    """Build the app. ``node_lookup`` defaults to a watch cache of the nodes (optional API access);
    ``grants``, with ``WEBHOOK_TENANCY_GRANTS``, to a watch cache of the grants ConfigMap."""
    app = Flask("webhook")
    # Werkzeug enforces this while reading a body of unknown length, too (413).
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    nodes = node_lookup if node_lookup is not None else NodeCache(settings.kubeconfig)
    if grants is None:
        grants = tenancy_lookup(settings.kubeconfig, settings.tenancy_grants)
    if isinstance(grants, GrantsCache):
        grants_cache = grants

        @app.before_request
        def start_grants_cache() -> None:
            grants_cache.start()

    if isinstance(nodes, NodeCache):
        cache = nodes

        @app.before_request
        def start_node_cache() -> None:
            # In the worker, after gunicorn forked it; the first request (a probe) starts the watch.
            cache.start()

    def admit(handler: Handler) -> Response:
        if request.mimetype != "application/json":
            return _error(415, f"Content-Type must be application/json, got {request.mimetype or 'none'!r}")
        try:
            raw = _read_body(settings.max_body_bytes)
        except RequestEntityTooLarge as exc:
            return _error(
                413, f"{exc.description}: larger than WEBHOOK_MAX_BODY_BYTES={settings.max_body_bytes}"
            )
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            return _error(400, f"malformed JSON: {str(exc)[:200]}")
        uid = uid_of(body)
        try:
            req = parse_request(body)
            verdict = handler(req)
        except BadRequest as exc:
            log.info("bad request: %s", exc.message, extra={"uid": exc.uid, "path": request.path})
            return _error(exc.code, exc.message, exc.uid)
        except Exception as exc:
            log.exception("internal error answering %s", request.path, extra={"uid": uid})
            return _error(500, f"internal error in the gpu-scheduler webhook: {type(exc).__name__}", uid)
        return _json(review(req.uid, verdict))

    @app.before_request
    def require_client_certificate() -> Response | None:
        if not settings.client_ca_file or request.path not in ADMISSION_PATHS:
            return None
        if request.environ.get("webhook.client_verified") is True:
            return None
        serving_stats.client_cert_refused()
        _refusals.warn(
            "client_certificate",
            f"refused {request.path}: no client certificate signed by WEBHOOK_CLIENT_CA_FILE",
            path=request.path,
            peer=request.remote_addr,
        )
        return _error(
            403, f"{request.path} needs a client certificate signed by the CA in WEBHOOK_CLIENT_CA_FILE"
        )

    @app.post("/mutate")
    def mutate() -> Response:
        return admit(lambda req: admit_pod(req, settings, grants))

    @app.post("/validate")
    def validate() -> Response:
        return admit(lambda req: admit_statefulset(req, settings, nodes, grants))

    @app.get("/healthz")
    def healthz() -> Response:
        log.debug("probe", extra={"path": "/healthz", "status": 200})
        return _json({"status": "ok"})

    @app.get("/readyz")
    def readyz() -> Response:
        ok, why = certs_loaded(settings)
        log.debug("probe", extra={"path": "/readyz", "status": 200 if ok else 503, "reason": why})
        return _json({"status": "ready" if ok else "not ready", "reason": why}, 200 if ok else 503)

    @app.get("/metrics")
    def metrics() -> Response:
        body, content_type = serving_stats.render()
        return Response(body, status=200, content_type=content_type)

    @app.after_request
    def count(response: Response) -> Response:
        if request.path not in ("/healthz", "/readyz", "/metrics"):
            serving_stats.answered(request.path, response.status_code)
        return response

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Response:
        code = exc.code or 500
        return _error(code, exc.description or exc.name)

    @app.errorhandler(Exception)
    def unexpected(exc: Exception) -> Response:
        log.exception("internal error on %s", request.path)
        return _error(500, f"internal error in the gpu-scheduler webhook: {type(exc).__name__}")

    log.debug(
        "app created",
        extra={
            "api_version": API_VERSION,
            "kind": KIND,
            "injection_mode": settings.injection_mode,
            "gpu_resource_policy": settings.gpu_resource_policy,
        },
    )
    return app
