"""The source API: a kernel's records, its files (listed or raw) and its package tarball at any record.

``rev`` names a record of the kernel (:mod:`kz_daemon.storage.revisions`): HEAD by
default, a full SHA or an unambiguous prefix of one. A file is served as text only
when it is UTF-8 (never as HTML: package files are untrusted and the API shares its
origin with the pages), with ``nosniff`` and a sandboxing CSP; anything else is
``application/octet-stream``.
"""
from __future__ import annotations

import posixpath
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from kz_daemon.api.shim_settings import AppState, app_state
from kz_daemon.api.spec import Op, Param
from kz_daemon.core.errors import ZooError
from kz_daemon.storage.history import KernelHistory
from kz_daemon.storage.revisions import KernelRevisions

#: Raw files and tarballs never run as a page of this origin, whatever a browser guesses.
RAW_HEADERS = {"X-Content-Type-Options": "nosniff", "Content-Security-Policy": "default-src 'none'; sandbox",
               "Cache-Control": "no-cache"}
#: Types served as what they are; everything else is text/plain (UTF-8) or octet-stream.
EXACT_TYPES = {".json": "application/json", ".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg",
               ".gif": "image/gif", ".gz": "application/gzip", ".pdf": "application/pdf"}

REV_PARAM = Param("rev", {"type": "string", "maxLength": 64},
                  "a record of the kernel: HEAD (default), a commit SHA or an unambiguous prefix (4+ hex digits)")


def revisions(state: AppState) -> KernelRevisions:
    """The source reader of an app's ``state`` (made on first use from its history reader or the zoo's repo)."""
    found = state.revisions
    if found is None:
        history = state.history
        if history is None:
            config = state.zoo.config
            history = KernelHistory(config.paths.repo, config.repo.branch)
        found = state.revisions = KernelRevisions(history)
    return found


def rev_of(request: Request) -> str | None:
    """The ``rev`` query parameter (400 when repeated)."""
    values = request.query_params.getlist("rev")
    if len(values) > 1:
        raise ZooError("BAD_REQUEST", f"query parameter rev is given {len(values)} times; give it once",
                       {"parameter": "rev"})
    return values[0] if values else None


def media_type(path: str, data: bytes) -> str:
    """What a package file is served as (see the module docstring)."""
    ext = posixpath.splitext(path)[1].lower()
    if ext in EXACT_TYPES:
        return EXACT_TYPES[ext]
    if b"\x00" not in data[:8192]:
        try:
            data.decode("utf-8")
            return "text/plain; charset=utf-8"
        except UnicodeDecodeError:
            pass
    return "application/octet-stream"


def tarball_name(kernel_id: str, commit: str) -> str:
    """``<kernel_id with '/' as '__'>@<sha10>.tar.gz``: the download's file name."""
    return f"{kernel_id.replace('/', '__')}@{commit[:10]}.tar.gz"


def files_doc(source: KernelRevisions, kernel_id: str, rev: str | None) -> dict[str, Any]:
    """The ``GET /api/kernels/{kernel_id}/files`` document."""
    record, entries, truncated = source.files(kernel_id, rev)
    base = f"/api/kernels/{kernel_id}"
    return {"kernel_id": kernel_id, "commit": record.commit, "record": record.to_json(),
            "files": [dict(e.to_json(), url=f"{base}/files/{e.path}?rev={record.commit}") for e in entries],
            "truncated": truncated, "tarball_url": f"{base}/tarball?rev={record.commit}"}


def commits_doc(source: KernelRevisions, kernel_id: str) -> dict[str, Any]:
    """The ``GET /api/kernels/{kernel_id}/commits`` document (newest first)."""
    return {"kernel_id": kernel_id, "commits": [r.to_json() for r in source.records(kernel_id)]}


async def list_files(request: Request) -> Response:
    """GET /api/kernels/{kernel_id}/files?rev=: every file of the package at a record, with sizes."""
    doc = await run_in_threadpool(files_doc, revisions(app_state(request)), request.path_params["kernel_id"], rev_of(request))
    return JSONResponse(doc)


async def get_file(request: Request) -> Response:
    """GET /api/kernels/{kernel_id}/files/{path}?rev=: one file's bytes at a record."""
    kernel_id, path = request.path_params["kernel_id"], request.path_params["path"]
    record, data = await run_in_threadpool(revisions(app_state(request)).read, kernel_id, path, rev_of(request))
    headers = dict(RAW_HEADERS, **{"X-Kz-Commit": record.commit})
    return Response(data, media_type=media_type(path, data), headers=headers)


async def get_tarball(request: Request) -> Response:
    """GET /api/kernels/{kernel_id}/tarball?rev=: the package at a record as a submittable tar.gz."""
    kernel_id = request.path_params["kernel_id"]
    record, data = await run_in_threadpool(revisions(app_state(request)).tarball, kernel_id, rev_of(request))
    name = tarball_name(kernel_id, record.commit)
    headers = dict(RAW_HEADERS, **{"X-Kz-Commit": record.commit,
                                   "Content-Disposition": f'attachment; filename="{name}"'})
    return Response(data, media_type="application/gzip", headers=headers)


async def list_commits(request: Request) -> Response:
    """GET /api/kernels/{kernel_id}/commits: the kernel's records, newest first."""
    doc = await run_in_threadpool(commits_doc, revisions(app_state(request)), request.path_params["kernel_id"])
    return JSONResponse(doc)


_ERRORS = {400: "api_error", 404: "api_error", 409: "api_error"}

#: Listed before the public API's ``/api/kernels/{kernel_id:path}``, which would swallow these paths.
OPS: list[Op] = [
    Op("GET", "/api/kernels/{kernel_id:path}/files/{path:path}", get_file, "getKernelFile",
       "One file of a kernel's package at a record (HEAD by default), as bytes", "kernels",
       params=(REV_PARAM,), responses={200: None, **_ERRORS}, content_type="application/octet-stream"),
    Op("GET", "/api/kernels/{kernel_id:path}/files", list_files, "listKernelFiles",
       "The files of a kernel's package at a record (HEAD by default), with sizes", "kernels",
       params=(REV_PARAM,), responses={200: "api_kernel_files", **_ERRORS}),
    Op("GET", "/api/kernels/{kernel_id:path}/tarball", get_tarball, "getKernelTarball",
       "A kernel's package at a record as a submittable tar.gz (bench_result.yaml left out)", "kernels",
       params=(REV_PARAM,), responses={200: None, **_ERRORS}, content_type="application/gzip"),
    Op("GET", "/api/kernels/{kernel_id:path}/commits", list_commits, "listKernelCommits",
       "A kernel's records: the commits that changed its package, newest first", "kernels",
       responses={200: "api_kernel_commits", 404: "api_error"}),
]
