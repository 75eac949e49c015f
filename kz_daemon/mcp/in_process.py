"""The daemon's own MCP endpoint: the tool set over its service layer, served at ``/mcp/``.

:class:`ServiceBackend` answers the tools from the running app's state (the ``Zoo``,
its catalogue and the git readers) with the same functions the HTTP API uses, so a
tool and its endpoint answer alike. A submission goes through the upload handler itself,
in process, with the MCP request's headers and address: one set of upload rules.

:class:`McpEndpoint` is the ASGI app mounted at ``/mcp``: the SDK's streamable HTTP
transport, stateless with JSON answers (each POST stands alone, so the daemon keeps
no MCP sessions). Its session manager runs inside the app's lifespan; a new one is
made for each lifespan, as the SDK's can run only once.
"""
from __future__ import annotations

import contextlib
import io
import json
import time
import uuid as uuidlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from kz_daemon.api import public, views
from kz_daemon.api.shim_settings import AppState, state_of
from kz_daemon.board import ranking
from kz_daemon.browse.source_api import files_doc, revisions
from kz_daemon.core.errors import ZooError
from kz_daemon.mcp.toolset import build_server
from kz_daemon.storage.run_logs import logs_doc
from kz_runner.contract.validate import validate_tarball

#: A long poll re-checks for a change at least this often (seconds).
POLL_SLICE_S = 1.0


def _status_url(uuid: str) -> str:
    return f"/api/submissions/{uuid}/status"


def multipart(fields: dict[str, str], file_field: str, filename: str, data: bytes) -> tuple[bytes, str]:
    """``(body, content type)`` of a multipart/form-data upload: the form fields, then the file."""
    boundary = f"kz-mcp-{uuidlib.uuid4().hex}"
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
             for name, value in fields.items()]
    parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{file_field}"; filename="{filename}"\r\n'
                 f"Content-Type: application/gzip\r\n\r\n".encode() + data + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


class ServiceBackend:
    """The tools' backend inside the daemon: the app's state, no HTTP round trip."""

    local_paths = False

    def __init__(self, app: Starlette) -> None:
        self.app = app

    @property
    def state(self) -> AppState:
        """The app's shared objects (zoo, catalogue, history, settings, limits), typed."""
        return state_of(self.app)

    def kernels(self) -> list[dict[str, Any]]:
        """Every index entry, from the catalogue the API lists."""
        return public.catalog_of(self.state).kernels()

    def kernel(self, kernel_id: str) -> dict[str, Any]:
        """The index entry with desc.yaml and bench_result.yaml at HEAD (as ``GET /api/kernels/{id}``)."""
        entry = public.catalog_of(self.state).get(kernel_id)
        if entry is None:
            raise ZooError("NOT_FOUND", f"no kernel {kernel_id!r}; list_kernels lists them", {"kernel_id": kernel_id})
        doc = dict(entry)
        doc[ranking.HARNESS] = ranking.UNREVIEWED if ranking.unreviewed(entry) else ranking.REVIEWED
        if self.state.history is not None:
            doc["desc"], doc["bench_result"] = self.state.history.package_docs(kernel_id)
        return views.plain(doc)

    def files(self, kernel_id: str, rev: str | None) -> dict[str, Any]:
        """The package's files at a record."""
        return files_doc(revisions(self.state), kernel_id, rev)

    def file(self, kernel_id: str, path: str, rev: str | None) -> bytes:
        """One file's bytes at a record."""
        return revisions(self.state).read(kernel_id, path, rev)[1]

    def validate(self, *, path: str | None, tarball: bytes | None) -> dict[str, Any]:
        """The intake validator's report of a tarball, the static rules included (never a server path)."""
        if tarball is None or path is not None:
            raise ZooError("BAD_REQUEST", "over HTTP a package is sent as tarball_base64")
        if len(tarball) > self.state.settings.max_upload_bytes:
            raise ZooError("PAYLOAD_TOO_LARGE", f"the package is larger than the server's limit of "
                           f"{self.state.settings.max_upload_bytes} bytes")
        limits = self.state.zoo.config.limits.contract_limits
        report = validate_tarball(io.BytesIO(tarball), "package.tar.gz", limits=limits, rules=True)
        return views.plain(report.to_json())

    def submit(self, *, path: str | None, tarball: bytes | None, kernel_id: str | None,
               submitter: str | None, request: Request | None = None) -> dict[str, Any]:
        """An upload exactly as ``POST /api/submissions`` takes it, answered after intake.

        The upload handler itself is called in process with the MCP request's headers
        (token, ``X-Submitter-Id``, ``Idempotency-Key``) and address, so the rules of an
        upload (authorisation, rate limits, disk headroom, size cap, intake) are the
        API's own, not a second copy. Runs in a worker thread of the app's event loop.
        """
        if tarball is None or path is not None:
            raise ZooError("BAD_REQUEST", "over HTTP a package is sent as tarball_base64")
        if request is None:
            raise ZooError("BAD_REQUEST", "a submission needs the HTTP request it came with")
        if not kernel_id:  # the tarball's top directories, as kz submit reads them
            kernel_id = validate_tarball(io.BytesIO(tarball), "package.tar.gz").facts.get("kernel_id") or ""
        fields = {"kernel_id": kernel_id}
        if submitter:
            fields["submitter_id"] = submitter
        body, content_type = multipart(fields, "package", kernel_id.replace("/", "__") + ".tar.gz", tarball)
        kept = [(k, v) for k, v in request.scope.get("headers", [])
                if k.lower() in (b"authorization", b"x-submitter-id", b"idempotency-key", b"x-forwarded-for")]
        scope = dict(request.scope, app=self.app, method="POST", path="/api/submissions",
                     raw_path=b"/api/submissions", query_string=b"", root_path="",
                     headers=kept + [(b"content-type", content_type.encode()),
                                     (b"content-length", str(len(body)).encode())])
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        response = anyio.from_thread.run(public.create_submission, Request(scope, receive))
        return json.loads(bytes(response.body))

    def status(self, uuid: str, wait_s: float) -> dict[str, Any]:
        """The status document; with ``wait_s``, the first change within it (as the status long poll)."""
        zoo = self.state.zoo
        doc = views.submission_doc(zoo.submission(uuid), _status_url(uuid), zoo)
        deadline = time.monotonic() + min(wait_s, self.state.settings.status_max_wait_s)
        seq = doc.get("seq", 0)
        while not doc["terminal"] and not self.state.draining.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            fresh = views.submission_doc(zoo.wait_submission(uuid, seq, min(remaining, POLL_SLICE_S)),
                                         _status_url(uuid), zoo)
            seq = fresh.get("seq", seq)
            if views.changed(doc, fresh, ("seq",)):
                return fresh
        return doc

    def logs(self, uuid: str) -> dict[str, Any]:
        """The run's log tails and failure (NOT_FOUND before a runner reported)."""
        zoo = self.state.zoo
        view = zoo.submission(uuid)
        if not view.result:
            raise ZooError("NOT_FOUND", f"submission {uuid} has no reported run yet ({view.status}); "
                           "its logs appear once a runner reports", {"uuid": uuid, "status": view.status})
        doc = logs_doc(uuid, zoo.pending.run_folder(uuid))
        doc["status"] = view.status
        return doc


class McpEndpoint:
    """The ASGI app at ``/mcp``: the SDK's streamable HTTP transport over :class:`ServiceBackend`."""

    def __init__(self) -> None:
        self.backend: ServiceBackend | None = None
        self.server: MCPServer | None = None
        self._asgi: ASGIApp | None = None

    def bind(self, app: Starlette) -> None:
        """Serve the tools of ``app`` (the daemon's Starlette app)."""
        self.backend = ServiceBackend(app)
        self.server = build_server(self.backend)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Run the transport's session manager for one lifespan of the app."""
        if self.server is None:
            yield
            return
        # The daemon's HTTP API takes the same Host headers: the tokens guard what changes state, as they
        # do for POST /api/submissions (a JSON POST from another origin is refused by browsers' CORS).
        security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
        self._asgi = self.server.streamable_http_app(streamable_http_path="/", stateless_http=True,
                                                     json_response=True, transport_security=security)
        try:
            async with self.server.session_manager.run():
                yield
        finally:
            self._asgi = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._asgi is None:
            response = JSONResponse(ZooError("UNAVAILABLE", "the MCP endpoint is not running").to_json(),
                                    status_code=503)
            await response(scope, receive, send)
            return
        await self._asgi(scope, receive, send)
