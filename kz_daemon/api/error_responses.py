"""One place that turns failures into the JSON error body ``{"error": {code, message, details}}``.

``ZooError`` carries its own code and status. A failed disk write (``OSError``; the
event store's ``StorageError``) is answered ``503`` (``STORAGE_FULL`` for ENOSPC and
EDQUOT) with ``Retry-After``: the daemon goes on and the retry succeeds once the disk
takes writes again. Starlette's ``HTTPException`` (404
for an unknown path, 405 for a wrong method) is mapped to the same body. Anything
else is a bug: it is logged with its traceback on the server and answered as a
500 with a generic body; no stack trace or exception text ever reaches a client.
"""
from __future__ import annotations

import logging
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from kz_daemon.core.errors import ZooError
from kz_daemon.upkeep.health import RETRY_AFTER_S, storage_full
from kz_events.durable import FULL_ERRNOS
from kz_events.log.store import StorageError, StoreBroken

#: codes whose answers tell the client when to retry
RETRY_CODES = ("RATE_LIMITED", "STORAGE_FULL")
#: codes after which the connection is closed: part of the request may still be unread
CLOSE_CODES = ("REQUEST_TIMEOUT",)

log = logging.getLogger("kz_daemon.http")

_CODE_BY_STATUS = {
    400: "BAD_REQUEST", 401: "UNAUTHORIZED", 403: "FORBIDDEN", 404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED", 408: "REQUEST_TIMEOUT", 409: "CONFLICT", 413: "PAYLOAD_TOO_LARGE",
    415: "UNSUPPORTED_MEDIA_TYPE", 422: "RESULT_INVALID", 429: "RATE_LIMITED",
    503: "UNAVAILABLE",
}


def error_body(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """The error document every endpoint answers with."""
    return {"error": {"code": code, "message": message, "details": details or {}}}


def error_response(status: int, code: str, message: str, details: dict[str, Any] | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    """A JSON error response."""
    return JSONResponse(error_body(code, message, details), status_code=status, headers=headers)


async def zoo_error(request: Request, exc: Exception) -> Response:
    """ZooError → its status and body (429 and 503 STORAGE_FULL answers carry Retry-After)."""
    assert isinstance(exc, ZooError)
    headers = None
    retry = exc.details.get("retry_after_s") if isinstance(exc.details, dict) else None
    if exc.code in RETRY_CODES and retry is not None:
        headers = {"Retry-After": str(max(1, int(float(retry) + 0.999)))}
    if exc.code in CLOSE_CODES:
        headers = {**(headers or {}), "Connection": "close"}
    details = exc.details if isinstance(exc.details, dict) else {"detail": exc.details}
    return error_response(exc.http_status, exc.code, exc.message, details, headers)


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's HTTPException (unknown path, wrong method) → the same error body."""
    assert isinstance(exc, HTTPException)
    code = _CODE_BY_STATUS.get(exc.status_code, "HTTP_ERROR")
    if exc.status_code == 404:
        message = f"no such path: {request.url.path}; see /openapi.json for the API"
    elif exc.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}"
    else:
        message = str(exc.detail)
    return error_response(exc.status_code, code, message, {}, getattr(exc, "headers", None))


async def storage_error(request: Request, exc: Exception) -> Response:
    """A failed disk write (OSError, the store's StorageError) → 503; a full disk → STORAGE_FULL.

    Nothing was recorded and the daemon goes on: the store cuts its log back to the
    last durable line and the spool leaves no partial file, so the client can retry.
    Any other OSError is still a bug and answered as one.
    """
    assert isinstance(exc, OSError)
    if exc.errno in FULL_ERRNOS or getattr(exc, "full", False):
        log.warning("disk full on %s %s: %s", request.method, request.url.path, exc)
        return await zoo_error(request, storage_full("no space left on device"))
    if isinstance(exc, StorageError):
        log.error("event log write failed on %s %s: %s", request.method, request.url.path, exc)
        return error_response(503, "UNAVAILABLE", "the server could not write to its disk; nothing was "
                              "recorded: retry in a while", {"retry_after_s": RETRY_AFTER_S},
                              {"Retry-After": str(RETRY_AFTER_S)})
    return await internal_error(request, exc)


async def store_broken(request: Request, exc: Exception) -> Response:
    """The store refuses everything until the process restarts: 503, and /healthz says so."""
    log.error("event store broken on %s %s: %s", request.method, request.url.path, exc)
    return error_response(503, "UNAVAILABLE", "the server cannot record anything until its operator "
                          "restarts it; retry later", {"retry_after_s": RETRY_AFTER_S},
                          {"Retry-After": str(RETRY_AFTER_S)})


async def internal_error(request: Request, exc: Exception) -> Response:
    """Any other exception: log it here, answer 500 with nothing internal in the body."""
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "INTERNAL", "internal server error; the operator's log has the details")


EXCEPTION_HANDLERS = {
    ZooError: zoo_error,
    HTTPException: http_error,
    OSError: storage_error,
    StoreBroken: store_broken,
    Exception: internal_error,
}
