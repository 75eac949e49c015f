"""Limits and policies: upload cap while streaming (413), body caps on POSTs, rate limit (429),
token-gated submissions (401/403), drain on shutdown answers long polls."""
from __future__ import annotations

import http.client
import threading
import time

import pytest

from kz_daemon.config.tokens import TokenStore
from tests.helpers.http_server import CPU_AXPY, LiveServer, package_tarball


@pytest.fixture(scope="module")
def strict(tmp_path_factory):
    server = LiveServer.start(
        tmp_path_factory.mktemp("strict"), kernels=[CPU_AXPY],
        settings={"max_upload_bytes": 64 * 1024, "max_json_bytes": 1024, "submit_burst": 2,
                  "submit_rate_per_s": 0.01, "submissions_require_token": True},
    )
    yield server
    server.stop()


def _code(resp) -> str:
    return resp.json()["error"]["code"]


def test_token_required_by_policy(strict):
    data = package_tarball(CPU_AXPY)
    with strict.client() as anon:
        resp = strict.submit(anon, CPU_AXPY, data, submitter="bob")
        assert resp.status_code == 401 and _code(resp) == "UNAUTHORIZED"
    with strict.client("submitter:alice") as alice:
        resp = strict.submit(alice, CPU_AXPY, data, submitter="bob")
        assert resp.status_code == 403 and _code(resp) == "FORBIDDEN"


def test_declared_oversize_upload_is_413(strict):
    big = b"\0" * (200 * 1024)
    with strict.client("admin") as admin:
        resp = strict.submit(admin, CPU_AXPY, big, submitter="carol")
        assert resp.status_code == 413 and _code(resp) == "PAYLOAD_TOO_LARGE"
        assert resp.json()["error"]["details"]["limit_bytes"] == 64 * 1024


def test_chunked_oversize_upload_is_cut_off_while_streaming(strict):
    """No Content-Length: the cap is enforced on the bytes as they arrive."""
    host, port = strict.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    boundary = "kzboundary"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"kernel_id\"\r\n\r\n{CPU_AXPY}\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"package\"; filename=\"p.tar.gz\"\r\n"
            "Content-Type: application/gzip\r\n\r\n").encode()
    sent = [0]

    def body():
        yield head
        for _ in range(64):  # 4 MiB in total, far over the 64 KiB cap
            sent[0] += 1
            yield b"\1" * 65536
        yield f"\r\n--{boundary}--\r\n".encode()

    conn.putrequest("POST", "/api/submissions")
    conn.putheader("Authorization", f"Bearer {strict.tokens['admin']}")
    conn.putheader("X-Submitter-Id", "dave")
    conn.putheader("Content-Type", f"multipart/form-data; boundary={boundary}")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    try:
        for chunk in body():
            conn.send(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        conn.send(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server answered and closed while we were still sending: that is the point
    resp = conn.getresponse()
    import json

    assert resp.status == 413
    assert json.loads(resp.read())["error"]["code"] == "PAYLOAD_TOO_LARGE"
    conn.close()
    # nothing of it reached the spool's inbox
    assert not list((strict.state_dir / "spool" / "inbox").glob("*.tar.gz"))


def test_json_body_cap_on_runner_posts(strict):
    with strict.client("runner:r1") as r1:
        resp = r1.post("/api/runner/claim", json={"arch": "cpu", "wait": 0, "host": "x" * 5000})
        assert resp.status_code == 413 and _code(resp) == "PAYLOAD_TOO_LARGE"


def test_rate_limit_per_token_holder(strict):
    data = package_tarball("cpu/Elementwise/Axpy/fp32/rl", CPU_AXPY)
    store = TokenStore(strict.state_dir / "auth.yaml")
    for who in ("erin", "frank"):  # submit() sends each its own token
        strict.tokens[f"submitter:{who}"] = store.issue("submitter", who)
    with strict.client() as http:
        codes = [strict.submit(http, "cpu/Elementwise/Axpy/fp32/rl", data, submitter="erin").status_code
                 for _ in range(3)]
        assert codes[:2] == [202, 202] or codes[0] == 202
        last = strict.submit(http, "cpu/Elementwise/Axpy/fp32/rl", data, submitter="erin")
        assert last.status_code == 429 and _code(last) == "RATE_LIMITED"
        assert int(last.headers["Retry-After"]) >= 1
        # another token holder has its own bucket
        assert strict.submit(http, "cpu/Elementwise/Axpy/fp32/rl", data, submitter="frank").status_code == 202


def test_drain_answers_long_polls(tmp_path):
    server = LiveServer.start(tmp_path, kernels=[CPU_AXPY])
    order: list[str] = []
    try:
        with server.client("runner:r1") as r1:
            got = {}

            def claim():
                got["status"] = r1.post("/api/runner/claim", json={"arch": "gfx000", "wait": 60}).status_code
                order.append("claim answered")

            thread = threading.Thread(target=claim)
            thread.start()
            time.sleep(0.3)
            order.append("drain")
            server.app.state.draining.set()
            thread.join(20)
            assert order == ["drain", "claim answered"]
            assert got["status"] == 204
            with server.client() as anon:
                assert anon.get("/readyz").status_code == 503
    finally:
        server.stop()


def test_kz_submit_sends_its_token(strict, tmp_path):
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from tests.helpers.http_server import EXAMPLES

    pkg = tmp_path / CPU_AXPY
    shutil.copytree(EXAMPLES / CPU_AXPY, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KZ_")}
    base = [sys.executable, "-m", "kz_daemon", "submit", str(pkg), "--server", strict.url,
            "--submitter", "alice", "--no-wait"]
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(base, capture_output=True, text=True, timeout=120, cwd=root, env=env)
    assert done.returncode == 2 and "UNAUTHORIZED" in done.stderr
    done = subprocess.run(base + ["--token", strict.tokens["submitter:alice"]], capture_output=True, text=True,
                          timeout=120, cwd=root, env=env)
    assert done.returncode == 0, done.stderr
    assert strict.zoo.submission(done.stdout.strip()).submitter_id == "alice"
