"""The web leaderboard: server-rendered pages that work without JavaScript.

``/`` leaderboard (one row per kernel and case, filterable, sortable), ``/kernels/{id}``
kernel page, ``/submissions/{uuid}`` live submission page, ``/queue``.
"""
from __future__ import annotations

import urllib.parse
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from kz_daemon.errors import ZooError
from kz_daemon.http import views
from kz_daemon.http.api import catalog
from kz_daemon.http.render import (fmt_value, h, markdown, page, short_sha, svg_chart, table, when)

ROWS_PER_PAGE = 500
SORT_KEYS = ("kernel", "case", "best", "current")


#: Defence in depth on top of escaping: only our own script and stylesheet run on the pages.
PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def _html(text: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(text, status_code=status, headers=PAGE_HEADERS)


def _error_page(exc: ZooError) -> HTMLResponse:
    body = f'<h1>{h(exc.code)}</h1><p>{h(exc.message)}</p><p><a href="/">Back to the leaderboard</a></p>'
    return _html(page(exc.code, body), exc.http_status)


def _kernel_link(kernel_id: str) -> str:
    return f'<a href="/kernels/{h(urllib.parse.quote(kernel_id))}">{h(kernel_id)}</a>'


def _rows(entries: list[dict[str, Any]], case_filter: str) -> list[dict[str, Any]]:
    rows = []
    for entry in entries:
        kernel_cases = views.cases(entry) or [{}]
        for case in kernel_cases:
            case_id = str(case.get("test_case_id", ""))
            if case_filter and case_id != case_filter:
                continue
            best = views.case_metric(case, "best")
            current = views.case_metric(case, "current")
            rows.append({"entry": entry, "case": case_id, "metric": case.get("primary_metric", ""),
                         "direction": ", ".join(str(x) for x in (case.get("unit"), case.get("direction")) if x),
                         "best": best, "current": current})
    return rows


def _sort_rows(rows: list[dict[str, Any]], key: str, order: str) -> list[dict[str, Any]]:
    reverse = order == "desc"
    if key in ("best", "current"):
        with_value = [r for r in rows if views.metric_value(r[key]) is not None]
        without = [r for r in rows if views.metric_value(r[key]) is None]
        with_value.sort(key=lambda r: views.metric_value(r[key]), reverse=reverse)
        return with_value + without
    if key == "case":
        return sorted(rows, key=lambda r: (r["case"], r["entry"].get("kernel_id", "")), reverse=reverse)
    return sorted(rows, key=lambda r: (r["entry"].get("kernel_id", ""), r["case"]), reverse=reverse)


def _select(name: str, label: str, options: list[str], chosen: str) -> str:
    opts = ['<option value="">any</option>'] + [
        f'<option value="{h(o)}"{" selected" if o == chosen else ""}>{h(o)}</option>' for o in options
    ]
    return f'<label>{h(label)}<select name="{h(name)}">{"".join(opts)}</select></label>'


async def leaderboard(request: Request) -> Response:
    """GET /: the leaderboard, one row per kernel and case."""
    q = request.query_params
    filters = {k: q.get(k, "") for k in ("arch", "op_class", "sub_class", "quant")}
    text = q.get("q", "").strip()
    case_filter = q.get("case", "").strip()
    sort = q.get("sort", "kernel")
    sort = sort if sort in SORT_KEYS else "kernel"
    order = "desc" if q.get("order") == "desc" else "asc"
    try:
        page_no = max(1, int(q.get("page", "1")))
    except ValueError:
        page_no = 1
    cat = catalog(request)
    facets = cat.memo(("facets",), cat.facets)
    key = ("rows", tuple(sorted(filters.items())), text, case_filter, sort, order)
    rows = cat.memo(key, lambda: _sort_rows(_rows(cat.select(filters, text), case_filter), sort, order))
    total = len(rows)
    shown = rows[(page_no - 1) * ROWS_PER_PAGE: page_no * ROWS_PER_PAGE]

    def sort_link(key: str, label: str) -> str:
        params = {k: v for k, v in q.items() if k not in ("sort", "order", "page")}
        params["sort"] = key
        params["order"] = "desc" if (sort == key and order == "asc") else "asc"
        arrow = (" ▲" if order == "asc" else " ▼") if sort == key else ""
        return f'<a href="/?{h(urllib.parse.urlencode(params))}">{h(label)}{arrow}</a>'

    headers = [sort_link("kernel", "kernel"), "name", "arch", "op_class", "quant",
               sort_link("case", "case"), "primary metric",
               sort_link("best", "best"), "best by", "best commit", sort_link("current", "current"),
               "status"]
    body_rows = []
    for r in shown:
        entry = r["entry"]
        cat_of = views.category(entry)
        best, current = r["best"], r["current"]
        best_v, cur_v = views.metric_value(best), views.metric_value(current)
        status = views.status_of(entry) + ("" if views.is_valid(entry) else " (invalid)")
        body_rows.append([
            _kernel_link(str(entry.get("kernel_id", ""))), h(entry.get("name", "")), h(cat_of["arch"]),
            h(cat_of["op_class"]), h(cat_of["quant"]), h(r["case"]),
            h(r["metric"]) + (f' <span class="muted">({h(r["direction"])})</span>' if r["direction"] else ""),
            f'<span data-value="{h("" if best_v is None else best_v)}">{h(fmt_value(best_v))}</span>',
            h(best.get("submitter", "")), h(short_sha(best.get("commit_sha"))),
            f'<span data-value="{h("" if cur_v is None else cur_v)}">{h(fmt_value(cur_v))}</span>',
            h(status),
        ])
    form = ('<form class="filters" method="get" action="/">'
            + _select("arch", "arch", facets["arch"], filters["arch"])
            + _select("op_class", "op_class", facets["op_class"], filters["op_class"])
            + _select("sub_class", "sub_class", facets["sub_class"], filters["sub_class"])
            + _select("quant", "quant", facets["quant"], filters["quant"])
            + f'<label>case<input name="case" value="{h(case_filter)}" size="12"></label>'
            + f'<label>search<input name="q" value="{h(text)}" size="20"></label>'
            + '<button type="submit">Filter</button> <a href="/">reset</a></form>')
    pager = ""
    if total > ROWS_PER_PAGE:
        links = []
        for n in range(1, (total + ROWS_PER_PAGE - 1) // ROWS_PER_PAGE + 1):
            params = dict(q.items())
            params["page"] = str(n)
            links.append(f"<strong>{n}</strong>" if n == page_no
                         else f'<a href="/?{h(urllib.parse.urlencode(params))}">{n}</a>')
        pager = '<p class="pager">Page ' + " ".join(links) + "</p>"
    body = (f"<h1>Leaderboard</h1>{form}"
            f'<p class="muted"><span id="row-count">{total}</span> rows (kernel × case) · '
            f"{len(cat.kernels())} kernels</p>"
            + (table([], body_rows, cls="sortable leaderboard", header_html=headers) if shown
               else '<p class="empty">No kernels match these filters.</p>') + pager)
    return _html(page("Leaderboard", body))


def _io_table(io: Any) -> str:
    if not isinstance(io, list) or not io:
        return '<p class="empty">No io_signature.</p>'
    rows = []
    for item in io:
        if not isinstance(item, dict):
            continue
        shape = item.get("shape")
        rows.append([h(item.get("name")), h(item.get("kind")), h(item.get("dtype")),
                     h(" × ".join(str(s) for s in shape) if isinstance(shape, list) else shape),
                     h(item.get("shape_desc", "")), h(item.get("semantics", ""))])
    return table(["name", "kind", "dtype", "shape", "shape_desc", "semantics"], rows, cls="io")


def _scorecard_rows(scorecard: Any, entry: dict[str, Any]) -> list[list[str]]:
    primaries = {str(c.get("test_case_id")): c.get("primary_metric") for c in views.cases(entry)}
    rows = []
    cases = scorecard.get("cases") if isinstance(scorecard, dict) else None
    for case in cases or []:
        if not isinstance(case, dict):
            continue
        case_id = str(case.get("test_case_id"))
        best_all = case.get("metrics_best") or {}
        current_all = case.get("metrics_current") or {}
        primary = primaries.get(case_id)
        for metric in sorted(set(best_all) | set(current_all), key=lambda m: (m != primary, m)):
            best = best_all.get(metric) or {}
            current = current_all.get(metric) or {}
            label = h(metric) + (" <strong>(primary)</strong>" if metric == primary else "")
            rows.append([h(case_id), label,
                         h(fmt_value(best.get("value"))), h(best.get("submitter")),
                         h(short_sha(best.get("commit_sha"))),
                         h(fmt_value(current.get("value"))), h(current.get("submitter")),
                         h(short_sha(current.get("commit_sha"))), h(case.get("correctness_current"))])
    return rows


async def kernel_page(request: Request) -> Response:
    """GET /kernels/{kernel_id}: description, io_signature, scorecard, accepted history chart."""
    kernel_id = request.path_params["kernel_id"]
    entry = catalog(request).get(kernel_id)
    if entry is None:
        return _error_page(ZooError("NOT_FOUND", f"no kernel {kernel_id!r}"))
    history = request.app.state.history
    desc, scorecard, points = None, None, []
    if history is not None:
        desc, scorecard = await run_in_threadpool(history.package_docs, kernel_id)
        points = await run_in_threadpool(history.accepted, kernel_id)
    desc = desc if isinstance(desc, dict) else {}
    cat_of = views.category(entry)
    quant = desc.get("quantization") if isinstance(desc.get("quantization"), dict) else {}
    meta_rows = [
        ["kernel_id", h(kernel_id)],
        ["category", h(" / ".join(cat_of[k] for k in views.CATEGORY_FIELDS))],
        ["status", h(views.status_of(entry)) + ("" if views.is_valid(entry) else " <strong>(invalid)</strong>")],
        ["quantization", h(", ".join(f"{k}={v}" for k, v in quant.items()))],
        ["reference_sources", h(", ".join(str(s) for s in desc.get("reference_sources") or []))],
        ["owner", h(desc.get("owner", ""))],
        ["tags", h(", ".join(str(t) for t in desc.get("tags") or []))],
    ]
    problems = entry.get("problems") or entry.get("reasons") or []
    problem_html = ""
    if problems:
        problem_html = "<h2>Problems</h2><ul>" + "".join(
            f"<li>{h(p.get('code', '') + ': ' + p.get('message', '') if isinstance(p, dict) else p)}</li>"
            for p in problems) + "</ul>"
    primaries = {str(c.get("test_case_id")): c.get("primary_metric") for c in views.cases(entry)}
    series: dict[str, list[tuple[float, float, str]]] = {}
    # x is the accept's rank (accepts often share a second; ranks keep them apart)
    for rank, point in enumerate(points, start=1):
        for case_id, metrics in point.metrics.items():
            metric = primaries.get(case_id) or next(iter(metrics), None)
            if metric in metrics:
                tip = (f"#{rank} {case_id} {metric}={fmt_value(metrics[metric])} by {point.submitter} "
                       f"({short_sha(point.commit_sha)}, {when(point.time)})")
                series.setdefault(f"{case_id}: {metric}", []).append((rank, metrics[metric], tip))
    x_labels = (f"#1 {when(points[0].time)}", f"#{len(points)} {when(points[-1].time)}") if points else None
    history_rows = [[h(when(p.time)), h(p.submitter), h(short_sha(p.commit_sha)),
                     h("; ".join(f"{c}: {fmt_value(m.get(primaries.get(c) or '', next(iter(m.values()), None)))}"
                                 for c, m in sorted(p.metrics.items())))]
                    for p in reversed(points)]
    body = (
        f'<h1>{h(desc.get("name") or entry.get("name") or kernel_id)}</h1>'
        f'<p class="summary">{h(desc.get("summary") or entry.get("summary", ""))}</p>'
        + table(["field", "value"], meta_rows, cls="meta") + problem_html
        + "<h2>Scorecard (best and current)</h2>"
        + (table(["case", "metric", "best", "best by", "best commit", "current", "current by",
                  "current commit", "correctness"], _scorecard_rows(scorecard, entry), cls="scorecard")
           if scorecard else '<p class="empty">No scorecard.</p>')
        + "<h2>Accepted history</h2>" + svg_chart(series, x_labels=x_labels)
        + (table(["when", "submitter", "commit", "primary metric per case"], history_rows, cls="history")
           if history_rows else "")
        + "<h2>io_signature</h2>" + _io_table(desc.get("io_signature"))
        + '<h2>Description</h2><div class="description">' + markdown(desc.get("description")) + "</div>"
    )
    return _html(page(kernel_id, body))


async def submission_page(request: Request) -> Response:
    """GET /submissions/{uuid}: status, reasons, per-case results; follows the job while it runs."""
    uuid = request.path_params["uuid"]
    try:
        view = await run_in_threadpool(request.app.state.zoo.submission, uuid)
    except ZooError as exc:
        return _error_page(exc)
    doc = views.submission_doc(view, f"/api/submissions/{uuid}/status", request.app.state.zoo)
    status = str(doc.get("status", ""))
    head = "" if doc["terminal"] else '<noscript><meta http-equiv="refresh" content="3"></noscript>'
    rows = [["uuid", h(uuid)],
            ["kernel", _kernel_link(str(doc.get("kernel_id", ""))) if doc.get("kernel_id") else ""],
            ["submitter", h(doc.get("submitter_id", ""))],
            ["status", f'<span id="status" class="status status-{h(status)}">{h(status)}</span>'],
            ["commit", h(doc.get("commit_sha") or "")],
            ["attempts", h(doc.get("attempts", ""))]]
    reasons = doc.get("reasons") or []
    reason_html = ""
    if reasons:
        reason_html = "<h2>Reasons</h2><ul class=\"reasons\">" + "".join(
            f"<li>{h((r.get('code', '') + ': ' if r.get('code') else '') + str(r.get('message', '')))}</li>"
            if isinstance(r, dict) else f"<li>{h(r)}</li>" for r in reasons) + "</ul>"
    case_rows = []
    for case in doc.get("cases") or []:
        if isinstance(case, dict):
            case_rows.append([h(case.get("test_case_id")), h(case.get("correctness")), h(case.get("accept")),
                              h(case.get("primary_metric")), h(fmt_value(case.get("value")))])
    timeline = []
    for item in doc.get("history") or []:
        if isinstance(item, dict):
            timeline.append([h(item.get("ts") or item.get("at", "")), h(item.get("status", ""))])
        elif isinstance(item, (list, tuple)) and len(item) >= 3:
            timeline.append([h(item[2]), h(item[1])])
    body = (f'<h1>Submission</h1><div id="live" data-status-url="/api/submissions/{h(uuid)}/status" '
            f'data-status="{h(status)}">' if not doc["terminal"] else "<h1>Submission</h1><div>")
    body += (table(["field", "value"], rows, cls="meta") + reason_html
             + ("<h2>Cases</h2>" + table(["case", "correctness", "accept", "primary metric", "value"],
                                         case_rows, cls="cases") if case_rows else "")
             + ("<h2>Timeline</h2>" + table(["when", "status"], timeline) if timeline else "")
             + "</div>")
    return _html(page(f"Submission {uuid[:8]}", body, head=head))


def _queue_rows(items: Any, columns: tuple[str, ...]) -> list[list[str]]:
    rows = []
    if isinstance(items, dict):
        key = columns[0]
        items = [dict(v, **{key: v.get(key, k)}) if isinstance(v, dict) else {key: k, "value": v}
                 for k, v in items.items()]
    for item in items or []:
        if isinstance(item, dict):
            cells = []
            for col in columns:
                value = item.get(col, "")
                if col == "uuid" and value:
                    cells.append(f'<a href="/submissions/{h(value)}">{h(str(value)[:8])}</a>')
                elif col == "kernel_id" and value:
                    cells.append(_kernel_link(str(value)))
                elif col in ("lease_expires_at", "last_seen") and isinstance(value, (int, float)):
                    cells.append(h(when(value)))
                else:
                    cells.append(h(value if not isinstance(value, (dict, list)) else views.plain(value)))
            rows.append(cells)
        else:
            rows.append([h(item)] + [""] * (len(columns) - 1))
    return rows


async def queue_page(request: Request) -> Response:
    """GET /queue: pending jobs, jobs in flight, runners seen."""
    view = views.plain(await run_in_threadpool(request.app.state.zoo.queue_view))
    view = view if isinstance(view, dict) else {}
    pending_cols = ("uuid", "kernel_id", "arch", "submitter_id")
    flight_cols = ("uuid", "kernel_id", "runner_id", "attempt", "lease_expires_at")
    runner_cols = ("runner_id", "arch", "host", "gpu", "last_seen")
    pending = _queue_rows(view.get("pending"), pending_cols)
    flight = _queue_rows(view.get("in_flight"), flight_cols)
    runners = _queue_rows(view.get("runners"), runner_cols)
    body = ("<h1>Queue</h1>"
            f'<h2>Pending (<span id="pending-count">{len(pending)}</span>)</h2>'
            + (table(list(pending_cols), pending) if pending else '<p class="empty">Nothing pending.</p>')
            + f'<h2>In flight (<span id="flight-count">{len(flight)}</span>)</h2>'
            + (table(list(flight_cols), flight) if flight else '<p class="empty">Nothing running.</p>')
            + f'<h2>Runners seen (<span id="runner-count">{len(runners)}</span>)</h2>'
            + (table(list(runner_cols), runners) if runners else '<p class="empty">No runner seen yet.</p>'))
    return _html(page("Queue", body, head='<meta http-equiv="refresh" content="5">'))


ROUTES = [
    Route("/", leaderboard, methods=["GET"], name="page_leaderboard"),
    Route("/kernels/{kernel_id:path}", kernel_page, methods=["GET"], name="page_kernel"),
    Route("/submissions/{uuid}", submission_page, methods=["GET"], name="page_submission"),
    Route("/queue", queue_page, methods=["GET"], name="page_queue"),
]
