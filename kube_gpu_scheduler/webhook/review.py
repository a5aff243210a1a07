"""The AdmissionReview envelope (admission.k8s.io/v1): checking what arrives, shaping what leaves.

Everything here treats the body as untrusted input: a wrong shape raises
:class:`BadRequest` (HTTP 400 with a message), never a ``TypeError`` that
would become a 500.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"


class BadRequest(Exception):
    """The body is not something this webhook can answer; ``uid`` is echoed when it was readable."""

    def __init__(self, message: str, code: int = 400, uid: str | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.uid = uid


@dataclass(frozen=True)
class Verdict:
    """What a handler decided: allow (maybe with a JSONPatch) or deny with an HTTP-style code."""

    allowed: bool
    patch: Sequence[dict[str, Any]] = ()
    warnings: Sequence[str] = ()
    code: int | None = None
    message: str | None = None

    @classmethod
    def deny(cls, code: int, message: str, warnings: Sequence[str] = ()) -> Verdict:
        return cls(allowed=False, code=code, message=message, warnings=tuple(warnings))


@dataclass(frozen=True)
class Request:
    """The parts of ``AdmissionReview.request`` the handlers use, type-checked."""

    uid: str
    group: str
    version: str
    kind: str
    operation: str
    name: str
    namespace: str
    sub_resource: str
    object: dict[str, Any] | None
    dry_run: bool = False
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def gvk(self) -> str:
        return f"{self.group}/{self.version} {self.kind}" if self.group else f"{self.version} {self.kind}"


def uid_of(body: Any) -> str | None:
    """``request.uid`` if the body has a readable one, for echoing in error answers."""
    if isinstance(body, dict):
        request = body.get("request")
        if isinstance(request, dict):
            uid = request.get("uid")
            if isinstance(uid, str) and uid:
                return uid
    return None


def parse_request(body: Any) -> Request:
    """Check the envelope and return the request; raise BadRequest (400) on any wrong shape."""
    if not isinstance(body, dict):
        raise BadRequest(f"expected a JSON object (an {KIND}), got {type(body).__name__}")
    uid = uid_of(body)
    api_version = body.get("apiVersion")
    kind = body.get("kind")
    if kind != KIND:
        raise BadRequest(f"expected kind {KIND!r}, got {kind!r}", uid=uid)
    if api_version != API_VERSION:
        raise BadRequest(
            f"unsupported AdmissionReview apiVersion {api_version!r}: this webhook speaks {API_VERSION} "
            "only (set admissionReviewVersions: [v1] in the webhook configuration)",
            uid=uid,
        )
    request = body.get("request")
    if not isinstance(request, dict):
        raise BadRequest(f"{KIND} has no 'request' object", uid=uid)
    if uid is None:
        raise BadRequest(f"{KIND}.request.uid is missing or empty")
    gvk = request.get("kind")
    if not isinstance(gvk, dict):
        raise BadRequest("request.kind must be an object with group, version and kind", uid=uid)
    obj = request.get("object")
    if obj is not None and not isinstance(obj, dict):
        raise BadRequest("request.object must be an object", uid=uid)
    return Request(
        uid=uid,
        group=_str(gvk.get("group"), "request.kind.group", uid),
        version=_str(gvk.get("version"), "request.kind.version", uid),
        kind=_str(gvk.get("kind"), "request.kind.kind", uid),
        operation=_str(request.get("operation"), "request.operation", uid),
        name=_str(request.get("name"), "request.name", uid),
        namespace=_str(request.get("namespace"), "request.namespace", uid),
        sub_resource=_str(request.get("subResource"), "request.subResource", uid),
        object=obj,
        dry_run=request.get("dryRun") is True,
        raw=request,
    )


def _str(value: Any, where: str, uid: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadRequest(f"{where} must be a string, got {type(value).__name__}", uid=uid)
    return value


def review(uid: str, verdict: Verdict) -> dict[str, Any]:
    """The AdmissionReview answer for ``verdict``, echoing ``uid``."""
    response: dict[str, Any] = {"uid": uid, "allowed": verdict.allowed}
    if verdict.allowed and verdict.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(
            json.dumps(list(verdict.patch), separators=(",", ":")).encode()
        ).decode()
    if verdict.warnings:
        response["warnings"] = list(verdict.warnings)
    if verdict.code is not None or verdict.message is not None:
        status: dict[str, Any] = {}
        if verdict.code is not None:
            status["code"] = verdict.code
        if verdict.message is not None:
            status["message"] = verdict.message
        if not verdict.allowed:
            status["status"] = "Failure"
            status["reason"] = _REASONS.get(verdict.code or 0, "BadRequest")
        response["status"] = status
    return {"apiVersion": API_VERSION, "kind": KIND, "response": response}


_REASONS = {400: "BadRequest", 403: "Forbidden", 500: "InternalError"}


# Helpers for reading the object itself: a wrong type is the caller's fault (400).


def dict_at(parent: dict[str, Any], key: str, where: str, uid: str) -> dict[str, Any]:
    """``parent[key]`` as a dict; missing or null gives ``{}``."""
    value = parent.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadRequest(f"{where} must be an object, got {type(value).__name__}", uid=uid)
    return value


def list_at(parent: dict[str, Any], key: str, where: str, uid: str) -> list[Any] | None:
    """``parent[key]`` as a list; ``None`` when missing or null."""
    value = parent.get(key)
    if value is None:
        return None
    if not isinstance(value, list):
        raise BadRequest(f"{where} must be a list, got {type(value).__name__}", uid=uid)
    return value


def str_dict_at(parent: dict[str, Any], key: str, where: str, uid: str) -> dict[str, Any]:
    """A labels/annotations-style map: keys and values must be strings."""
    value = dict_at(parent, key, where, uid)
    for k, v in value.items():
        if not isinstance(v, str):
            raise BadRequest(f"{where}[{k!r}] must be a string, got {type(v).__name__}", uid=uid)
    return value
