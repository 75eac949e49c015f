"""GET /api/submissions: submissions by submitter, kernel, status and time, newest first, a page at a time.

Served by the store from the live State and the history projection of finished
submissions (``kz_events.log.history``), whose indexes answer each filter; a page is
one indexed query, whatever the length of the history. Pages follow an opaque cursor
(the arrival position of the last row shown), so a page stays stable while newer
submissions arrive. Query parameters are checked strictly: an unknown one or one
given twice is a 400 naming it, rather than a filter silently ignored.
"""
from __future__ import annotations

import base64
import binascii
from datetime import datetime
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from kz_daemon.api.shim_settings import app_state
from kz_daemon.api.spec import Param
from kz_daemon.core.errors import ZooError
from kz_events.codec import format_ts
from kz_events.log.history import Query
from kz_events.status import STATUSES, TERMINAL
from kz_runner.contract.kernel_id import KERNEL_ID_PATTERN, MAX_KERNEL_ID_BYTES

__all__ = ["MAX_LIMIT", "DEFAULT_LIMIT", "PARAMS", "list_submissions", "encode_cursor", "decode_cursor"]

MAX_LIMIT = 200
DEFAULT_LIMIT = 50
_CURSOR_PREFIX = "kz1:"

PARAMS = (
    Param("submitter", {"type": "string", "minLength": 1}, "only this submitter's submissions"),
    Param("kernel_id", {"type": "string", "minLength": 1, "maxLength": MAX_KERNEL_ID_BYTES,
                        "pattern": KERNEL_ID_PATTERN}, "only submissions to this kernel_id"),
    Param("status", {"type": "string", "enum": [s.value for s in STATUSES]}, "only submissions in this status"),
    Param("since", {"type": "string", "format": "date-time"},
          "only submissions received at or after this time (RFC 3339 with a time zone)"),
    Param("limit", {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT},
          f"at most this many (default {DEFAULT_LIMIT})"),
    Param("cursor", {"type": "string", "minLength": 1}, "next_cursor of the previous page"),
)
_NAMES = tuple(p.name for p in PARAMS)


def encode_cursor(received_seq: int) -> str:
    """The opaque cursor that continues after the row received at ``received_seq``."""
    return base64.urlsafe_b64encode(f"{_CURSOR_PREFIX}{received_seq}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    """The arrival position a cursor continues from; ZooError BAD_REQUEST for one this server did not give."""
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
        if text.startswith(_CURSOR_PREFIX) and text[len(_CURSOR_PREFIX):].isdigit():
            return int(text[len(_CURSOR_PREFIX):])
    except (binascii.Error, UnicodeDecodeError, ValueError):
        pass
    raise ZooError("BAD_REQUEST", "cursor is not one this server gave: pass next_cursor of the previous page "
                   "unchanged", {"parameter": "cursor"})


def _params(request: Request) -> dict[str, str]:
    """The query parameters, each given at most once and all of them known (400 otherwise)."""
    query = request.query_params
    unknown = sorted(set(query.keys()) - set(_NAMES))
    if unknown:
        raise ZooError("BAD_REQUEST", f"unknown query parameter {unknown[0]}; this endpoint takes "
                       f"{', '.join(_NAMES)}", {"parameter": unknown[0], "allowed": list(_NAMES)})
    out = {}
    for name in query.keys():
        values = query.getlist(name)
        if len(values) > 1:
            raise ZooError("BAD_REQUEST", f"query parameter {name} is given {len(values)} times; give it once",
                           {"parameter": name})
        out[name] = values[0]
    return out


def _since(raw: str) -> str:
    """An RFC 3339 time as the log's ts (UTC, microseconds): comparable with received_at as text."""
    try:
        when = datetime.fromisoformat(raw.strip())
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise ZooError("BAD_REQUEST", f"since must be an RFC 3339 time with a time zone, e.g. "
                       f"2026-01-31T00:00:00Z; got {raw!r}", {"parameter": "since"})
    return format_ts(when.timestamp())


def query_of(params: dict[str, str]) -> tuple[Query, int | None, int]:
    """(the store's Query, the cursor's position or None, the limit) of checked parameters."""
    status = params.get("status")
    if status is not None and status not in {s.value for s in STATUSES}:
        raise ZooError("BAD_REQUEST", f"status {status!r} is not one of {', '.join(s.value for s in STATUSES)}",
                       {"parameter": "status"})
    raw = params.get("limit")
    try:
        limit = DEFAULT_LIMIT if raw is None else int(raw)
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_LIMIT:
        raise ZooError("BAD_REQUEST", f"limit must be an integer between 1 and {MAX_LIMIT}",
                       {"parameter": "limit", "min": 1, "max": MAX_LIMIT})
    for name in ("submitter", "kernel_id"):
        if params.get(name) == "":
            raise ZooError("BAD_REQUEST", f"query parameter {name} is empty", {"parameter": name})
    query = Query(submitter=params.get("submitter"), kernel_id=params.get("kernel_id"), status=status,
                  since=_since(params["since"]) if "since" in params else None)
    before = decode_cursor(params["cursor"]) if "cursor" in params else None
    return query, before, limit


def item(view: Any) -> dict[str, Any]:
    """One row of the list: what a client needs to show and follow a submission."""
    reasons = [r for r in view.reasons or () if isinstance(r, dict)]
    last = reasons[-1] if reasons else None
    return {"uuid": view.uuid, "kernel_id": view.kernel_id, "submitter_id": view.submitter_id,
            "status": str(view.status), "terminal": view.status in TERMINAL, "received_at": view.received_at,
            "updated_at": view.history[-1][2] if view.history else view.received_at, "arch": view.arch,
            "attempts": view.attempts, "commit_sha": view.commit_sha,
            "reason": {k: last.get(k) for k in ("stage", "code", "message")} if last else None,
            "status_url": f"/api/submissions/{view.uuid}/status"}


async def list_submissions(request: Request) -> Response:
    """GET /api/submissions: a page of submissions matching the filters, newest first."""
    query, before, limit = query_of(_params(request))
    views = await run_in_threadpool(app_state(request).zoo.submissions, query, before, limit + 1)
    page = views[:limit]
    more = len(views) > limit and page
    return JSONResponse({"submissions": [item(v) for v in page],
                         "next_cursor": encode_cursor(page[-1].history[0][0]) if more else None,
                         "limit": limit})
