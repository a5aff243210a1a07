"""kube_gpu_scheduler.kube.errors: the apiserver's Status (code, reason, message) kept, not only the code."""

from __future__ import annotations

import json

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from kube_gpu_scheduler.kube.errors import (
    ApiError,
    ApiStatus,
    api_error,
    api_status,
    error_message,
    event_status,
)
from tests.support.kubeapi import status


def status_body(code: int, reason: str, message: str, **details: object) -> str:
    return json.dumps(status(code, reason, message, **details))


def answer(code: int, http_reason: str, body: str | None) -> ApiException:
    err = ApiException(status=code, reason=http_reason)
    err.body = body
    return err


CASES = [
    (
        answer(
            409,
            "Conflict",
            status_body(409, "AlreadyExists", 'pods "w-0" already exists', name="w-0", kind="pods"),
        ),
        ApiStatus(409, "AlreadyExists", 'pods "w-0" already exists', ApiError.CONFLICT),
    ),
    (
        answer(
            409,
            "Conflict",
            status_body(
                409,
                "Conflict",
                'Operation cannot be fulfilled on leases.coordination.k8s.io "gpu-scheduler": the object '
                "has been modified; please apply your changes to the latest version and try again",
            ),
        ),
        ApiStatus(
            409,
            "Conflict",
            'Operation cannot be fulfilled on leases.coordination.k8s.io "gpu-scheduler": the object has '
            "been modified; please apply your changes to the latest version and try again",
            ApiError.CONFLICT,
        ),
    ),
    (
        answer(410, "Gone", status_body(410, "Expired", "too old resource version: 100 (200)")),
        ApiStatus(410, "Expired", "too old resource version: 100 (200)", ApiError.GONE),
    ),
    (
        answer(
            403,
            "Forbidden",
            status_body(
                403,
                "Forbidden",
                'nodes is forbidden: User "system:serviceaccount:gs:webhook" cannot list resource "nodes"',
            ),
        ),
        ApiStatus(
            403,
            "Forbidden",
            'nodes is forbidden: User "system:serviceaccount:gs:webhook" cannot list resource "nodes"',
            ApiError.FORBIDDEN,
        ),
    ),
    (
        answer(404, "Not Found", status_body(404, "NotFound", 'pods "w-0" not found')),
        ApiStatus(404, "NotFound", 'pods "w-0" not found', ApiError.NOT_FOUND),
    ),
    (
        answer(422, "Unprocessable Entity", status_body(422, "Invalid", 'Binding "w-0" is invalid')),
        ApiStatus(422, "Invalid", 'Binding "w-0" is invalid', ApiError.INVALID),
    ),
    (
        answer(429, "Too Many Requests", status_body(429, "TooManyRequests", "too many requests")),
        ApiStatus(429, "TooManyRequests", "too many requests", ApiError.TOO_MANY_REQUESTS),
    ),
    (
        answer(503, "Service Unavailable", status_body(503, "ServiceUnavailable", "etcd is down")),
        ApiStatus(503, "ServiceUnavailable", "etcd is down", ApiError.SERVER_ERROR),
    ),
    # No Status in the body (a proxy's answer, or none at all): the HTTP reason phrase is the message.
    (
        answer(502, "Bad Gateway", "<html>bad gateway</html>"),
        ApiStatus(502, "", "Bad Gateway", ApiError.SERVER_ERROR),
    ),
    (answer(401, "Unauthorized", None), ApiStatus(401, "", "Unauthorized", ApiError.UNAUTHORIZED)),
    (answer(418, "I'm a teapot", "[1, 2]"), ApiStatus(418, "", "I'm a teapot", ApiError.OTHER)),
]


@pytest.mark.parametrize(("err", "expected"), CASES)
def test_api_status_keeps_the_status(err: ApiException, expected: ApiStatus) -> None:
    status = api_status(err)
    assert status == expected
    # api_error's answer is the kind, read from the HTTP status alone, as before.
    assert api_error(err) is status.kind
    assert status.denied is (status.code in (401, 403))


def test_already_exists_is_told_from_a_conflict() -> None:
    created = api_status(answer(409, "Conflict", status_body(409, "AlreadyExists", "exists")))
    stale = api_status(answer(409, "Conflict", status_body(409, "Conflict", "modified")))
    assert created.already_exists and not stale.already_exists
    assert created.kind is stale.kind is ApiError.CONFLICT


@pytest.mark.parametrize(
    "err",
    [
        urllib3.exceptions.MaxRetryError(None, "/api/v1/nodes", "refused"),  # type: ignore[arg-type]
        urllib3.exceptions.ProtocolError("Connection broken"),
        TimeoutError("timed out"),
        ConnectionRefusedError(111, "Connection refused"),
    ],
)
def test_no_answer_has_no_code_and_says_what_happened(err: BaseException) -> None:
    status = api_status(err)
    assert status.code is None and status.reason == "" and status.kind is ApiError.NO_ANSWER
    assert status.message.startswith(type(err).__name__ + ": ")
    assert str(status) == status.message
    assert not status.denied


def test_a_watch_error_event_carries_the_same_status() -> None:
    obj = json.loads(status_body(410, "Expired", "too old resource version: 5 (9)"))
    assert event_status(obj) == ApiStatus(410, "Expired", "too old resource version: 5 (9)", ApiError.GONE)
    assert event_status({}) == ApiStatus(None, "", "", ApiError.NO_ANSWER)


def test_str_and_error_message_read_well() -> None:
    err = answer(409, "Conflict", status_body(409, "AlreadyExists", 'pods "w-0" already exists'))
    assert str(api_status(err)) == '409 AlreadyExists (pods "w-0" already exists)'
    assert error_message(err) == '409: pods "w-0" already exists'
