"""The web leaderboard: server-rendered Jinja2 pages that work without JavaScript.

``/`` operators, kernels, records this week and the latest new bests,
``/ops/{arch}/{op_class}/{sub_class}/{quant}`` one operator's kernels ranked overall
and per case, with speed of light and best over time, ``/kernels/{id}`` a kernel, ``/commits/{sha}``
a commit of the kernel repo, ``/submissions`` recent submissions, ``/submissions/{uuid}``
one submission (following it while it runs), ``/queue``. The handlers gather values;
the templates in ``templates/`` lay them out (see :mod:`kz_daemon.web.render`).
"""
from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from kz_daemon.api import views
from kz_daemon.api.public import catalog
from kz_daemon.api.shim_settings import app_state
from kz_daemon.board import ranking
from kz_daemon.board.documents import KernelFacts, ceilings_of, kernel_speed_of_light
from kz_daemon.config.ports import Service
from kz_daemon.core import scorecard
from kz_daemon.core.errors import ZooError
from kz_daemon.core.readmodel import SubmissionView
from kz_daemon.guards.harness_review import HarnessDigests, review_of
from kz_daemon.intake import review
from kz_daemon.standings import rankings
from kz_daemon.storage import run_logs as logs
from kz_daemon.storage.history import HeadHarness, HistoryPoint, KernelHistory
from kz_daemon.web import charts as web_charts, commits, operators, source_pages, submission_list
from kz_daemon.web.render import PAGE_HEADERS, TEMPLATES, fmt_value, short_sha, when
from kz_events.status import STATUSES, Status, is_terminal

KERNELS_PER_PAGE = 500
SORT_KEYS = ("kernel", "name", "status", "cases")
#: Log text shown per log on a submission page (the end of it: failures are at the end).
LOG_TAIL_CHARS = 64 * 1024
#: A kernel page lists at most this many of the kernel's submissions.
KERNEL_ATTEMPTS = 100

def _render(request: Request, name: str, context: dict[str, Any], status: int = 200) -> Response:
    return TEMPLATES.TemplateResponse(request, name, context, status_code=status, headers=PAGE_HEADERS)


def _error(request: Request, exc: ZooError) -> Response:
    return _render(request, "error.html", {"title": exc.code, "error": exc}, exc.http_status)


def _page_number(request: Request) -> int:
    try:
        return max(1, min(1_000_000, int(request.query_params.get("page", "1"))))
    except ValueError:
        return 1


def _url(path: str, params: Mapping[str, Any]) -> str:
    """``path`` with the non-empty ``params`` as a query string."""
    kept = {k: v for k, v in params.items() if v not in ("", None)}
    return path + ("?" + urllib.parse.urlencode(kept) if kept else "")


# -- home: operators and kernels ------------------------------------------------------------------

def _kernel_row(entry: Mapping[str, Any]) -> dict[str, Any]:
    kernel_cases = views.cases(entry)
    measured = sum(1 for c in kernel_cases if operators.measured_value(c.get("best")) is not None)
    return {"kernel_id": str(entry.get("kernel_id", "")), "name": entry.get("name") or "",
            "category": views.category(entry), "operator": operators.key_of(entry).path,
            "status": views.status_of(entry), "valid": views.is_valid(entry),
            "cases": len(kernel_cases), "measured": measured}


def _sorted_rows(rows: list[dict[str, Any]], key: str, order: str) -> list[dict[str, Any]]:
    field = {"kernel": "kernel_id"}.get(key, key)
    return sorted(rows, key=lambda r: (r[field], r["kernel_id"]), reverse=order == "desc")


async def home(request: Request) -> Response:
    """GET /: the operators (implementations, best one) and the kernels table, filterable and sortable."""
    q = request.query_params
    filters = {k: q.get(k, "") for k in views.CATEGORY_FIELDS}
    text = q.get("q", "").strip()
    sort = q.get("sort", "kernel") if q.get("sort") in SORT_KEYS else "kernel"
    order = "desc" if q.get("order") == "desc" else "asc"
    page_no = _page_number(request)
    cat = catalog(request)
    state = app_state(request)
    now = state.zoo.clock()  # the daemon's clock: the one its commits carry
    digests = cat.digests(state.history)

    def unreviewed(kernel_id: str, sha_src: str) -> bool:
        return review_of(state.zoo.store, digests, kernel_id, sha_src) == ranking.UNREVIEWED

    week, new_bests = await run_in_threadpool(operators.latest_bests, state.history, cat.get, now, unreviewed)
    facets = cat.memo(("facets",), cat.facets)
    summaries = cat.memo(("operators",), lambda: [operators.summarise(k, v)
                                                  for k, v in operators.group(cat.kernels()).items()])
    shown_ops = [s for s in summaries
                 if all(not filters[f] or getattr(s.key, f) == filters[f] for f in views.CATEGORY_FIELDS)]
    key = ("kernel-rows", tuple(sorted(filters.items())), text, sort, order)
    rows = cat.memo(key, lambda: _sorted_rows([_kernel_row(e) for e in cat.select(filters, text)], sort, order))
    pages = max(1, (len(rows) + KERNELS_PER_PAGE - 1) // KERNELS_PER_PAGE)
    base = {**filters, "q": text}

    def sort_url(column: str) -> str:
        flip = "desc" if (sort == column and order == "asc") else "asc"
        return _url("/", {**base, "sort": column, "order": flip})

    return _render(request, "home.html", {
        "title": "Leaderboard", "filters": filters, "text": text, "facets": facets, "operators": shown_ops,
        "operator_count": len(summaries), "week": week, "new_bests": new_bests,
        "rows": rows[(page_no - 1) * KERNELS_PER_PAGE: page_no * KERNELS_PER_PAGE], "total": len(rows),
        "kernel_count": len(cat.kernels()), "sort": sort, "order": order, "sort_url": sort_url,
        "page": page_no, "pages": pages,
        "page_url": lambda n: _url("/", {**base, "sort": sort, "order": order, "page": n})})


# -- operator page --------------------------------------------------------------------------------

def _operator_extras(history: KernelHistory | None, entries: list[Mapping[str, Any]]) -> tuple[dict, dict, dict]:
    """What the operator page reads from each implementation's scorecard and METAS at the head, in one pass.

    ``values``: ``{kernel_id: {case: {metric: best value}}}`` of the non-primary metrics;
    ``declared``: ``{case: {metric: {unit, direction}}}`` of those metrics;
    ``older``: ``{kernel_id: {case ids}}`` whose best primary record was measured under a
    harness other than HEAD's.
    """
    values: dict[str, dict[str, dict[str, float]]] = {}
    declared: dict[str, dict[str, dict[str, str]]] = {}
    older: dict[str, set[str]] = {}
    if history is None:
        return values, declared, older
    for entry in entries:
        kernel_id = str(entry.get("kernel_id", ""))
        primaries = {str(c.get("test_case_id")): c.get("primary_metric") for c in views.cases(entry)}
        harness = history.harness(kernel_id)
        for case_id, metrics in harness.metrics.items():
            for name, info in metrics.items():
                if name != primaries.get(case_id):
                    declared.setdefault(case_id, {}).setdefault(name, info)
        _desc, card = history.package_docs(kernel_id)
        for case in (card or {}).get("cases") or [] if isinstance(card, dict) else []:
            if not isinstance(case, dict) or not isinstance(case.get("metrics_best"), dict):
                continue
            case_id = str(case.get("test_case_id"))
            best = case["metrics_best"]
            if scorecard.older_harness(best.get(primaries.get(case_id)), harness.blob):
                older.setdefault(kernel_id, set()).add(case_id)
            for name, record in best.items():
                value = operators.measured_value(record)
                if name != primaries.get(case_id) and value is not None:
                    values.setdefault(kernel_id, {}).setdefault(case_id, {})[str(name)] = value
                    declared.setdefault(case_id, {}).setdefault(str(name), {"unit": "", "direction": ""})
    return values, declared, older


async def operator_page(request: Request) -> Response:
    """GET /ops/{arch}/{op_class}/{sub_class}/{quant}: the implementations ranked per case."""
    p = request.path_params
    key = operators.OperatorKey(p["arch"], p["op_class"], p["sub_class"], p["quant"])
    cat = catalog(request)
    entries = operators.group(cat.kernels()).get(key) if cat.kernels() else None
    if not entries:
        return _error(request, ZooError("NOT_FOUND", f"no operator {key.path!r}"))
    reference = operators.reference_of(entries)
    case_boards = operators.boards(entries, reference)
    doc = await rankings.operator_doc(request, key.path)
    history = app_state(request).history
    charts = await run_in_threadpool(operators.best_over_time, history, doc)
    values, declared, older = await run_in_threadpool(_operator_extras, history, entries)
    for board in case_boards:
        for standing in board.standings:
            standing.secondary = values.get(standing.kernel_id, {}).get(board.case_id, {})
            standing.older_harness = board.case_id in older.get(standing.kernel_id, ())
    return _render(request, "operator.html", {
        "title": key.path, "key": key, "boards": case_boards, "entries": entries, "reference": reference,
        "doc": doc, "rows": {k["kernel_id"]: k for k in doc["kernels"]},
        "params": {c["test_case_id"]: c["params"] for c in doc["cases"]}, "charts": charts,
        "declared": declared, "reference_tag": operators.REFERENCE_TAG,
        "reference_names": operators.REFERENCE_NAMES})


# -- kernel page ----------------------------------------------------------------------------------

def _case_charts(points: list[HistoryPoint], primaries: Mapping[str, str], units: Mapping[str, str]) -> list[Any]:
    """One small chart per case: its primary metric over the accepted runs (x = accept rank)."""
    by_case: dict[str, list[tuple[float, float, str, str]]] = {}
    for rank, point in enumerate(points, start=1):
        for case_id, metrics in point.metrics.items():
            metric = primaries.get(case_id) or next(iter(metrics), None)
            if metric in metrics:
                tip = (f"#{rank} {metric}={fmt_value(metrics[metric])} by {point.submitter} "
                       f"({short_sha(point.commit_sha)}, {when(point.time)})"
                       + (" — revoked" if point.revoked else ""))
                by_case.setdefault(case_id, []).append((rank, metrics[metric], tip, f"/commits/{point.commit_sha}"))
    charts = []
    for case_id in sorted(by_case, key=lambda c: list(primaries).index(c) if c in primaries else len(primaries)):
        series = by_case[case_id]
        ranks = [s[0] for s in series]
        charts.append(web_charts.line_chart(
            {case_id: series}, title=f"{case_id}: {primaries.get(case_id, '')}", unit=units.get(case_id, ""),
            x_labels={min(ranks): f"#{min(ranks)}", max(ranks): f"#{max(ranks)}"}))
    return charts


def _scorecard_rows(card: dict | None, primaries: Mapping[str, str], head_harness: str | None = None) -> list[dict[str, Any]]:
    """One row per case and metric (the primary first): best and current records, value None for a placeholder.

    A record measured under a harness other than ``head_harness`` (HEAD's benchmark.py
    blob) has ``older_harness`` set; records without a harness are never marked.
    """
    rows = []
    for case in card.get("cases") or [] if isinstance(card, dict) else []:
        if not isinstance(case, dict):
            continue
        case_id = str(case.get("test_case_id"))
        best_all = case.get("metrics_best")
        best_all = best_all if isinstance(best_all, dict) else {}
        current_all = case.get("metrics_current")
        current_all = current_all if isinstance(current_all, dict) else {}
        primary = primaries.get(case_id)
        for metric in sorted(set(best_all) | set(current_all), key=lambda name: (name != primary, name)):
            records = []
            for record in (best_all.get(metric), current_all.get(metric)):
                record = record if isinstance(record, dict) else {}
                records.append({"value": operators.measured_value(record), "submitter": record.get("submitter", ""),
                                "commit_sha": str(record.get("commit_sha") or ""),
                                "harness": str(record.get("harness") or ""),
                                "older_harness": scorecard.older_harness(record, head_harness)})
            rows.append({"case": case_id, "metric": metric, "primary": metric == primary, "best": records[0],
                         "current": records[1], "correctness": case.get("correctness_current") or ""})
    return rows


def _speed_of_light_rows(entry: Mapping[str, Any], desc: Mapping[str, Any], harness: HeadHarness | None,
                         ceilings: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per case: its primary metric's best and that best's speed of light, as ``GET /api/kernels/{id}``.

    The same document the API's ``speed_of_light`` is (:func:`kernel_speed_of_light`): the
    achieved bandwidth or flop/s of the case's best record and its % of the arch's peak.
    """
    facts = KernelFacts(dict(harness.params) if harness is not None else {}, desc.get("io_signature"))
    sol = kernel_speed_of_light(entry, facts, ceilings)
    rows = []
    for case in views.cases(entry):
        case_id = str(case.get("test_case_id"))
        rows.append({"case": case_id, "metric": str(case.get("primary_metric") or ""),
                     "unit": str(case.get("unit") or ""), "best": operators.measured_value(case.get("best")),
                     "sol": sol.get(case_id)})
    return rows


def _kernel_data(history: KernelHistory | None, kernel_id: str
                 ) -> tuple[dict | None, dict | None, list[HistoryPoint], HeadHarness | None]:
    if history is None:
        return None, None, [], None
    desc, card = history.package_docs(kernel_id)
    return desc, card, history.accepted(kernel_id), history.harness(kernel_id)


async def kernel_page(request: Request) -> Response:
    """GET /kernels/{kernel_id}: description, scorecard, speed of light, per-case history charts, every attempt."""
    kernel_id = request.path_params["kernel_id"]
    entry = catalog(request).get(kernel_id)
    if entry is None:
        return _error(request, ZooError("NOT_FOUND", f"no kernel {kernel_id!r}"))
    state = app_state(request)
    desc, card, points, harness = await run_in_threadpool(_kernel_data, state.history, kernel_id)
    digests = catalog(request).digests(state.history)
    head = (state.zoo.index() or {}).get("head")
    harness_hash = (await run_in_threadpool(digests.at, head, [kernel_id]))[kernel_id] if digests and head else None
    desc = desc if isinstance(desc, dict) else {}
    kernel_cases = views.cases(entry)
    primaries = {str(c.get("test_case_id")): str(c.get("primary_metric") or "") for c in kernel_cases}
    units = {str(c.get("test_case_id")): str(c.get("unit") or "") for c in kernel_cases}
    attempts, more = await run_in_threadpool(submission_list.recent, state.zoo,
                                             submission_list.Filters(kernel=kernel_id), 1, KERNEL_ATTEMPTS)
    attempts = [a for a in attempts if a["kernel_id"] == kernel_id]
    records = await run_in_threadpool(source_pages.kernel_records, request, kernel_id)
    quant = desc.get("quantization") if isinstance(desc.get("quantization"), dict) else {}
    return _render(request, "kernel.html", {
        "title": kernel_id, "kernel_id": kernel_id, "entry": entry, "desc": desc, "quant": quant,
        "category": views.category(entry), "operator": operators.key_of(entry).path,
        "status": views.status_of(entry), "valid": views.is_valid(entry), "problems": entry.get("problems") or [],
        "scorecard": _scorecard_rows(card, primaries, harness.blob if harness else None), "primaries": primaries, "points": list(reversed(points)),
        "charts": [c for c in _case_charts(points, primaries, units) if c is not None],
        "harness": harness, "attempts": attempts, "more_attempts": more, "records": records,
        "harness_unreviewed": ranking.unreviewed(entry), "harness_hash": harness_hash,
        "speed_of_light": _speed_of_light_rows(entry, desc, harness, ceilings_of(state.zoo)),
        "io": [i for i in desc.get("io_signature") or [] if isinstance(i, dict)]})


# -- commits ----------------------------------------------------------------------------------------

async def commit_page(request: Request) -> Response:
    """GET /commits/{sha}: a commit of the kernel repo: message, trailers, changed files, bounded diff."""
    sha = request.path_params["sha"].lower()
    history = app_state(request).history
    view = await run_in_threadpool(commits.read_commit, history.repo_path, sha) if history is not None else None
    if view is None:
        return _error(request, ZooError("NOT_FOUND", f"no commit {sha!r} (links use the full 40-digit SHA)"))
    trailers = dict(view.trailers)
    return _render(request, "commit.html", {
        "title": f"commit {sha[:10]}", "commit": view, "submission": trailers.get("Kz-Submission", ""),
        "max_diff": commits.MAX_DIFF_BYTES, "max_files": commits.MAX_FILES})


# -- submissions ----------------------------------------------------------------------------------

async def submissions_page(request: Request) -> Response:
    """GET /submissions: recent submissions, newest first, filtered by kernel, submitter and status."""
    filters = submission_list.Filters.from_query(request.query_params)
    page_no = _page_number(request)
    rows, more = await run_in_threadpool(submission_list.recent, app_state(request).zoo, filters, page_no)
    base = {"kernel": filters.kernel, "submitter": filters.submitter, "status": filters.status}
    return _render(request, "submissions.html", {
        "title": "Submissions", "filters": filters, "statuses": STATUSES, "rows": rows, "page": page_no,
        "newer_url": _url("/submissions", {**base, "page": page_no - 1}) if page_no > 1 else "",
        "older_url": _url("/submissions", {**base, "page": page_no + 1}) if more else ""})


def log_blocks(doc: Mapping[str, Any]) -> list[tuple[str, str, bool]]:
    """``(name, text, cut)`` for each log a status document carries (``logs`` / ``log_tails``).

    Each may be one text, a mapping of name to text, or a list of ``{name, text}``; only
    the last ``LOG_TAIL_CHARS`` of a text are kept (``cut`` says so).
    """
    blocks: list[tuple[str, str, bool]] = []
    for key in ("logs", "log_tails"):
        value = doc.get(key)
        if isinstance(value, str):
            items = [(key, value)]
        elif isinstance(value, Mapping):
            items = [(str(k), v) for k, v in value.items()]
        elif isinstance(value, list):
            items = [(str(v.get("name") or v.get("step") or key), v.get("text") or v.get("tail") or "")
                     for v in value if isinstance(v, Mapping)]
        else:
            items = []
        for name, text in items:
            text = text if isinstance(text, str) else str(text)
            blocks.append((name, text[-LOG_TAIL_CHARS:], len(text) > LOG_TAIL_CHARS))
    return blocks


def _submission_data(zoo: Service, view: SubmissionView, uuid: str,
                     digests: HarnessDigests | None = None) -> tuple[dict[str, Any], bool]:
    """The status document and whether retention removed the run's logs (file reads)."""
    doc = views.submission_doc(view, f"/api/submissions/{uuid}/status", zoo, digests)
    pruned = bool(doc.get("logs_url")) and logs.logs_doc(uuid, zoo.pending.run_folder(uuid))["pruned"]
    return doc, pruned


def _held_evidence(zoo: Service, doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The rule findings that held the submission, when it was ever held (a file read; [] otherwise)."""
    history = doc.get("history") or []
    was_held = any(isinstance(h, (list, tuple)) and len(h) > 1 and h[1] == Status.HELD for h in history)
    if not was_held:
        return []
    return [f for f in review.evidence_of(zoo, str(doc.get("uuid") or "")) if isinstance(f, dict)]


async def submission_page(request: Request) -> Response:
    """GET /submissions/{uuid}: status history, reasons with fix hints, results, logs; follows the job."""
    uuid = request.path_params["uuid"]
    state = app_state(request)
    try:
        view = await run_in_threadpool(state.zoo.submission, uuid)
    except ZooError as exc:
        return _error(request, exc)
    # submission_doc reads the run's log tails (a file): off the event loop
    doc, logs_pruned = await run_in_threadpool(_submission_data, state.zoo, view, uuid,
                                               state.catalog.digests(state.history))
    reasons = [r for r in doc.get("reasons") or [] if isinstance(r, dict)]  # each carries its hint
    doc = dict(doc, held_evidence=await run_in_threadpool(_held_evidence, state.zoo, doc))
    timeline = [{"seq": item[0], "status": item[1], "ts": item[2]} for item in doc.get("history") or []
                if isinstance(item, (list, tuple)) and len(item) >= 3]
    status = str(doc.get("status", ""))
    return _render(request, "submission.html", {
        "title": f"Submission {uuid[:8]}", "uuid": uuid, "doc": doc, "status": status,
        "terminal": is_terminal(status), "reasons": reasons, "timeline": timeline,
        "cases": [c for c in doc.get("cases") or [] if isinstance(c, dict)],
        "result": doc.get("result") if isinstance(doc.get("result"), dict) else {}, "logs": log_blocks(doc),
        "logs_pruned": logs_pruned})


# -- queue ------------------------------------------------------------------------------------------

def _listing(items: Any, key: str) -> list[dict[str, Any]]:
    if isinstance(items, Mapping):
        return [dict(v, **{key: v.get(key, k)}) if isinstance(v, Mapping) else {key: k} for k, v in items.items()]
    return [dict(i) for i in items or [] if isinstance(i, Mapping)]


async def queue_page(request: Request) -> Response:
    """GET /queue: per arch (live runners, runners seen, waiting), pending jobs, in flight, runners (refreshes)."""
    view = views.plain(await run_in_threadpool(app_state(request).zoo.queue_view))
    view = view if isinstance(view, dict) else {}
    return _render(request, "queue.html", {
        "title": "Queue", "pending": _listing(view.get("pending"), "uuid"),
        "in_flight": _listing(view.get("in_flight"), "uuid"), "runners": _listing(view.get("runners"), "runner_id"),
        "arches": _listing(view.get("arches"), "arch")})


ROUTES = [
    Route("/", home, methods=["GET"], name="page_leaderboard"),
    Route("/ops/{arch}/{op_class}/{sub_class}/{quant}", operator_page, methods=["GET"], name="page_operator"),
    Route("/kernels/{kernel_id:path}", kernel_page, methods=["GET"], name="page_kernel"),
    Route("/commits/{sha}", commit_page, methods=["GET"], name="page_commit"),
    Route("/submissions", submissions_page, methods=["GET"], name="page_submissions"),
    Route("/submissions/{uuid}", submission_page, methods=["GET"], name="page_submission"),
    Route("/queue", queue_page, methods=["GET"], name="page_queue"),
]
