"""The kernel's source on the web: its files at any record, highlighted; the diff between two records.

``/kernels/{kernel_id}/source?rev=&path=`` lists the package's files at a record and
shows one, highlighted on the server by Pygments with CSS classes only (the pages'
CSP allows no inline style or script); Pygments escapes the text it wraps, so the
markup is ours and the file's characters stay text. ``/kernels/{kernel_id}/diff?from=&to=``
diffs the package between two records. ``/highlight.css`` is the Pygments style sheet.
Downloads link to the API's tarball of the record (``kz_daemon.browse.source_api``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dulwich.repo import Repo
from markupsafe import Markup
from pygments import highlight as pygments_highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import TextLexer, get_lexer_for_filename
from pygments.util import ClassNotFound
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from kz_daemon.api.shim_settings import app_state
from kz_daemon.browse.source_api import revisions, tarball_name
from kz_daemon.core.errors import ZooError
from kz_daemon.storage.revisions import KernelRevisions, Record
from kz_daemon.web import commits
from kz_daemon.web.render import PAGE_HEADERS, TEMPLATES

#: Files above this are listed and downloadable but not highlighted (the page would be unreadable).
MAX_HIGHLIGHT_BYTES = 512 * 1024
STYLE = "default"
_FORMATTER = HtmlFormatter(style=STYLE, cssclass="highlight", linenos="table", lineanchors="L",
                           anchorlinenos=True, wrapcode=True)
#: The file a source page opens when none is asked for: the reference source, else these.
DEFAULT_FILES = (".kernel_package/desc.yaml", ".kernel_package/benchmark.py")


@dataclass(frozen=True)
class Shown:
    """The file a source page shows: its path, size, language and highlighted HTML (None: not shown)."""

    path: str
    size: int
    language: str
    html: Markup | None
    why_not: str = ""


def highlight(path: str, data: bytes) -> Shown:
    """One file as highlighted HTML (escaped by Pygments); binary and huge files are not shown."""
    if len(data) > MAX_HIGHLIGHT_BYTES:
        return Shown(path, len(data), "", None, f"larger than {MAX_HIGHLIGHT_BYTES // 1024} KiB")
    try:
        if b"\x00" in data:
            raise UnicodeDecodeError("utf-8", data, 0, 1, "NUL byte")
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return Shown(path, len(data), "", None, "binary (not UTF-8 text)")
    try:
        lexer = get_lexer_for_filename(path, text, stripnl=False)
    except ClassNotFound:
        lexer = TextLexer(stripnl=False)
    return Shown(path, len(data), lexer.name, Markup(pygments_highlight(text, lexer, _FORMATTER)))


def style_sheet() -> str:
    """The CSS for the highlighted code's classes."""
    return _FORMATTER.get_style_defs(".highlight")


def _render(request: Request, name: str, context: dict[str, Any], status: int = 200) -> Response:
    return TEMPLATES.TemplateResponse(request, name, context, status_code=status, headers=PAGE_HEADERS)


def _error(request: Request, exc: ZooError) -> Response:
    return _render(request, "error.html", {"title": exc.code, "error": exc}, exc.http_status)


def kernel_records(request: Request, kernel_id: str) -> list[dict[str, Any]]:
    """The kernel's records for its page (newest first, each with its previous record); [] when unreadable."""
    try:
        records = revisions(app_state(request)).records(kernel_id)
    except ZooError:
        return []
    return [{"record": r, "previous": records[i + 1].commit if i + 1 < len(records) else None,
             "download": tarball_name(kernel_id, r.commit)} for i, r in enumerate(records)]


def _source_data(source: KernelRevisions, kernel_id: str, rev: str | None, path: str | None) -> dict[str, Any]:
    record, files, truncated = source.files(kernel_id, rev)
    records = source.records(kernel_id)
    paths = [f.path for f in files]
    if not path:
        desc_refs = []
        try:
            from kz_runner.contract.yamlio import load_yaml

            desc = load_yaml(source.read(kernel_id, ".kernel_package/desc.yaml", record.commit)[1])
            desc_refs = [str(r).strip("/") for r in (desc or {}).get("reference_sources") or []] \
                if isinstance(desc, dict) else []
        except Exception:  # a broken desc.yaml still has a source page: open another file
            desc_refs = []
        path = next((p for p in [*desc_refs, *DEFAULT_FILES] if p in paths), paths[0] if paths else None)
    shown = None
    if path is not None:
        _record, data = source.read(kernel_id, path, record.commit)
        shown = highlight(path, data)
    index = next(i for i, r in enumerate(records) if r.commit == record.commit)
    previous = records[index + 1].commit if index + 1 < len(records) else None
    return {"record": record, "files": files, "truncated": truncated, "shown": shown,
            "newest": records[0].commit == record.commit, "previous": previous,
            "download": tarball_name(kernel_id, record.commit)}


def _kernel_id(request: Request) -> str:
    """The kernel_id of a five-segment route (see ``ROUTES``)."""
    p = request.path_params
    return "/".join(p[k] for k in ("arch", "op_class", "sub_class", "quant", "name"))


async def source_page(request: Request) -> Response:
    """GET /kernels/{kernel_id}/source?rev=&path=: the package's files at a record, one of them highlighted."""
    kernel_id = _kernel_id(request)
    q = request.query_params
    try:
        data = await run_in_threadpool(_source_data, revisions(app_state(request)), kernel_id, q.get("rev") or None,
                                       q.get("path") or None)
    except ZooError as exc:
        return _error(request, exc)
    return _render(request, "source.html", {"title": f"{kernel_id} source", "kernel_id": kernel_id, **data})


def _diff_data(source: KernelRevisions, repo_path: Any, kernel_id: str, old: str | None,
               new: str | None) -> dict[str, Any]:
    before, after = source.trees(kernel_id, old, new)
    with Repo(str(repo_path)) as repo:
        files, files_cut, lines, diff_cut = commits.tree_diff(repo, before.tree.encode(), after.tree.encode())
    return {"before": before, "after": after, "records": source.records(kernel_id), "files": files,
            "files_truncated": files_cut, "diff": lines, "diff_truncated": diff_cut}


async def diff_page(request: Request) -> Response:
    """GET /kernels/{kernel_id}/diff?from=&to=: the package's changes between two records (``from`` defaults
    to the record before ``to``, ``to`` to the newest)."""
    kernel_id = _kernel_id(request)
    q = request.query_params
    source = revisions(app_state(request))
    try:
        data = await run_in_threadpool(_diff_data, source, source.history.repo_path, kernel_id,
                                       q.get("from") or None, q.get("to") or None)
    except ZooError as exc:
        return _error(request, exc)
    return _render(request, "diff.html", {"title": f"{kernel_id} diff", "kernel_id": kernel_id,
                                          "max_diff": commits.MAX_DIFF_BYTES, "max_files": commits.MAX_FILES,
                                          **data})


async def highlight_css(request: Request) -> Response:
    """GET /highlight.css: the style sheet of the highlighted source."""
    return Response(style_sheet(), media_type="text/css; charset=utf-8",
                    headers={"Cache-Control": "public, max-age=3600", "X-Content-Type-Options": "nosniff"})


#: A kernel_id has exactly five segments, so ``/kernels/<five>/source`` is never a kernel's own page
#: (a kernel named ``source`` is ``/kernels/<four>/source``). Registered before the kernel page's
#: ``/kernels/{kernel_id:path}``, which would swallow these paths.
_KERNEL = "/kernels/{arch}/{op_class}/{sub_class}/{quant}/{name}"
ROUTES = [
    Route(_KERNEL + "/source", source_page, methods=["GET"], name="page_kernel_source"),
    Route(_KERNEL + "/diff", diff_page, methods=["GET"], name="page_kernel_diff"),
    Route("/highlight.css", highlight_css, methods=["GET"], name="page_highlight_css"),
]

__all__ = ["ROUTES", "Record", "Shown", "highlight", "kernel_records", "style_sheet"]
