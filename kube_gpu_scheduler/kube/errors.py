"""The apiserver's errors in a small vocabulary, with the Status it sent.

:func:`api_error` maps an exception to an :class:`ApiError` kind, so callers
test ``api_error(err) is ApiError.NOT_FOUND`` instead of ``err.status == 404``.
The kind comes from the HTTP status alone. :func:`api_status` keeps the rest of
the apiserver's answer, its ``Status`` object: ``reason`` tells the cases one code
covers apart (409 ``AlreadyExists`` on a create, ``Conflict`` on a stale
resourceVersion or a failed precondition; 410 ``Expired`` or ``Gone`` for a watch
or a continue token that is too old), and ``message`` says why in the apiserver's
words. A watch ERROR event carries the same Status: :func:`event_status` reads it.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException


class ApiError(enum.Enum):
    """What an apiserver answer (or its absence) means to a caller."""

    NOT_FOUND = "NotFound"  # 404: the object (or the version asked for) is gone
    CONFLICT = "Conflict"  # 409: exists already, a precondition or a resourceVersion failed
    GONE = "Gone"  # 410: the resourceVersion or continue token is too old: list again
    UNAUTHORIZED = "Unauthorized"  # 401: the credentials are refused
    FORBIDDEN = "Forbidden"  # 403: RBAC (or an admission policy) says no
    INVALID = "Invalid"  # 422: the body is refused
    TOO_MANY_REQUESTS = "TooManyRequests"  # 429: priority and fairness, retry later
    SERVER_ERROR = "ServerError"  # 5xx
    OTHER = "Other"  # any other HTTP status
    NO_ANSWER = "NoAnswer"  # not an apiserver answer: refused, timed out, TLS, a bug

    @property
    def denied(self) -> bool:
        """401 or 403: waiting will not change the answer."""
        return self in (ApiError.UNAUTHORIZED, ApiError.FORBIDDEN)


_BY_STATUS = {
    401: ApiError.UNAUTHORIZED,
    403: ApiError.FORBIDDEN,
    404: ApiError.NOT_FOUND,
    409: ApiError.CONFLICT,
    410: ApiError.GONE,
    422: ApiError.INVALID,
    429: ApiError.TOO_MANY_REQUESTS,
}

# Status reasons (metav1.StatusReason) the code tells apart.
ALREADY_EXISTS = "AlreadyExists"
EXPIRED = "Expired"


@dataclass(frozen=True)
class ApiStatus:
    """An apiserver answer, or its absence (``code`` None, kind NO_ANSWER).

    ``reason`` is the Status's ``reason`` (``AlreadyExists``, ``Conflict``, ``NotFound``,
    ``Forbidden``, ``Expired``, ``TooManyRequests``, ``Invalid``...), ``""`` when the
    answer carried no Status; ``message`` is the Status's message, else a short text.
    """

    code: int | None
    reason: str
    message: str
    kind: ApiError

    @property
    def denied(self) -> bool:
        return self.kind.denied

    @property
    def already_exists(self) -> bool:
        """409 on a create: an object of that name exists (not a stale version or a precondition)."""
        return self.kind is ApiError.CONFLICT and self.reason == ALREADY_EXISTS

    def __str__(self) -> str:
        if self.code is None:
            return self.message
        return " ".join(str(p) for p in (self.code, self.reason, self.message and f"({self.message})") if p)


def status_kind(code: Any) -> ApiError:
    """The kind of an HTTP status code (an ApiException's, or a watch ERROR event's ``code``)."""
    if not isinstance(code, int):
        return ApiError.NO_ANSWER
    if code in _BY_STATUS:
        return _BY_STATUS[code]
    return ApiError.SERVER_ERROR if code >= 500 else ApiError.OTHER


def api_error(err: BaseException) -> ApiError:
    """The kind of ``err``: :attr:`ApiError.NO_ANSWER` for anything not an apiserver answer."""
    if isinstance(err, ApiException):
        return status_kind(err.status)
    return ApiError.NO_ANSWER


def _status_body(err: ApiException) -> Mapping[str, Any]:
    """The Status object an ApiException's body holds, ``{}`` when it holds none."""
    try:
        body = json.loads(err.body or "")
    except (ValueError, TypeError):
        return {}
    return body if isinstance(body, dict) else {}


def event_status(obj: Mapping[str, Any]) -> ApiStatus:
    """The Status a watch ERROR event carries (``{"type": "ERROR", "object": <Status>}``)."""
    code = obj.get("code")
    code = code if isinstance(code, int) else None
    return ApiStatus(
        code,
        str(obj.get("reason") or ""),
        str(obj.get("message") or ""),
        status_kind(code),
    )


def api_status(err: BaseException) -> ApiStatus:
    """``err`` as an :class:`ApiStatus`: the apiserver's code, reason and message when it answered."""
    if isinstance(err, ApiException):
        body = _status_body(err)
        message = str(body.get("message") or "") or str(err.reason or "")
        return ApiStatus(err.status, str(body.get("reason") or ""), message, status_kind(err.status))
    return ApiStatus(None, "", f"{type(err).__name__}: {err}", ApiError.NO_ANSWER)


def short_error(err: BaseException, limit: int = 300) -> str:
    """``403 Forbidden`` for an apiserver answer, else ``Type: text``, at most ``limit`` characters."""
    if isinstance(err, ApiException):
        return f"{err.status} {err.reason}"
    return f"{type(err).__name__}: {err}"[:limit]


def error_message(err: BaseException) -> str:
    """The apiserver's Status message when there is one, else :func:`short_error`'s text."""
    if isinstance(err, ApiException):
        message = _status_body(err).get("message")
        if message:
            return f"{err.status}: {message}"
        return f"{err.status} {err.reason}"
    return f"{type(err).__name__}: {err}"
