"""The stdlib HTTP client against a real HTTP server that answers from a script.

The script server is stdlib ``http.server`` on a real socket: it records what
arrived (method, path, headers, body) and answers the next scripted reply, so
retries, error codes, streaming and caps are observed on the wire.
"""
from __future__ import annotations

import json
import socket
import threading
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kz_runner.worker.client import (
    ApiError,
    Claim,
    NetworkError,
    ProtocolError,
    ResponseTooLarge,
    RetryPolicy,
    ZooClient,
)


class ScriptServer:
    """Answers requests with scripted (status, headers, body) replies, in order."""

    def __init__(self) -> None:
        self.replies: list[tuple[int, dict, bytes]] = []
        self.seen: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                outer.seen.append({"method": self.command, "path": self.path,
                                   "headers": dict(self.headers), "body": body})
                status, headers, payload = outer.replies.pop(0) if outer.replies else (500, {}, b"")
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                if "Content-Length" not in headers:
                    self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = _serve

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def reply(self, status: int, body=None, headers: dict | None = None) -> None:
        raw = body if isinstance(body, bytes) else (b"" if body is None else json.dumps(body).encode())
        self.replies.append((status, headers or {"Content-Type": "application/json"}, raw))

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def _server():
    s = ScriptServer()
    yield s
    s.close()


@pytest.fixture
def server(_server):
    _server.replies.clear()
    _server.seen.clear()
    return _server


def _client(url: str, sleeps: list[float], attempts: int = 4) -> ZooClient:
    return ZooClient(url, "sekrit-token", timeout_s=10, retry=RetryPolicy(attempts=attempts, base_s=0.5, cap_s=4),
                     sleep=sleeps.append)


def test_bearer_token_and_json_round_trip(server):
    server.reply(200, {"ok": True})
    resp = _client(server.url, []).request_json("POST", "/api/x", {"a": 1})
    assert resp.status == 200 and resp.body == {"ok": True}
    seen = server.seen[0]
    assert seen["headers"]["Authorization"] == "Bearer sekrit-token"
    assert json.loads(seen["body"]) == {"a": 1}
    assert "sekrit-token" not in repr(_client(server.url, []))


def test_5xx_is_retried_with_growing_jittered_backoff(server):
    server.reply(503, {"error": {"code": "UNAVAILABLE", "message": "busy"}})
    server.reply(502, b"bad gateway", {"Content-Type": "text/plain"})
    server.reply(200, {"ok": 1})
    sleeps: list[float] = []
    resp = _client(server.url, sleeps).request_json("GET", "/api/x")
    assert resp.body == {"ok": 1}
    assert len(server.seen) == 3 and len(sleeps) == 2
    assert 0 <= sleeps[0] <= 0.5 and 0 <= sleeps[1] <= 1.0


def test_4xx_is_not_retried_and_carries_the_server_code(server):
    server.reply(409, {"error": {"code": "LEASE_LOST", "message": "gone", "details": {"uuid": "u"}}})
    sleeps: list[float] = []
    with pytest.raises(ApiError) as info:
        _client(server.url, sleeps).renew("u", "L1")
    assert info.value.status == 409 and info.value.code == "LEASE_LOST"
    assert info.value.details == {"uuid": "u"}
    assert len(server.seen) == 1 and sleeps == []
    assert json.loads(server.seen[0]["body"]) == {"lease_id": "L1"}
    assert server.seen[0]["path"] == "/api/runner/lease/u/renew"


def test_4xx_without_a_json_body_gets_a_generic_code(server):
    server.reply(404, b"nope", {"Content-Type": "text/plain"})
    with pytest.raises(ApiError) as info:
        _client(server.url, []).request_json("GET", "/missing")
    assert info.value.code == "HTTP_404" and "nope" in info.value.message


def test_persistent_5xx_ends_as_network_error(server):
    for _ in range(3):
        server.reply(500, {"error": {"code": "INTERNAL", "message": "x"}})
    sleeps: list[float] = []
    with pytest.raises(NetworkError) as info:
        _client(server.url, sleeps, attempts=3).request_json("GET", "/x")
    assert info.value.attempts == 3 and len(sleeps) == 2


def test_connection_refused_is_retried_then_network_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sleeps: list[float] = []
    with pytest.raises(NetworkError):
        _client(f"http://127.0.0.1:{port}", sleeps, attempts=3).request_json("GET", "/x")
    assert len(sleeps) == 2


def test_non_json_success_is_a_protocol_error(server):
    server.reply(200, b"<html>", {"Content-Type": "text/html"})
    with pytest.raises(ProtocolError):
        _client(server.url, []).request_json("GET", "/x")


def test_claim_204_is_none_and_200_is_a_claim(server):
    server.reply(204, None)
    server.reply(200, {"uuid": "u1", "kernel_id": "cpu/a/b/c/d", "package_url": "/api/runner/package/u1",
                       "lease_id": "L", "lease_expires_at": "2026-11-30T00:00:00Z", "lease_seconds": 30,
                       "timeouts": {"build_s": 60, "benchmark_s": 120}})
    c = _client(server.url, [])
    assert c.claim("cpu", 1, host="h", gpu="0") is None
    claim = c.claim("cpu", 1, host="h", gpu="0")
    assert claim == Claim("u1", "cpu/a/b/c/d", "/api/runner/package/u1", "L", "2026-11-30T00:00:00Z", 30.0,
                          {"build_s": 60.0, "benchmark_s": 120.0})
    assert json.loads(server.seen[0]["body"]) == {"arch": "cpu", "wait": 1, "host": "h", "gpu": "0"}


def test_claim_answer_without_lease_is_a_protocol_error(server):
    server.reply(200, {"uuid": "u1"})
    with pytest.raises(ProtocolError):
        _client(server.url, []).claim("cpu", 1)


def test_multipart_upload_streams_fields_and_file(server, tmp_path):
    payload = bytes(range(256)) * 1000
    f = tmp_path / "pkg.tar.gz"
    f.write_bytes(payload)
    server.reply(201, {"uuid": "u"})
    resp = _client(server.url, []).upload_multipart(
        "/api/submissions", {"kernel_id": "cpu/x", "submitter_id": "alice"}, "package", f)
    assert resp.status == 201
    seen = server.seen[0]
    msg = BytesParser(policy=HTTP).parsebytes(
        b"Content-Type: " + seen["headers"]["Content-Type"].encode() + b"\r\n\r\n" + seen["body"])
    parts = {p.get_param("name", header="content-disposition"): p for p in msg.iter_parts()}
    assert parts["kernel_id"].get_content() == "cpu/x"
    assert parts["submitter_id"].get_content() == "alice"
    assert parts["package"].get_filename() == "pkg.tar.gz"
    assert parts["package"].get_payload(decode=True) == payload


def test_download_writes_the_file_and_enforces_the_cap(server, tmp_path):
    server.reply(200, b"A" * 5000, {"Content-Type": "application/gzip"})
    dest = tmp_path / "p.tar.gz"
    assert _client(server.url, []).download("/api/runner/package/u", dest, max_bytes=5000) == 5000
    assert dest.read_bytes() == b"A" * 5000

    server.reply(200, b"B" * 5001, {"Content-Type": "application/gzip"})
    big = tmp_path / "big.tar.gz"
    with pytest.raises(ResponseTooLarge):
        _client(server.url, []).download("/p", big, max_bytes=5000)
    assert not big.exists() and list(tmp_path.iterdir()) == [dest]


def test_report_result_sends_base64_logs(server):
    server.reply(200, {"uuid": "u", "status": "accepted"})
    view = _client(server.url, []).report_result("u", "L", result={"x": 1}, logs=b"\x00log\xff",
                                                 env={"arch": "cpu"}, failure=None)
    assert view["status"] == "accepted"
    body = json.loads(server.seen[0]["body"])
    assert body == {"lease_id": "L", "result": {"x": 1}, "logs_b64": "AGxvZ/8=", "env": {"arch": "cpu"},
                    "failure": None}
    assert server.seen[0]["path"] == "/api/submissions/u/result"


def test_bad_server_url_is_refused():
    with pytest.raises(ValueError):
        ZooClient("localhost:8000")
