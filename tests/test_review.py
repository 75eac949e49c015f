"""Held submissions and the admin's review, over HTTP and through ``kz review``; a reject rule refuses at intake."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers.http_server import CPU_AXPY, LiveServer, package_tarball

SRC = "src/axpy.py"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = LiveServer.start(tmp_path_factory.mktemp("review"), kernels=[CPU_AXPY])
    yield srv
    srv.stop()


def with_source(extra: bytes):
    def mutate(files):
        files[SRC] = files[SRC] + extra
    return mutate


def submit(server, extra: bytes):
    with server.client() as c:
        return server.submit(c, CPU_AXPY, package_tarball(CPU_AXPY, mutate=with_source(extra)), submitter="eve")


@pytest.mark.parametrize("extra, rule", [
    (b"\nimport time\ntime.perf_counter = lambda: 0.0\n", "timing-patch"),
    (b"\nimport sys\n_probe = sys._getframe(0).f_back\n", "introspection"),
])
def test_a_reject_rule_refuses_at_intake_with_file_and_line(server, extra, rule):
    r = submit(server, extra)
    assert r.status_code == 400, r.text
    (reason,) = r.json()["error"]["details"]["reasons"]
    assert reason["code"] == "RULE_VIOLATION"
    assert rule in reason["message"] and f"{SRC}:" in reason["message"]


def test_a_held_submission_waits_for_an_admin_who_sees_the_evidence(server):
    r = submit(server, b"\nimport threading\n")
    assert r.status_code == 202, r.text
    held_uuid = r.json()["uuid"]
    assert r.json()["status"] == "held"
    with server.client("submitter:alice") as c:
        assert c.get("/api/reviews").status_code == 403
    with server.client() as c:
        assert c.get("/api/reviews").status_code == 401
    with server.client("admin") as c:
        rows = c.get("/api/reviews").json()["reviews"]
        (row,) = [x for x in rows if x["uuid"] == held_uuid]
        assert row["rules"] == ["concurrency"]
        (finding,) = row["evidence"]
        assert finding["file"] == SRC and finding["text"] == "import threading" and finding["line"] > 1
        assert server.zoo.claim("r1", "cpu", 0) is None  # a held job is not claimable
        doc = c.post(f"/api/reviews/{held_uuid}/approve", json={}).json()
        assert doc["status"] == "queued"
        assert c.post(f"/api/reviews/{held_uuid}/approve", json={}).status_code == 409
    claim = server.zoo.claim("r1", "cpu", 0)
    assert claim is not None and claim.uuid == held_uuid
    server.zoo.cancel(held_uuid, "test")


def test_kz_review_lists_and_rejects_with_a_reason(server):
    r = submit(server, b"\nimport socket\n")
    held_uuid = r.json()["uuid"]
    base = [sys.executable, "-m", "kz_daemon.cli", "review"]
    common = ["--server", server.url, "--token", server.tokens["admin"]]
    listed = subprocess.run(base + ["list"] + common, capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert held_uuid in listed.stdout and f"network-subprocess {SRC}:" in listed.stdout
    done = subprocess.run(base + ["reject", held_uuid, "--reason", "no sockets in a kernel"] + common,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    with server.client() as c:
        doc = c.get(f"/api/submissions/{held_uuid}/status").json()
    assert doc["status"] == "rejected"
    assert doc["reasons"][0]["code"] == "REVIEW_REJECTED" and doc["reasons"][0]["message"] == "no sockets in a kernel"
    again = subprocess.run(base + ["approve", held_uuid, "--json"] + common, capture_output=True, text=True,
                           timeout=60)
    assert again.returncode == 1 and "CONFLICT" in again.stderr
    wrong = subprocess.run(base + ["list", "--server", server.url, "--token", server.tokens["submitter:alice"]],
                           capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 1 and "FORBIDDEN" in wrong.stderr
    assert json.loads(subprocess.run(base + ["list", "--json"] + common, capture_output=True, text=True,
                                     timeout=60).stdout)["reviews"] == []
