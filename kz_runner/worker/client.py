"""A stdlib HTTP client for the zoo API: the runner endpoints and generic helpers.

Only ``urllib`` is used, so the runner installs on a GPU host without the
daemon's dependencies. :class:`ZooClient` sends ``Authorization: Bearer <token>``
on every call, applies a timeout, and retries with exponential backoff and full
jitter on network errors and 5xx answers (never on 4xx: the request itself is
wrong and would fail again). A 4xx/5xx answer becomes :class:`ApiError` carrying
the server's stable ``code`` (``{"error": {"code", "message", "details"}}``);
a network failure that outlasts the retries becomes :class:`NetworkError`.

Generic helpers ``kz submit`` reuses: :meth:`ZooClient.request_json`,
:meth:`ZooClient.upload_multipart` (streams the file; never holds it in memory)
and :meth:`ZooClient.download` (to a file, with a size cap).
"""
from __future__ import annotations

import base64
import http.client
import json
import os
import random
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid as uuidlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kz_runner import __version__

USER_AGENT = f"kernel-zoo-runner/{__version__}"
CHUNK = 64 * 1024


class ClientError(Exception):
    """Base of everything this module raises on purpose."""


class NetworkError(ClientError):
    """The server could not be reached (or kept failing with 5xx) after the retries."""

    def __init__(self, message: str, attempts: int) -> None:
        super().__init__(message)
        # how many attempts were made before giving up
        self.attempts = attempts


class ApiError(ClientError):
    """The server answered with an error status; ``code`` is its stable error code."""

    def __init__(self, status: int, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(f"HTTP {status} {code}: {message}")
        # the HTTP status of the answer
        self.status = status
        # the server's machine-readable code (e.g. LEASE_LOST), or HTTP_<status> when the body had none
        self.code = code
        # the server's human message
        self.message = message
        # the server's JSON details, {} when none
        self.details = details or {}


class ProtocolError(ClientError):
    """The server answered something this client cannot use (not JSON, missing fields)."""


class ResponseTooLarge(ClientError):
    """A download exceeded its size cap; nothing is left at the destination."""


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter: attempt n waits uniform(0, min(cap, base * 2**n))."""

    # total attempts, the first included (1 = no retry)
    attempts: int = 5
    # first backoff ceiling in seconds
    base_s: float = 0.5
    # largest backoff ceiling in seconds
    cap_s: float = 30.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (0-based)."""
        return rng.uniform(0.0, min(self.cap_s, self.base_s * (2 ** attempt)))


NO_RETRY = RetryPolicy(attempts=1)


@dataclass(frozen=True)
class Response:
    """A successful answer: status and the parsed JSON body (None for an empty body)."""

    # HTTP status (2xx)
    status: int
    # parsed JSON body, None when the body was empty (e.g. 204)
    body: Any
    # response headers, lower-cased names
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Claim:
    """A job handed to this runner by ``POST /api/runner/claim``."""

    # submission uuid
    uuid: str
    # the kernel the submission is for
    kernel_id: str
    # where to download the tarball (path or absolute URL)
    package_url: str
    # lease id to quote on renew/release/result
    lease_id: str
    # lease expiry as the server wrote it (RFC 3339)
    lease_expires_at: str
    # lease length in seconds; renew at about a third of it
    lease_seconds: float
    # per-step timeouts {"build_s", "benchmark_s"} the server asks for
    timeouts: dict[str, float]

    @classmethod
    def from_json(cls, doc: Any) -> Claim:
        """Parse a claim answer; raises ProtocolError when a field is missing."""
        if not isinstance(doc, dict):
            raise ProtocolError(f"claim answer is not a JSON object: {doc!r:.200}")
        try:
            return cls(
                uuid=str(doc["uuid"]),
                kernel_id=str(doc["kernel_id"]),
                package_url=str(doc.get("package_url") or f"/api/runner/package/{doc['uuid']}"),
                lease_id=str(doc["lease_id"]),
                lease_expires_at=str(doc.get("lease_expires_at", "")),
                lease_seconds=float(doc.get("lease_seconds") or 60.0),
                timeouts={k: float(v) for k, v in (doc.get("timeouts") or {}).items() if v is not None},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"claim answer lacks {exc}: {doc!r:.300}") from exc


def _is_network_error(exc: BaseException) -> bool:
    if isinstance(exc, urllib.error.HTTPError):
        return False
    return isinstance(exc, (urllib.error.URLError, ConnectionError, socket.timeout, TimeoutError,
                            http.client.HTTPException, OSError))


def _error_from_http(exc: urllib.error.HTTPError) -> ApiError:
    raw = b""
    try:
        raw = exc.read(64 * 1024)
    except Exception:  # the body is a courtesy; the status is what counts
        pass
    code, message = f"HTTP_{exc.code}", (raw.decode("utf-8", "replace")[:500] or str(exc.reason))
    details: dict = {}
    try:
        doc = json.loads(raw)
        err = doc.get("error", doc) if isinstance(doc, dict) else {}
        if isinstance(err, dict) and err.get("code"):
            code = str(err["code"])
            message = str(err.get("message", message))
            given = err.get("details")
            details = given if isinstance(given, dict) else {}
    except ValueError:
        pass
    return ApiError(exc.code, code, message, details)


class ZooClient:
    """One server, one token; thread-safe (no shared connection state)."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout_s: float = 30.0,
        retry: RetryPolicy = RetryPolicy(),
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        user_agent: str = USER_AGENT,
    ) -> None:
        parsed = urllib.parse.urlsplit(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"server URL must be http(s)://host[:port], got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self._token = token
        self.timeout_s = timeout_s
        self.retry = retry
        self._sleep = sleep
        self._rng = rng or random.Random()
        self.user_agent = user_agent
        # Proxies come from the environment (http_proxy/no_proxy), as for any urllib client.
        self._opener = urllib.request.build_opener()

    def __repr__(self) -> str:  # never show the token
        return f"ZooClient({self.base_url!r})"

    # -- plumbing -----------------------------------------------------------------

    def url(self, path: str) -> str:
        """Absolute URL for ``path`` (an absolute URL on the same server is kept as is)."""
        if path.startswith(("http://", "https://")):
            return path
        return f"{self.base_url}/{path.lstrip('/')}"

    def _headers(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        headers = {"User-Agent": self.user_agent, "Accept": "application/json"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        headers.update(extra or {})
        return headers

    def _with_retries(self, what: str, call: Callable[[], Any], retry: RetryPolicy | None) -> Any:
        policy = retry or self.retry
        last: BaseException | None = None
        for attempt in range(policy.attempts):
            try:
                return call()
            except urllib.error.HTTPError as exc:
                err = _error_from_http(exc)
                if exc.code < 500:
                    raise err from None
                last = err
            except ClientError:
                raise
            except Exception as exc:
                if not _is_network_error(exc):
                    raise
                last = exc
            if attempt + 1 < policy.attempts:
                self._sleep(policy.delay(attempt, self._rng))
        raise NetworkError(f"{what}: {type(last).__name__}: {last} (after {policy.attempts} attempts)",
                           policy.attempts)

    def _open(self, method: str, path: str, data: Any, headers: dict[str, str], timeout_s: float | None):
        req = urllib.request.Request(self.url(path), data=data, method=method, headers=headers)
        return self._opener.open(req, timeout=timeout_s or self.timeout_s)

    @staticmethod
    def _read_json(resp) -> Response:
        raw = resp.read()
        hdrs = {k.lower(): v for k, v in resp.headers.items()}
        if not raw:
            return Response(resp.status, None, hdrs)
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise ProtocolError(f"{resp.status} answer is not JSON: {raw[:200]!r}") from exc
        return Response(resp.status, body, hdrs)

    # -- generic helpers ----------------------------------------------------------------

    def request_json(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        timeout_s: float | None = None,
        headers: Mapping[str, str] | None = None,
        retry: RetryPolicy | None = None,
    ) -> Response:
        """Send ``body`` as JSON (if not None), return the parsed JSON answer.

        Raises ApiError (4xx, or 5xx after retries run out is NetworkError),
        ProtocolError (answer not JSON).
        """
        data = None
        hdrs = self._headers(headers)
        if body is not None:
            data = json.dumps(body, allow_nan=False).encode("utf-8")
            hdrs["Content-Type"] = "application/json"

        def call() -> Response:
            with self._open(method, path, data, hdrs, timeout_s) as resp:
                return self._read_json(resp)

        return self._with_retries(f"{method} {path}", call, retry)

    def upload_multipart(
        self,
        path: str,
        fields: Mapping[str, str],
        file_field: str,
        file_path: Path,
        *,
        filename: str | None = None,
        content_type: str = "application/gzip",
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        retry: RetryPolicy | None = None,
    ) -> Response:
        """POST ``fields`` plus the file as multipart/form-data, streamed from disk."""
        file_path = Path(file_path)
        boundary = f"kz-{uuidlib.uuid4().hex}"
        head = b"".join(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{_quote(k)}"\r\n\r\n'.encode()
            + str(v).encode("utf-8") + b"\r\n"
            for k, v in fields.items()
        )
        head += (
            f'--{boundary}\r\nContent-Disposition: form-data; name="{_quote(file_field)}"; '
            f'filename="{_quote(filename or file_path.name)}"\r\nContent-Type: {content_type}\r\n\r\n'
        ).encode()
        tail = f"\r\n--{boundary}--\r\n".encode("ascii")
        size = file_path.stat().st_size

        def chunks() -> Iterator[bytes]:
            yield head
            with open(file_path, "rb") as fh:
                while True:
                    block = fh.read(CHUNK)
                    if not block:
                        break
                    yield block
            yield tail

        hdrs = self._headers(headers)
        hdrs["Content-Type"] = f"multipart/form-data; boundary={boundary}"
        hdrs["Content-Length"] = str(len(head) + size + len(tail))

        def call() -> Response:
            with self._open("POST", path, chunks(), hdrs, timeout_s) as resp:
                return self._read_json(resp)

        return self._with_retries(f"POST {path}", call, retry)

    def download(
        self,
        path: str,
        dest: Path,
        *,
        max_bytes: int,
        timeout_s: float | None = None,
        retry: RetryPolicy | None = None,
    ) -> int:
        """Stream ``GET path`` into ``dest`` (via a temp file + rename); returns the size.

        Raises ResponseTooLarge past ``max_bytes`` (nothing is left at ``dest``).
        """
        dest = Path(dest)
        tmp = dest.with_name(f".{dest.name}.part")

        def call() -> int:
            total = 0
            try:
                with self._open("GET", path, None, self._headers({"Accept": "*/*"}), timeout_s) as resp:
                    declared = resp.headers.get("Content-Length")
                    if declared and declared.isdigit() and int(declared) > max_bytes:
                        raise ResponseTooLarge(f"{path}: {declared} bytes declared, cap is {max_bytes}")
                    with open(tmp, "wb") as out:
                        while True:
                            block = resp.read(CHUNK)
                            if not block:
                                break
                            total += len(block)
                            if total > max_bytes:
                                raise ResponseTooLarge(f"{path}: more than {max_bytes} bytes")
                            out.write(block)
                os.replace(tmp, dest)
                return total
            finally:
                tmp.unlink(missing_ok=True)

        return self._with_retries(f"GET {path}", call, retry)

    # -- runner endpoints ----------------------------------------------------------------

    def claim(self, arch: str, wait_s: float, *, host: str = "", gpu: str | None = None,
              retry: RetryPolicy | None = None) -> Claim | None:
        """Long-poll for a job of ``arch``; None when nothing matched within ``wait_s``."""
        body = {"arch": arch, "wait": wait_s, "host": host, "gpu": "" if gpu is None else str(gpu)}
        resp = self.request_json("POST", "/api/runner/claim", body,
                                 timeout_s=wait_s + self.timeout_s, retry=retry)
        if resp.status == 204 or resp.body is None:
            return None
        return Claim.from_json(resp.body)

    def fetch_package(self, claim: Claim, dest: Path, *, max_bytes: int) -> int:
        """Download the claimed job's tarball to ``dest``; returns its size."""
        return self.download(claim.package_url, dest, max_bytes=max_bytes)

    def renew(self, uuid: str, lease_id: str, *, retry: RetryPolicy | None = None) -> str:
        """Renew the lease; returns the new expiry. ApiError code LEASE_LOST when it is gone."""
        resp = self.request_json("POST", f"/api/runner/lease/{uuid}/renew", {"lease_id": lease_id}, retry=retry)
        return str((resp.body or {}).get("lease_expires_at", ""))

    def release(self, uuid: str, lease_id: str, reason: str, *, retry: RetryPolicy | None = None) -> None:
        """Give the job back to the queue."""
        self.request_json("POST", f"/api/runner/lease/{uuid}/release",
                          {"lease_id": lease_id, "reason": reason}, retry=retry)

    def report_result(
        self,
        uuid: str,
        lease_id: str,
        *,
        result: dict[str, Any] | None,
        logs: bytes,
        env: dict[str, Any],
        failure: dict[str, str] | None,
        log_tails: dict[str, str] | None = None,
        retry: RetryPolicy | None = None,
    ) -> dict[str, Any]:
        """Report a run; returns the submission view the server answers with.

        ``log_tails`` (optional field): redacted stderr tails ``{"build", "benchmark"}``.
        """
        body = {
            "lease_id": lease_id,
            "result": result,
            "logs_b64": base64.b64encode(logs).decode("ascii"),
            "env": env,
            "failure": failure,
        }
        if log_tails:
            body["log_tails"] = log_tails
        resp = self.request_json("POST", f"/api/submissions/{uuid}/result", body, retry=retry)
        return resp.body if isinstance(resp.body, dict) else {}

    # -- read-only catalogue endpoints (kz dry-run --server) ---------------------------------

    def kernel(self, kernel_id: str, *, retry: RetryPolicy | None = None) -> dict[str, Any] | None:
        """``GET /api/kernels/{kernel_id}``: the index entry with ``desc`` and ``bench_result``; None when 404."""
        try:
            resp = self.request_json("GET", f"/api/kernels/{urllib.parse.quote(kernel_id, safe='/')}",
                                     retry=retry)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        if not isinstance(resp.body, dict):
            raise ProtocolError(f"GET /api/kernels/{kernel_id} answered {resp.body!r:.200}")
        return resp.body


def _quote(value: str) -> str:
    """Escape a multipart header parameter (quotes and line breaks)."""
    return value.replace("\\", "\\\\").replace('"', "%22").replace("\r", "%0D").replace("\n", "%0A")
