"""The zoo's public API as plain blocking calls: the backend of ``kz mcp``'s stdio tools.

Every call goes through :class:`kz_runner.worker.client.ZooClient` (the one HTTP client
of the runner side); validation and packing of local paths are ``kz validate``'s and
``kz submit``'s own (:mod:`kz_runner.tools.submit`). Every expected failure is raised as
:class:`ZooApiError` with a stable ``code`` (the server's, or ``UNREACHABLE``,
``PROTOCOL_ERROR``, ``VALIDATION_ERROR`` for a package refused locally).
"""
from __future__ import annotations

import functools
import io
import os
import tempfile
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kz_runner.contract.validate import validate_package_dir, validate_tarball
from kz_runner.tools import submit as submitting
from kz_runner.worker.client import NO_RETRY, ApiError, ClientError, NetworkError, ZooClient

#: ``GET /api/kernels`` pages through the catalogue this many at a time (the server's maximum).
PAGE = 1000


class ZooApiError(Exception):
    """An expected failure: ``code`` (stable), ``message``, ``details``."""

    def __init__(self, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.details = details or {}


def _translated(fn: Callable) -> Callable:
    """Turn the client's and the submit library's failures into :class:`ZooApiError`."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ApiError as exc:
            raise ZooApiError(exc.code, exc.message, exc.details) from None
        except NetworkError as exc:
            raise ZooApiError("UNREACHABLE", str(exc)) from None
        except submitting.LocalRejection as exc:
            raise ZooApiError("VALIDATION_ERROR", str(exc), {"problems": exc.problems}) from None
        except submitting.SubmitError as exc:
            raise ZooApiError("BAD_REQUEST", str(exc)) from None
        except ClientError as exc:
            raise ZooApiError("PROTOCOL_ERROR", str(exc)) from None
    return wrapper


def _q(value: str) -> str:
    return urllib.parse.quote(value, safe="/")


class HttpBackend:
    """The tools' backend for a daemon reached over HTTP (``kz mcp --server URL``)."""

    local_paths = True

    def __init__(self, client: ZooClient, submitter: str | None = None) -> None:
        self.client = client
        self.submitter = submitter

    def _get(self, path: str, **params: Any) -> Any:
        query = {k: v for k, v in params.items() if v not in (None, "")}
        url = path + ("?" + urllib.parse.urlencode(query) if query else "")
        return self.client.request_json("GET", url).body

    @_translated
    def kernels(self) -> list[dict[str, Any]]:
        """Every entry of ``GET /api/kernels``, page by page."""
        out: list[dict[str, Any]] = []
        page = 1
        while True:
            doc = self._get("/api/kernels", page=page, per_page=PAGE) or {}
            out.extend(doc.get("kernels") or [])
            if page >= int(doc.get("pages") or 1):
                return out
            page += 1

    @_translated
    def kernel(self, kernel_id: str) -> dict[str, Any]:
        """``GET /api/kernels/{kernel_id}``."""
        return self._get(f"/api/kernels/{_q(kernel_id)}")

    @_translated
    def files(self, kernel_id: str, rev: str | None) -> dict[str, Any]:
        """``GET /api/kernels/{kernel_id}/files?rev=``."""
        return self._get(f"/api/kernels/{_q(kernel_id)}/files", rev=rev)

    @_translated
    def file(self, kernel_id: str, path: str, rev: str | None) -> bytes:
        """``GET /api/kernels/{kernel_id}/files/{path}?rev=`` (the bytes, through a temporary file)."""
        url = f"/api/kernels/{_q(kernel_id)}/files/{_q(path)}" + (f"?rev={_q(rev)}" if rev else "")
        with tempfile.TemporaryDirectory(prefix="kz-mcp-") as tmp:
            dest = Path(tmp) / "file"
            self.client.download(url, dest, max_bytes=64 << 20)
            return dest.read_bytes()

    @_translated
    def validate(self, *, path: str | None, tarball: bytes | None) -> dict[str, Any]:
        """``kz validate``'s report, static rules included, of a local directory, .tar.gz or tarball bytes."""
        if tarball is not None:
            report = validate_tarball(io.BytesIO(tarball), "package.tar.gz", rules=True)
        else:
            target = Path(os.path.expanduser(str(path)))
            if target.is_dir():
                report = validate_package_dir(target, rules=True)
            elif target.is_file():
                report = validate_tarball(target, target.name, rules=True)
            else:
                raise ZooApiError("NOT_FOUND", f"{target} is neither a package directory nor a .tar.gz file")
        return report.to_json()

    @_translated
    def submit(self, *, path: str | None, tarball: bytes | None, kernel_id: str | None,
               submitter: str | None, request: Any = None) -> dict[str, Any]:
        """Validate and pack locally, then upload with a fresh Idempotency-Key (``kz submit --no-wait``)."""
        who = submitter or self.submitter
        if not who:
            raise ZooApiError("BAD_REQUEST", "no submitter id: pass submitter_id, or start kz mcp with --submitter")
        with tempfile.TemporaryDirectory(prefix="kz-mcp-") as tmp:
            if tarball is not None:
                source = Path(tmp) / "package.tar.gz"
                source.write_bytes(tarball)
            else:
                source = Path(os.path.expanduser(str(path)))
            prepared = submitting.prepare(source, kernel_id)
            try:
                body = submitting.upload(self.client, prepared, who, submitting.new_idempotency_key())
            finally:
                submitting.discard(prepared)
        return dict(body, warnings=prepared.warnings) if prepared.warnings else body

    @_translated
    def status(self, uuid: str, wait_s: float) -> dict[str, Any]:
        """``GET /api/submissions/{uuid}/status?wait=``."""
        resp = self.client.request_json("GET", f"/api/submissions/{_q(uuid)}/status?wait={wait_s:.1f}",
                                        timeout_s=wait_s + 30, retry=NO_RETRY if wait_s else None)
        return resp.body

    @_translated
    def logs(self, uuid: str) -> dict[str, Any]:
        """``GET /api/submissions/{uuid}/logs``."""
        return self._get(f"/api/submissions/{_q(uuid)}/logs")
