"""The runner wire protocol (docs/architecture.md): claim, package, lease renew/release, result.

Every call needs ``Authorization: Bearer <runner token>``; the runner id comes from
the token, never from the body. Lease ownership (403/409) is decided by the Zoo.
"""
from __future__ import annotations

import base64
import binascii
import time
from datetime import UTC, datetime
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response

from kz_daemon.api import authz, rate_limits as limits, views
from kz_daemon.api.public import wait_slices
from kz_daemon.api.shim_settings import ShimSettings, app_state
from kz_daemon.api.spec import Op
from kz_daemon.core.errors import ZooError
from kz_daemon.storage.run_logs import clean_tails


def rfc3339(epoch: float | str | None) -> str | None:
    """Epoch seconds as an RFC 3339 UTC timestamp (strings pass through)."""
    if epoch is None or isinstance(epoch, str):
        return epoch
    return datetime.fromtimestamp(float(epoch), tz=UTC).isoformat().replace("+00:00", "Z")


def _str_field(doc: dict[str, Any], name: str) -> str:
    value = doc.get(name)
    if not isinstance(value, str) or not value:
        raise ZooError("BAD_REQUEST", f"field {name} must be a non-empty string", {"field": name})
    return value


def _optional_str_field(doc: dict[str, Any], name: str) -> str | None:
    return None if doc.get(name) is None else _str_field(doc, name)


def claim_doc(claim: Any, settings: ShimSettings) -> dict[str, Any]:
    """The claim answer of the wire protocol from a service ``Claim``."""
    raw = views.plain(claim)
    uuid = raw["uuid"]
    expires = raw.get("lease_expires_at")
    lease_seconds = raw.get("lease_seconds")
    if lease_seconds is None and isinstance(expires, (int, float)):
        lease_seconds = max(0.0, round(float(expires) - time.time(), 3))
    timeouts = raw.get("timeouts") or {"build_s": settings.build_s, "benchmark_s": settings.benchmark_s}
    return {
        "uuid": uuid,
        "kernel_id": raw.get("kernel_id"),
        "package_url": f"/api/runner/package/{uuid}",
        "lease_id": raw.get("lease_id"),
        "lease_expires_at": rfc3339(expires),
        "lease_seconds": lease_seconds if lease_seconds is not None else settings.lease_seconds,
        "attempt": raw.get("attempt"),
        "timeouts": timeouts,
    }


async def claim(request: Request) -> Response:
    """POST /api/runner/claim: long poll for a job of the runner's arch; 204 when none came."""
    state = app_state(request)
    runner_id = authz.require_runner(request)
    doc = await limits.read_json_object(request, state.settings.max_json_bytes, required=("arch",))
    arch = _str_field(doc, "arch")
    wait = doc.get("wait", 30)
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or wait < 0:
        raise ZooError("BAD_REQUEST", "field wait must be a number of seconds >= 0", {"field": "wait"})
    wait = min(float(wait), state.settings.claim_max_wait_s)
    gpu = doc.get("gpu")
    if gpu is not None and (isinstance(gpu, bool) or not isinstance(gpu, (str, int))
                            or (isinstance(gpu, int) and gpu < 0)):
        raise ZooError("BAD_REQUEST", "field gpu must be a GPU index: a string or an integer >= 0",
                       {"field": "gpu"})
    _optional_str_field(doc, "host")
    zoo = state.zoo
    await run_in_threadpool(zoo.note_runner, runner_id, {"arch": arch, "host": doc.get("host"),
                                                         "gpu": None if gpu is None else str(gpu)})
    got = await run_in_threadpool(zoo.claim, runner_id, arch, 0)
    if got is None and wait > 0:
        got = await wait_slices(request, time.monotonic() + wait,
                                 lambda slice_s: zoo.claim(runner_id, arch, slice_s))
    if got is None:
        return Response(status_code=204)
    return JSONResponse(claim_doc(got, state.settings))


async def package(request: Request) -> Response:
    """GET /api/runner/package/{uuid}: the job's tar.gz (lease holder only)."""
    runner_id = authz.require_runner(request)
    uuid = request.path_params["uuid"]
    path = await run_in_threadpool(app_state(request).zoo.runner_package, uuid, runner_id)
    return FileResponse(path, media_type="application/gzip", filename=f"{uuid}.tar.gz")


async def renew(request: Request) -> Response:
    """POST /api/runner/lease/{uuid}/renew: extend the lease; 409 LEASE_LOST when it is gone."""
    state = app_state(request)
    runner_id = authz.require_runner(request)
    doc = await limits.read_json_object(request, state.settings.max_json_bytes, required=("lease_id",))
    lease_id = _str_field(doc, "lease_id")
    uuid = request.path_params["uuid"]
    zoo = state.zoo
    expires = await zoo.renew_async(uuid, runner_id, lease_id)
    zoo.note_runner(runner_id, {})  # a runner busy with a long job still serves its arch (no queue warning)
    return JSONResponse({"uuid": uuid, "lease_id": lease_id, "lease_expires_at": rfc3339(expires)})


async def release(request: Request) -> Response:
    """POST /api/runner/lease/{uuid}/release: give the job back (it is queued again)."""
    state = app_state(request)
    runner_id = authz.require_runner(request)
    doc = await limits.read_json_object(request, state.settings.max_json_bytes, required=("lease_id",))
    lease_id = _str_field(doc, "lease_id")
    reason = doc.get("reason") or "released by runner"
    if not isinstance(reason, str):
        raise ZooError("BAD_REQUEST", "field reason must be a string", {"field": "reason"})
    uuid = request.path_params["uuid"]
    await state.zoo.release_async(uuid, runner_id, lease_id, reason[:500])
    return JSONResponse({"uuid": uuid, "released": True})


async def result(request: Request) -> Response:
    """POST /api/submissions/{uuid}/result: the benchmark JSON, base64 logs, env, failure, log tails."""
    state = app_state(request)
    runner_id = authz.require_runner(request)
    doc = await limits.read_json_object(request, state.settings.max_result_bytes, required=("lease_id",),
                                        free=("result",))
    lease_id = _str_field(doc, "lease_id")
    result_doc = doc.get("result")
    if result_doc is not None and not isinstance(result_doc, dict):
        raise ZooError("BAD_REQUEST", "field result must be the benchmark JSON object or null",
                       {"field": "result"})
    failure = doc.get("failure")
    if failure is not None and not (isinstance(failure, dict) and isinstance(failure.get("code"), str)):
        raise ZooError("BAD_REQUEST", "field failure must be null or {code, message}", {"field": "failure"})
    if result_doc is None and failure is None:
        raise ZooError("BAD_REQUEST", "send a result document, a failure, or both", {"field": "result"})
    env = doc.get("env") or {}
    if not isinstance(env, dict):
        raise ZooError("BAD_REQUEST", "field env must be an object", {"field": "env"})
    logs_b64 = doc.get("logs_b64") or ""
    if not isinstance(logs_b64, str):
        raise ZooError("BAD_REQUEST", "field logs_b64 must be a base64 string", {"field": "logs_b64"})
    try:
        logs = base64.b64decode(logs_b64, validate=True)
    except (binascii.Error, ValueError):
        raise ZooError("BAD_REQUEST", "field logs_b64 is not valid base64", {"field": "logs_b64"}) from None
    tails = clean_tails(doc.get("log_tails"))
    uuid = request.path_params["uuid"]
    zoo = state.zoo
    view = await run_in_threadpool(zoo.report_result, uuid, runner_id, lease_id, result_doc,
                                   logs, env, failure, tails)
    return JSONResponse(views.submission_doc(view, f"/api/submissions/{uuid}/status", zoo))


OPS: list[Op] = [
    Op("POST", "/api/runner/claim", claim, "claimJob", "Long-poll for a job of the runner's arch (204: none)",
       "runner", auth="runner", request="api_claim_request",
       responses={200: "api_claim", 204: None, 400: "api_error", 401: "api_error", 403: "api_error",
                  413: "api_error"}),
    Op("GET", "/api/runner/package/{uuid}", package, "getJobPackage", "Download the job's tar.gz",
       "runner", auth="runner", content_type="application/gzip",
       responses={200: None, 401: "api_error", 403: "api_error", 404: "api_error", 409: "api_error"}),
    Op("POST", "/api/runner/lease/{uuid}/renew", renew, "renewLease", "Extend the job's lease", "runner",
       auth="runner", request="api_lease_request",
       responses={200: "api_lease", 400: "api_error", 401: "api_error", 403: "api_error", 404: "api_error",
                  409: "api_error"}),
    Op("POST", "/api/runner/lease/{uuid}/release", release, "releaseLease", "Give the job back", "runner",
       auth="runner", request="api_lease_request",
       responses={200: "api_released", 400: "api_error", 401: "api_error", 403: "api_error",
                  404: "api_error", 409: "api_error"}),
    Op("POST", "/api/submissions/{uuid}/result", result, "reportResult",
       "Report the benchmark JSON and base64 runner logs", "runner", auth="runner",
       request="api_result_request",
       responses={200: "api_submission_status", 400: "api_error", 401: "api_error", 403: "api_error",
                  404: "api_error", 409: "api_error", 413: "api_error", 422: "api_error"}),
]
