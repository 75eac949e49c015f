"""The public API: kernels, submissions and their status, index, health, metrics.

Handlers translate HTTP into calls on the ``Zoo`` service (``app_state(request).zoo``)
and back; blocking service calls run in worker threads; long polls wait in short
slices so a draining server answers them promptly.
"""
from __future__ import annotations

import hashlib
import json
import time
import uuid as uuidlib
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
from starlette.concurrency import run_in_threadpool
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from kz_daemon.api import authz, listing, rate_limits as limits, views
from kz_daemon.api.metrics import accept_latency, render_metrics
from kz_daemon.api.shim_settings import AppState, app_state
from kz_daemon.api.spec import Op, Param
from kz_daemon.board import ranking
from kz_daemon.board.documents import KernelFacts, ceilings_of, kernel_speed_of_light
from kz_daemon.core.errors import ZooError
from kz_daemon.core.readmodel import SubmissionView
from kz_daemon.guards.harness_review import unreviewed_kernels
from kz_daemon.intake import idempotency, review
from kz_daemon.storage.run_logs import logs_doc
from kz_daemon.upkeep import health
from kz_events.status import Status
from kz_runner.contract import upload
from kz_runner.contract.kernel_id import kernel_id_problems

MAX_PER_PAGE = 1000
#: Keys of a status document that move without the submission changing.
VOLATILE = ("seq",)
#: A long poll re-checks the drain flag at least this often (seconds).
POLL_SLICE_S = 1.0

T = TypeVar("T")


def _single(request: Request, name: str) -> str | None:
    """A query parameter given at most once (a repeated one is 400: the spec has one value)."""
    values = request.query_params.getlist(name)
    if len(values) > 1:
        raise ZooError("BAD_REQUEST", f"query parameter {name} is given {len(values)} times; give it once",
                       {"parameter": name})
    return values[0] if values else None


def _int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = _single(request, name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ZooError("BAD_REQUEST", f"query parameter {name} must be an integer, got {raw!r}",
                       {"parameter": name}) from None
    if not low <= value <= high:
        raise ZooError("BAD_REQUEST", f"query parameter {name} must be between {low} and {high}",
                       {"parameter": name, "min": low, "max": high})
    return value


def _float_param(request: Request, name: str, default: float, high: float) -> float:
    raw = _single(request, name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ZooError("BAD_REQUEST", f"query parameter {name} must be a number of seconds, got {raw!r}",
                       {"parameter": name}) from None
    if not 0 <= value <= high or value != value:
        raise ZooError("BAD_REQUEST", f"query parameter {name} must be between 0 and {high}",
                       {"parameter": name, "max": high})
    return value


def catalog(request: Request) -> views.Catalog:
    """The app's kernel catalogue, refreshed from the current index document and the harness reviews."""
    return catalog_of(app_state(request))


def catalog_of(state: AppState) -> views.Catalog:
    """The catalogue of the app's ``state``: the index's kernels, those whose harness awaits review marked.

    The marks are of the index's head (cached per head and review state), so an approval
    changes the rankings without a new accept.
    """
    cat = state.catalog
    doc = state.zoo.index()
    head = doc.get("head") if isinstance(doc, dict) else None
    cat.refresh(doc, unreviewed_kernels(state.zoo.store, cat.digests(state.history), head))
    return cat


async def list_kernels(request: Request) -> Response:
    """GET /api/kernels: filtered, paginated kernel list with the total count."""
    q = request.query_params
    filters = {k: q.get(k, "") for k in ("arch", "op_class", "sub_class", "quant", "status")}
    text = q.get("q", "").strip()
    page = _int_param(request, "page", 1, 1, 1_000_000)
    per_page = _int_param(request, "per_page", 100, 1, MAX_PER_PAGE)
    body = catalog(request).page_bytes(filters, text, page, per_page)
    return Response(body, media_type="application/json")


async def get_kernel(request: Request) -> Response:
    """GET /api/kernels/{kernel_id}: the index entry, desc.yaml and bench_result.yaml at HEAD, speed of light."""
    kernel_id = request.path_params["kernel_id"]
    entry = catalog(request).get(kernel_id)
    if entry is None:
        raise ZooError("NOT_FOUND", f"no kernel {kernel_id!r}; GET /api/kernels lists them",
                       {"kernel_id": kernel_id})
    state = app_state(request)
    history = state.history
    doc = dict(entry)
    doc[ranking.HARNESS] = ranking.UNREVIEWED if ranking.unreviewed(entry) else ranking.REVIEWED
    doc["harness_hash"] = await run_in_threadpool(_harness_hash, request, kernel_id)
    facts = KernelFacts()
    if history is not None:
        desc, scorecard = await run_in_threadpool(history.package_docs, kernel_id)
        doc["desc"] = desc
        doc["bench_result"] = scorecard
        harness = await run_in_threadpool(history.harness, kernel_id)
        facts = KernelFacts(dict(harness.params), desc.get("io_signature") if isinstance(desc, dict) else None)
    doc["speed_of_light"] = kernel_speed_of_light(entry, facts, ceilings_of(state.zoo))
    return JSONResponse(views.plain(doc))


def _harness_hash(request: Request, kernel_id: str) -> str | None:
    """The hash of the kernel's harness at the index's head (None without a repo)."""
    state = app_state(request)
    digests = state.catalog.digests(state.history)
    head = (state.zoo.index() or {}).get("head")
    return digests.at(head, [kernel_id])[kernel_id] if digests is not None and head else None


def _status_url(request: Request, uuid: str) -> str:
    return f"/api/submissions/{uuid}/status"


def _doc(request: Request, view: SubmissionView, uuid: str) -> dict[str, Any]:
    """The status document of ``view`` (a file read, and git reads for a record whose harness a submission brought)."""
    state = app_state(request)
    return views.submission_doc(view, _status_url(request, uuid), state.zoo, state.catalog.digests(state.history))


async def create_submission(request: Request) -> Response:
    """POST /api/submissions: stream the multipart upload into the spool, answer after intake.

    With an ``Idempotency-Key`` header a retry answers as the first upload did (same uuid,
    no second submission); the key with a different package is 409 CONFLICT.
    """
    state = app_state(request)
    settings = state.settings
    cap = settings.max_upload_bytes + 64 * 1024  # room for the multipart framing and small fields
    try:
        principal, early_id = authz.header_submitter(request)  # who, before what it costs
        state.submit_limits.check(request, principal)
        await run_in_threadpool(health.check_headroom, state.zoo)
        ctype = request.headers.get("content-type", "")
        if not ctype.startswith("multipart/form-data"):
            raise ZooError("BAD_REQUEST",
                           "send multipart/form-data with fields kernel_id, submitter_id and the file package "
                           "(curl -F)", {"content_type": ctype})
        key = request.headers.get(idempotency.HEADER)
        if key is not None:
            idempotency.check_key(key)
    except ZooError:
        await _discard_body(request, cap)
        raise
    stream = limits.capped_stream(request, cap, "the upload", shown=settings.max_upload_bytes)
    tail = bytearray()  # the body's end: did the closing boundary arrive?

    async def watched():
        async for chunk in stream:
            tail.extend(chunk)
            del tail[:-upload.MULTIPART_TAIL_BYTES]
            yield chunk

    parser = MultiPartParser(request.headers, watched(), max_files=1, max_fields=8, max_part_size=64 * 1024)
    try:
        form = await parser.parse()
    except MultiPartException as exc:
        raise ZooError("BAD_REQUEST", f"the multipart body could not be read: {exc.message}") from None
    except ClientDisconnect:
        raise ZooError("UPLOAD_TRUNCATED", "the connection closed before the upload's body was complete; "
                       "send it again") from None
    if not upload.multipart_complete(ctype, bytes(tail)):
        await form.close()
        raise ZooError("UPLOAD_TRUNCATED", "the upload ended before the multipart body's closing boundary: "
                       "the body was cut short on the way (a dropped connection, a proxy's size limit); "
                       "send it again")
    try:
        kernel_id = form.get("kernel_id")
        package = form.get("package")
        if not isinstance(kernel_id, str) or not kernel_id:
            raise ZooError("VALIDATION_ERROR", "the form field kernel_id is missing",
                           {"field": "kernel_id"})
        if package is None or isinstance(package, str):
            raise ZooError("VALIDATION_ERROR",
                           "the file field package is missing: add -F 'package=@package.tar.gz'",
                           {"field": "package"})
        field_id = form.get("submitter_id")
        submitter = authz.final_submitter(principal, early_id, field_id if isinstance(field_id, str) else None,
                                          bound=state.tokens.bound)
        problems = kernel_id_problems(kernel_id)
        if problems:
            shown = repr(kernel_id) if len(kernel_id) <= 120 else repr(kernel_id[:117] + "...")
            first = problems[0]
            raise ZooError("VALIDATION_ERROR",
                           f"kernel_id {shown} is invalid: {first.message} ({first.hint})",
                           {"field": "kernel_id", "problems": [p.to_json() for p in problems]})
        size = package.size
        if size is not None and size > settings.max_upload_bytes:
            raise ZooError("PAYLOAD_TOO_LARGE",
                           f"the package is larger than the server's limit of {settings.max_upload_bytes} bytes",
                           {"limit_bytes": settings.max_upload_bytes})
        meta = {
            "submitter_id": submitter,
            "kernel_id": kernel_id,
            "source": "http",
            "filename": package.filename or "package.tar.gz",
        }
        replay = False
        if key is not None:
            # decided before the drop: a retry (or a racing twin) gets the first upload's uuid
            digest = await run_in_threadpool(_sha256_of, package.file)
            decision = await run_in_threadpool(state.zoo.reserve_upload, submitter, key, digest)
            meta["uuid"], meta["idempotency_key"], replay = decision.uuid, key, not decision.fresh
            meta["idempotency_sha256"] = digest  # a restart before intake reserves the key again from it
        if replay:
            uuid = meta["uuid"]
        else:
            if principal is not None and principal.kind in ("submitter", "admin"):
                # a token-bound upload: intake may treat its submitter as a maintainer (locked harness)
                meta.setdefault("uuid", str(uuidlib.uuid4()))
                await run_in_threadpool(state.zoo.note_verified, meta["uuid"], principal.kind, principal.id)
            await package.seek(0)
            try:
                uuid = await run_in_threadpool(state.zoo.drop_upload, package.file, meta)
            except BaseException:
                if key is not None:
                    state.zoo.release_upload(submitter, key, meta["uuid"])
                raise
    finally:
        await form.close()
    view = await run_in_threadpool(state.zoo.wait_intake, uuid, settings.intake_wait_s)
    doc = _doc(request, view, uuid)
    if doc.get("status") == Status.REJECTED:
        reasons = doc.get("reasons") or []
        first = reasons[0] if reasons else {}
        message = first.get("message") if isinstance(first, dict) else str(first)
        problems = []  # each problem with its stable code (the reason's own, or its details' list)
        for r in reasons:
            if isinstance(r, dict):
                listed = (r.get("details") or {}).get("problems") if isinstance(r.get("details"), dict) else None
                problems.extend(listed or [{"code": r.get("code"), "message": r.get("message")}])
        raise ZooError("VALIDATION_ERROR", f"the package was rejected at intake: {message or 'see details'}",
                       {"uuid": uuid, "status": Status.REJECTED, "reasons": reasons, "problems": problems,
                        "status_url": _status_url(request, uuid)})
    if replay:
        kernel_id = doc.get("kernel_id") or kernel_id  # the first upload's, which the retry repeats
    body = {"uuid": uuid, "status": intake_status(doc), "kernel_id": kernel_id,
            "submitter_id": submitter, "status_url": _status_url(request, uuid)}
    if doc.get("queue_warning"):
        body["queue_warning"] = doc["queue_warning"]
    return JSONResponse(body, status_code=202, headers={"Location": body["status_url"]})


def _sha256_of(fileobj) -> str:
    """sha256 hex of an uploaded file, read from its start (the drop seeks back before streaming it)."""
    fileobj.seek(0)
    digest = hashlib.sha256()
    for chunk in iter(lambda: fileobj.read(1 << 20), b""):
        digest.update(chunk)
    return digest.hexdigest()


def intake_status(doc: dict[str, Any]) -> str:
    """What intake decided, for the POST answer: ``queued`` once intake queued the job.

    A runner long-polling for work can claim the job in the instant between intake's
    ``job.queued`` and this answer; the answer still says ``queued`` (the documented
    contract: the upload passed intake), and ``status_url`` has the live status.
    """
    status = str(doc.get("status") or Status.RECEIVED)
    passed = any(isinstance(h, list) and len(h) > 1 and h[1] == Status.QUEUED for h in doc.get("history") or [])
    return str(Status.QUEUED) if passed else status


async def _discard_body(request: Request, cap: int) -> None:
    """Read and drop a refused upload (up to ``cap``) so the client sees our answer, not a broken pipe."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        return  # too big to be worth reading: the client gets the error and a closed connection
    try:
        async for _chunk in limits.capped_stream(request, cap):
            pass
    except ZooError:
        pass


async def wait_slices(request: Request, deadline: float, step: Callable[[float], T | None]) -> T | None:
    """Call ``step(slice_s)`` in a thread until it returns non-None, the deadline, or a drain."""
    state = app_state(request)
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or state.draining.is_set():
            return None
        result = await anyio.to_thread.run_sync(step, min(remaining, POLL_SLICE_S),
                                                limiter=state.poll_limiter)
        if result is not None:
            return result


async def submission_status(request: Request) -> Response:
    """GET /api/submissions/{uuid}/status?wait=S: current status, or the first change within S seconds."""
    state = app_state(request)
    zoo = state.zoo
    uuid = request.path_params["uuid"]
    wait = _float_param(request, "wait", 0.0, state.settings.status_max_wait_s)
    view = zoo.submission(uuid)  # a read of the folded state: no I/O, no need for a thread
    if view.result:
        doc = await run_in_threadpool(_doc, request, view, uuid)
    else:
        doc = _doc(request, view, uuid)
    if wait > 0 and not doc["terminal"]:
        last_seq = [doc.get("seq", 0)]

        def step(slice_s: float):
            fresh = _doc(request, zoo.wait_submission(uuid, last_seq[0], slice_s), uuid)
            last_seq[0] = fresh.get("seq", last_seq[0])
            return fresh if views.changed(doc, fresh, VOLATILE) else None

        fresh = await wait_slices(request, time.monotonic() + wait, step)
        if fresh is not None:
            doc = fresh
    return JSONResponse(doc)


async def submission_logs(request: Request) -> Response:
    """GET /api/submissions/{uuid}/logs: the run's build/benchmark log tails and the runner's failure."""
    zoo = app_state(request).zoo
    uuid = request.path_params["uuid"]
    view = zoo.submission(uuid)
    if not view.result:
        raise ZooError("NOT_FOUND", f"submission {uuid} has no reported run yet ({view.status}); "
                       f"its logs appear once a runner reports", {"uuid": uuid, "status": view.status})
    doc = await run_in_threadpool(logs_doc, uuid, zoo.pending.run_folder(uuid))
    doc["status"] = view.status
    return JSONResponse(doc)


async def cancel_submission(request: Request) -> Response:
    """POST /api/submissions/{uuid}/cancel: the submitter (or an admin) withdraws a job."""
    state = app_state(request)
    uuid = request.path_params["uuid"]
    await limits.read_json_object(request, state.settings.max_json_bytes)
    current = views.submission_doc(await run_in_threadpool(state.zoo.submission, uuid))
    who = authz.cancel_by(request, str(current.get("submitter_id")))
    await state.zoo.cancel_async(uuid, who)
    view = await run_in_threadpool(state.zoo.submission, uuid)
    return JSONResponse(_doc(request, view, uuid))


def require_admin(request: Request, what: str = "submissions") -> str:
    """The admin id of an admin-token request: 401 without a valid token, 403 for another kind."""
    principal = authz.token_principal(request)
    if principal is None:
        raise ZooError("UNAUTHORIZED", "reviews need 'Authorization: Bearer <admin token>'")
    if principal.kind != "admin":
        raise ZooError("FORBIDDEN", f"a {principal.kind} token cannot review {what}; use an admin token")
    return principal.id


async def list_reviews(request: Request) -> Response:
    """GET /api/reviews: submissions held by a static rule, with the evidence (admin token)."""
    require_admin(request)
    rows = await run_in_threadpool(app_state(request).zoo.reviews)
    return JSONResponse({"reviews": views.plain(rows)})


async def _review(request: Request, decision: str) -> Response:
    state = app_state(request)
    by = require_admin(request)
    uuid = request.path_params["uuid"]
    body = await limits.read_json_object(request, state.settings.max_json_bytes)
    reason = body.get("reason", "") if isinstance(body, dict) else ""
    if not isinstance(reason, str):
        raise ZooError("BAD_REQUEST", "reason must be a string", {"field": "reason"})
    view = await run_in_threadpool(state.zoo.review, uuid, decision, by, reason)
    return JSONResponse(_doc(request, view, uuid))


async def approve_review(request: Request) -> Response:
    """POST /api/reviews/{uuid}/approve: an admin lets a held submission run (it is queued)."""
    return await _review(request, "approve")


async def reject_review(request: Request) -> Response:
    """POST /api/reviews/{uuid}/reject: an admin refuses a held submission (rejected, with the reason)."""
    return await _review(request, "reject")


async def list_harness_reviews(request: Request) -> Response:
    """GET /api/reviews/harnesses: kernels whose harness at HEAD a submission brought and no admin approved."""
    require_admin(request, "harnesses")
    state = app_state(request)
    digests = state.catalog.digests(state.history)
    if digests is None:  # an app without a repo reader (history=None), as the decisions answer
        raise ZooError("UNAVAILABLE", "the kernel repo cannot be read")
    rows = await run_in_threadpool(review.unreviewed_harnesses, state.zoo, digests)
    return JSONResponse({"harnesses": views.plain(rows)})


async def _harness_review(request: Request, decision: str) -> Response:
    state = app_state(request)
    by = require_admin(request, "harnesses")
    kernel_id = request.path_params["kernel_id"]
    body = await limits.read_json_object(request, state.settings.max_json_bytes)
    reason, harness_hash = body.get("reason", ""), body.get("harness_hash")
    if not isinstance(reason, str):
        raise ZooError("BAD_REQUEST", "reason must be a string", {"field": "reason"})
    if harness_hash is not None and not isinstance(harness_hash, str):
        raise ZooError("BAD_REQUEST", "harness_hash must be a string of hex digits", {"field": "harness_hash"})
    digests = state.catalog.digests(state.history)
    if digests is None:
        raise ZooError("UNAVAILABLE", "the kernel repo cannot be read")
    doc = await run_in_threadpool(review.review_harness, state.zoo, digests, kernel_id, decision, by,
                                  harness_hash, reason)
    return JSONResponse(views.plain(doc))


async def approve_harness(request: Request) -> Response:
    """POST /api/reviews/harnesses/{kernel_id}/approve: an admin approves the kernel's harness at HEAD: it ranks."""
    return await _harness_review(request, "approve")


async def revoke_harness_approval(request: Request) -> Response:
    """POST /api/reviews/harnesses/{kernel_id}/revoke: an admin takes an approval back: the kernel no longer ranks."""
    return await _harness_review(request, "revoke")


async def revoke_submission(request: Request) -> Response:
    """POST /api/submissions/{uuid}/revoke: an admin takes an accepted record back (``{"reason": ...}``).

    ``uuid`` may be an unambiguous prefix of the record's uuid (``kz`` prints 8 characters).
    """
    state = app_state(request)
    uuid = request.path_params["uuid"]
    principal = authz.token_principal(request)
    if principal is None:
        raise ZooError("UNAUTHORIZED", "revoking a record needs 'Authorization: Bearer <admin token>'")
    if principal.kind != "admin":
        raise ZooError("FORBIDDEN", f"a {principal.kind} token cannot revoke records; an admin token can")
    body = await limits.read_json_object(request, state.settings.max_json_bytes, ("reason",))
    reason = body.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise ZooError("BAD_REQUEST", "send {\"reason\": \"...\"}: why the record is revoked",
                       {"field": "reason"})
    view = await run_in_threadpool(state.zoo.revoke, uuid, principal.id, reason)  # uuid may be a short id
    return JSONResponse(await run_in_threadpool(_doc, request, view, view.uuid))


async def queue(request: Request) -> Response:
    """GET /api/queue: pending jobs, jobs in flight, runners seen."""
    view = await run_in_threadpool(app_state(request).zoo.queue_view)
    return JSONResponse(views.plain(view))


async def index_json(request: Request) -> Response:
    """GET /index.json: the leaderboard index document as the daemon keeps it."""
    doc = app_state(request).zoo.index()
    return Response(json.dumps(views.plain(doc), ensure_ascii=False, separators=(",", ":")),
                    media_type="application/json")


def _health(request: Request) -> dict[str, Any]:
    state = app_state(request)
    return health.report(state.zoo, state.runner_supervisor, state.draining.is_set())


async def healthz(request: Request) -> Response:
    """GET /healthz: the process answers and its store can still write (503 when only a restart helps)."""
    doc = await run_in_threadpool(_health, request)
    if not doc["alive"]:
        raise ZooError("UNAVAILABLE", "not alive: " + "; ".join(doc["reasons"]),
                       {"reasons": doc["reasons"], "checks": doc["checks"]})
    return JSONResponse({"status": "ok", "checks": doc["checks"]})


async def readyz(request: Request) -> Response:
    """GET /readyz: 200 when work can be taken; 503 naming every check that fails."""
    doc = await run_in_threadpool(_health, request)
    if not doc["ready"]:
        raise ZooError("UNAVAILABLE", "not ready: " + "; ".join(doc["reasons"]),
                       {"reasons": doc["reasons"], "checks": doc["checks"]})
    return JSONResponse({"status": "ready", "checks": doc["checks"]})


async def metrics(request: Request) -> Response:
    """GET /metrics: Prometheus text exposition."""
    state = app_state(request)
    zoo = state.zoo
    data = dict(await run_in_threadpool(zoo.metrics))
    if "accept_latency_seconds" not in data:
        data["accept_latency_seconds"] = await run_in_threadpool(accept_latency, zoo.store.state.submissions)
    text = render_metrics(data, state.http_counters)
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")


_FILTERS = tuple(
    Param(name, {"type": "string"}, f"only kernels whose category {name} equals this")
    for name in ("arch", "op_class", "sub_class", "quant")
)

OPS: list[Op] = [
    Op("GET", "/api/kernels", list_kernels, "listKernels", "List kernels (filtered, paginated)", "kernels",
       params=_FILTERS + (
           Param("status", {"type": "string"}, "normal, frozen, deprecated, valid or invalid"),
           Param("q", {"type": "string"}, "case-insensitive text in kernel_id, name, summary, tags"),
           Param("page", {"type": "integer", "minimum": 1, "maximum": 1000000}, "1-based page number"),
           Param("per_page", {"type": "integer", "minimum": 1, "maximum": MAX_PER_PAGE},
                 "page size, default 100"),
       ),
       responses={200: "api_kernel_list", 400: "api_error"}),
    Op("GET", "/api/kernels/{kernel_id:path}", get_kernel, "getKernel",
       "One kernel: index entry, desc.yaml and bench_result.yaml", "kernels",
       responses={200: "api_kernel", 404: "api_error"}),
    Op("GET", "/api/submissions", listing.list_submissions, "listSubmissions",
       "List submissions, newest first (filters: submitter, kernel_id, status, since; cursor pages)",
       "submissions", params=listing.PARAMS, responses={200: "api_submission_list", 400: "api_error"}),
    Op("POST", "/api/submissions", create_submission, "createSubmission",
       "Submit a package (multipart: kernel_id, submitter_id, package)", "submissions",
       auth="submitter", request="multipart",
       responses={202: "api_submission_created", 400: "api_error", 401: "api_error", 403: "api_error",
                  409: "api_error", 413: "api_error", 429: "api_error", 503: "api_error"}),
    Op("GET", "/api/submissions/{uuid}/status", submission_status, "getSubmissionStatus",
       "Submission status (long poll with ?wait=S)", "submissions",
       params=(Param("wait", {"type": "number", "minimum": 0, "maximum": 60},
                     "seconds to wait for a change (0 = answer now)"),),
       responses={200: "api_submission_status", 400: "api_error", 404: "api_error"}),
    Op("GET", "/api/submissions/{uuid}/logs", submission_logs, "getSubmissionLogs",
       "The run's log tails (build, benchmark) and the runner's failure", "submissions",
       responses={200: "api_submission_logs", 404: "api_error"}),
    Op("POST", "/api/submissions/{uuid}/cancel", cancel_submission, "cancelSubmission",
       "Cancel a submission (its submitter or an admin)", "submissions", auth="submitter",
       request="api_empty",
       responses={200: "api_submission_status", 400: "api_error", 401: "api_error", 403: "api_error",
                  404: "api_error", 409: "api_error", 503: "api_error"}),
    Op("GET", "/api/reviews", list_reviews, "listReviews",
       "Submissions held by a static rule, with the evidence (admin token)", "reviews", auth="admin",
       responses={200: "api_review_list", 401: "api_error", 403: "api_error"}),
    Op("POST", "/api/reviews/{uuid}/approve", approve_review, "approveReview",
       "Approve a held submission: it is queued (admin token)", "reviews", auth="admin",
       request="api_review_request",
       responses={200: "api_submission_status", 401: "api_error", 403: "api_error", 404: "api_error",
                  409: "api_error"}),
    Op("POST", "/api/reviews/{uuid}/reject", reject_review, "rejectReview",
       "Reject a held submission with a reason (admin token)", "reviews", auth="admin",
       request="api_review_request",
       responses={200: "api_submission_status", 401: "api_error", 403: "api_error", 404: "api_error",
                  409: "api_error"}),
    Op("GET", "/api/reviews/harnesses", list_harness_reviews, "listHarnessReviews",
       "Kernels whose harness a submission brought and no admin approved yet (admin token)", "reviews",
       auth="admin", responses={200: "api_harness_review_list", 401: "api_error", 403: "api_error"}),
    Op("POST", "/api/reviews/harnesses/{kernel_id:path}/approve", approve_harness, "approveHarness",
       "Approve a kernel's harness at HEAD: the kernel ranks (admin token)", "reviews", auth="admin",
       request="api_harness_review_request",
       responses={200: "api_harness_review", 400: "api_error", 401: "api_error", 403: "api_error",
                  404: "api_error", 409: "api_error"}),
    Op("POST", "/api/reviews/harnesses/{kernel_id:path}/revoke", revoke_harness_approval, "revokeHarnessApproval",
       "Take back the approval of a kernel's harness: it no longer ranks (admin token)", "reviews", auth="admin",
       request="api_harness_review_request",
       responses={200: "api_harness_review", 400: "api_error", 401: "api_error", 403: "api_error",
                  404: "api_error", 409: "api_error"}),
    Op("POST", "/api/submissions/{uuid}/revoke", revoke_submission, "revokeSubmission",
       "Revoke an accepted record (admin token)", "submissions", auth="admin",
       request="api_revoke_request",
       responses={200: "api_submission_status", 400: "api_error", 401: "api_error", 403: "api_error",
                  404: "api_error", 409: "api_error"}),
    Op("GET", "/api/queue", queue, "getQueue", "Pending jobs, jobs in flight, runners seen", "ops",
       responses={200: "api_queue"}),
    Op("GET", "/index.json", index_json, "getIndex", "The leaderboard index document", "ops",
       responses={200: None}),
    Op("GET", "/healthz", healthz, "healthz", "Liveness", "ops", responses={200: "api_health", 503: "api_error"}),
    Op("GET", "/readyz", readyz, "readyz", "Readiness", "ops", responses={200: "api_health", 503: "api_error"}),
    Op("GET", "/metrics", metrics, "metrics", "Prometheus metrics", "ops", responses={200: None},
       content_type="text/plain"),
]
