"""Reruns over HTTP: ask for an accepted record to be measured again, and follow the rerun.

``POST /api/submissions/{uuid}/rerun`` (an admin token, or the record's submitter's own
token; ``{uuid}`` may be the short id ``kz`` prints) queues a rerun
(``kz_daemon.queue.reruns``) for a runner of the record's arch, or only for the runner
the body names (``{"runner": ID}``), and answers 202 with the rerun. ``GET
/api/reruns/{rerun_id}?wait=S`` is the rerun, long-polled like a submission's status:
where it stands and, once done, each case's figure beside the record's. ``GET
/api/reruns?status=&uuid=&kernel=`` lists them, newest first (``kz rerun list``), and
``POST /api/reruns/{rerun_id}/cancel`` (an admin token; ``{rerun_id}`` may be a short id)
cancels one (``kz rerun cancel ID``): see :mod:`kz_daemon.queue.reruns` for what
cancelling a queued and a running rerun does.
"""
from __future__ import annotations

import time
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from kz_daemon.api import authz, rate_limits as limits
from kz_daemon.api.public import wait_slices
from kz_daemon.api.shim_settings import app_state
from kz_daemon.api.spec import Op, Param
from kz_daemon.core import short_ids
from kz_daemon.core.errors import ZooError
from kz_daemon.queue import reruns
from kz_events.reducer import RERUN_STATUSES

__all__ = ["OPS"]

#: the longest a GET /api/reruns/{rerun_id} waits for a change
MAX_WAIT_S = 60.0
#: the query parameters of GET /api/reruns
LIST_PARAMS = ("status", "uuid", "kernel")


def _who(request: Request, uuid: str) -> str:
    """The caller's id when it may rerun ``uuid``: an admin, or the record's own submitter with a token."""
    principal = authz.token_principal(request)
    if principal is None:
        raise ZooError("UNAUTHORIZED", "a rerun needs 'Authorization: Bearer <token>': an admin's, or the "
                       "record's submitter's own")
    if principal.kind == "admin":
        return principal.id
    zoo = app_state(request).zoo
    if principal.kind == "submitter" and zoo.submission(uuid).submitter_id == principal.id:
        return principal.id
    raise ZooError("FORBIDDEN", f"a {principal.kind} token of {principal.id!r} cannot rerun another submitter's "
                   "record; an admin token or the record's submitter's can")


def _rerun_doc(rerun: dict[str, Any]) -> dict[str, Any]:
    return dict(rerun, status_url=f"/api/reruns/{rerun['rerun_id']}",
                record_url=f"/api/submissions/{rerun['uuid']}/status")


async def request_rerun(request: Request) -> Response:
    """POST /api/submissions/{uuid}/rerun: queue a rerun of an accepted record (``{"runner": ID}`` optional)."""
    state = app_state(request)
    zoo = state.zoo
    body = await limits.read_json_object(request, state.settings.max_json_bytes)
    runner = body.get("runner")
    if runner is not None and (not isinstance(runner, str) or not runner.strip()):
        raise ZooError("BAD_REQUEST", "runner must be a runner id (a string) or absent", {"field": "runner"})
    with zoo.store.lock:
        uuid = short_ids.resolve(request.path_params["uuid"], short_ids.records(zoo.store.state), "accepted record")
    by = _who(request, uuid)
    rerun_id = await run_in_threadpool(reruns.request, zoo, uuid, by, runner)
    doc = _rerun_doc(reruns.get(zoo, rerun_id))
    return JSONResponse(doc, status_code=202, headers={"Location": doc["status_url"]})


async def get_rerun(request: Request) -> Response:
    """GET /api/reruns/{rerun_id}?wait=S: the rerun now, or its first change within S seconds."""
    zoo = app_state(request).zoo
    rerun_id = request.path_params["rerun_id"]
    raw = request.query_params.get("wait", "0") or "0"
    try:
        wait = float(raw)
    except ValueError:
        raise ZooError("BAD_REQUEST", f"query parameter wait must be a number of seconds, got {raw!r}",
                       {"parameter": "wait"}) from None
    if not 0 <= wait <= MAX_WAIT_S:
        raise ZooError("BAD_REQUEST", f"query parameter wait must be between 0 and {MAX_WAIT_S:g}",
                       {"parameter": "wait", "max": MAX_WAIT_S})
    doc = reruns.get(zoo, rerun_id)
    if wait > 0 and not doc["terminal"]:
        def step(slice_s: float) -> dict | None:
            fresh = reruns.wait(zoo, rerun_id, slice_s)
            return fresh if fresh["history"] != doc["history"] else None

        fresh = await wait_slices(request, time.monotonic() + wait, step)
        if fresh is not None:
            doc = fresh
    return JSONResponse(_rerun_doc(doc))


def _list_params(request: Request) -> dict[str, str]:
    """GET /api/reruns's query parameters, each known and given at most once (400 otherwise)."""
    query = request.query_params
    out: dict[str, str] = {}
    for name in query.keys():
        if name not in LIST_PARAMS:
            raise ZooError("BAD_REQUEST", f"unknown query parameter {name}; this endpoint takes "
                           f"{', '.join(LIST_PARAMS)}", {"parameter": name, "allowed": list(LIST_PARAMS)})
        values = query.getlist(name)
        if len(values) > 1:
            raise ZooError("BAD_REQUEST", f"query parameter {name} is given {len(values)} times; give it once",
                           {"parameter": name})
        if values[0]:
            out[name] = values[0]
    return out


async def list_reruns(request: Request) -> Response:
    """GET /api/reruns?status=&uuid=&kernel=: every rerun, newest first, where each stands."""
    zoo = app_state(request).zoo
    q = _list_params(request)
    uuid = q.get("uuid")
    if uuid is not None:
        with zoo.store.lock:
            uuid = short_ids.resolve(uuid, short_ids.records(zoo.store.state), "accepted record")
    found = await run_in_threadpool(reruns.listing, zoo, q.get("status"), uuid, q.get("kernel"))
    return JSONResponse({"reruns": [_rerun_doc(r) for r in found]})


async def cancel_rerun(request: Request) -> Response:
    """POST /api/reruns/{rerun_id}/cancel: an admin cancels a queued or running rerun (``{"reason": ...}`` optional)."""
    state = app_state(request)
    principal = authz.token_principal(request)
    if principal is None:
        raise ZooError("UNAUTHORIZED", "cancelling a rerun needs 'Authorization: Bearer <admin token>'")
    if principal.kind != "admin":
        raise ZooError("FORBIDDEN", f"a {principal.kind} token cannot cancel reruns; an admin token can")
    body = await limits.read_json_object(request, state.settings.max_json_bytes)
    reason = body.get("reason", "")
    if not isinstance(reason, str):
        raise ZooError("BAD_REQUEST", "reason must be a string", {"field": "reason"})
    doc = await run_in_threadpool(reruns.cancel, state.zoo, request.path_params["rerun_id"], principal.id,
                                  reason.strip())
    return JSONResponse(_rerun_doc(doc))


OPS: list[Op] = [
    Op("POST", "/api/submissions/{uuid}/rerun", request_rerun, "requestRerun",
       "Measure an accepted record again, on a runner of its arch (admin or its submitter)", "submissions",
       auth="submitter", request="api_rerun_request",
       responses={202: "api_rerun", 400: "api_error", 401: "api_error", 403: "api_error", 404: "api_error",
                  409: "api_error"}),
    Op("GET", "/api/reruns/{rerun_id}", get_rerun, "getRerun",
       "A rerun: where it stands, and each case's figure beside the record's (long poll with ?wait=S)",
       "submissions",
       params=(Param("wait", {"type": "number", "minimum": 0, "maximum": MAX_WAIT_S},
                     "seconds to wait for a change (0 = answer now)"),),
       responses={200: "api_rerun", 400: "api_error", 404: "api_error"}),
    Op("GET", "/api/reruns", list_reruns, "listReruns",
       "Every rerun, newest first, where each stands (filters: status, the record's uuid, kernel)", "submissions",
       params=(Param("status", {"type": "string", "enum": list(RERUN_STATUSES)}, "only reruns in this status"),
               Param("uuid", {"type": "string"}, "only reruns of this record (a uuid or an unambiguous prefix)"),
               Param("kernel", {"type": "string"}, "only reruns of this kernel_id")),
       responses={200: "api_rerun_list", 400: "api_error", 404: "api_error", 409: "api_error"}),
    Op("POST", "/api/reruns/{rerun_id}/cancel", cancel_rerun, "cancelRerun",
       "Cancel a queued or running rerun (admin token): a queued one never runs, a running one's figures are "
       "discarded", "submissions", auth="admin", request="api_rerun_cancel_request",
       responses={200: "api_rerun", 400: "api_error", 401: "api_error", 403: "api_error", 404: "api_error",
                  409: "api_error"}),
]
