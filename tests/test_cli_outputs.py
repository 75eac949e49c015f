"""What the CLI and the upload say: short ids, human text and --json, held submissions, truncated uploads.

A real daemon on loopback (``LiveServer``) with the CPU Axpy example; ``kz`` runs as a
subprocess the way a user runs it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from kz_daemon.core.errors import ZooError
from kz_daemon.core.short_ids import resolve
from tests.helpers.daemon import AXPY_ID, axpy_result, axpy_tarball, drop_and_decide
from tests.helpers.http_server import CPU_AXPY, REPO_ROOT, LiveServer, package_tarball

TWINS = ("abcd1234-0000-4000-8000-000000000001", "abcd1234-0000-4000-8000-000000000002")


def kz(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kz_daemon.cli", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))


def accepted(zoo, name: str, uuid: str | None = None, latency: float = 5.0) -> str:
    meta = {"uuid": uuid, "submitter_id": "alice", "kernel_id": AXPY_ID} if uuid else None
    view = drop_and_decide(zoo, f"{name}.tar.gz", axpy_tarball(AXPY_ID, mutate=lambda f: f.__setitem__(
        "src/NOTES.md", name.encode())), meta)
    claim = zoo.claim("r1", "cpu", 10)
    assert claim is not None and claim.uuid == view.uuid
    done = zoo.report_result(view.uuid, "r1", claim.lease_id, axpy_result(AXPY_ID, latency), b"", {}, None)
    assert done.status == "accepted", done.reasons
    return view.uuid


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    server = LiveServer.start(tmp_path_factory.mktemp("cli"), kernels=[CPU_AXPY], settings={"submit_burst": 1000})
    server.twins = [accepted(server.zoo, f"twin{i}", uuid) for i, uuid in enumerate(TWINS)]
    server.single = accepted(server.zoo, "single")
    yield server
    server.stop()


# -- short ids ------------------------------------------------------------------------------------

def test_resolve_takes_uuids_and_unambiguous_prefixes():
    known = ["abcd1234-0000-4000-8000-000000000001", "abcd9999-0000-4000-8000-000000000002"]
    assert resolve("ABCD1234", known) == known[0]
    assert resolve(known[1], []) == known[1]  # a full uuid is taken as it is
    with pytest.raises(ZooError) as ambiguous:
        resolve("abcd", known, "accepted record")
    assert ambiguous.value.code == "AMBIGUOUS_ID" and ambiguous.value.details["candidates"] == known
    assert ambiguous.value.http_status == 409
    with pytest.raises(ZooError) as missing:
        resolve("ffff0000", known)
    assert missing.value.code == "NOT_FOUND"
    for bad in ("abc", "xyz12345", ""):
        with pytest.raises(ZooError) as refused:
            resolve(bad, known)
        assert refused.value.code == "BAD_REQUEST"


def test_kz_revoke_takes_the_short_id_and_answers_in_words(live):
    token = live.tokens["admin"]
    done = kz("revoke", live.single[:8], "--reason", "timed a cached result", "--server", live.url, "--token", token)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"revoked: {AXPY_ID} ({live.single[:8]}, {live.single}), submitted by ")
    assert lines[1] == "revoked by root: timed a cached result"
    assert lines[2].startswith("revocation commit: ") and "{" not in done.stdout
    again = kz("revoke", live.single, "--reason", "again", "--server", live.url, "--token", token, "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["status"] == "revoked"


def test_an_ambiguous_short_id_is_refused_naming_the_records(live):
    token = live.tokens["admin"]
    refused = kz("revoke", "abcd1234", "--reason", "which one?", "--server", live.url, "--token", token)
    assert refused.returncode == 1 and refused.stdout == ""
    assert "AMBIGUOUS_ID" in refused.stderr and all(uuid in refused.stderr for uuid in TWINS)
    unknown = kz("revoke", "ffff0000", "--reason", "nothing", "--server", live.url, "--token", token)
    assert unknown.returncode == 1 and "NOT_FOUND" in unknown.stderr
    with live.client("admin") as admin:
        resp = admin.post("/api/submissions/abcd1234/revoke", json={"reason": "x"})
    assert resp.status_code == 409 and resp.json()["error"]["details"]["candidates"] == list(TWINS)
    with live.client() as anon:
        assert anon.get(f"/api/submissions/{TWINS[0]}/status").json()["status"] == "accepted"


# -- kz submit and a held package -----------------------------------------------------------------

def test_kz_submit_returns_at_once_on_held_with_the_rule_and_exit_3(live, tmp_path):
    package = tmp_path / "held.tar.gz"
    package.write_bytes(package_tarball(f"{AXPY_ID[:-len('numpy_ref')]}held", CPU_AXPY,
                                        mutate=lambda f: f.__setitem__("src/extra.py", b'exec("x = 1")\n')))
    started = time.monotonic()
    held = kz("submit", str(package), "--server", live.url, "--submitter", "bob", "--timeout", "600")
    assert held.returncode == 3, held.stdout + held.stderr
    assert time.monotonic() - started < 60  # not the hour it would wait for a verdict
    out = held.stdout
    assert out.startswith("held: ") and "dynamic-code" in out and "src/extra.py:1" in out, out
    as_json = kz("submit", str(package), "--server", live.url, "--submitter", "bob", "--json")
    assert as_json.returncode == 3
    doc = json.loads(as_json.stdout)
    assert doc["status"] == "held" and "dynamic-code" in doc["held"]["rules"]


# -- what a rejection says ------------------------------------------------------------------------

def test_a_wrong_kernel_id_in_the_result_says_what_is_wrong_once(live):
    zoo = live.zoo
    view = drop_and_decide(zoo, "wrongid.tar.gz", axpy_tarball(AXPY_ID, mutate=lambda f: f.__setitem__(
        "src/NOTES.md", b"wrong id")))
    claim = zoo.claim("r1", "cpu", 10)
    done = zoo.report_result(view.uuid, "r1", claim.lease_id, axpy_result("cpu/x/y/z/w"), b"", {}, None)
    (reason,) = done.reasons
    assert reason["code"] == "RESULT_KERNEL_ID"
    assert not reason["message"].startswith("RESULT_KERNEL_ID")  # the code is beside it, not in it twice
    assert "'cpu/x/y/z/w'" in reason["message"] and AXPY_ID in reason["message"]


# -- a truncated upload ---------------------------------------------------------------------------

def test_a_truncated_multipart_upload_is_reported_as_truncated(live):
    boundary = "kzBoundary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"kernel_id\"\r\n\r\n{AXPY_ID}\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"package\"; filename=\"p.tar.gz\"\r\n"
            f"Content-Type: application/gzip\r\n\r\n").encode() + package_tarball(AXPY_ID) \
        + f"\r\n--{boundary}--\r\n".encode()
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}", "X-Submitter-Id": "bob"}
    with live.client() as http:
        for cut in (len(body) // 2, len(body) - 12):
            resp = http.post("/api/submissions", content=body[:cut], headers=headers)
            assert resp.status_code == 400 and resp.json()["error"]["code"] == "UPLOAD_TRUNCATED", resp.text
        whole = http.post("/api/submissions", content=body, headers=headers)
    assert whole.status_code == 202, whole.text


# -- kz gc --json -------------------------------------------------------------------------------

def test_kz_gc_prints_words_or_one_json_document(tmp_path):
    from kz_daemon.ops.runtime import init_state_dir
    from tests.helpers.http_server import seed_dir

    state = tmp_path / "state"
    init_state_dir(state, seed_from=seed_dir(tmp_path, [CPU_AXPY]))
    words = kz("gc", "--state-dir", str(state), "--dry-run")
    assert words.returncode == 0 and words.stdout.startswith("kz gc: would remove 0 file(s)")
    doc = kz("gc", "--state-dir", str(state), "--dry-run", "--json")
    assert doc.returncode == 0 and json.loads(doc.stdout) == {"dry_run": True, "count": 0, "submissions": 0,
                                                               "bytes": 0, "removed": []}


def test_kz_token_issue_prints_the_token_or_one_json_document(tmp_path):
    from kz_daemon.ops.runtime import init_state_dir
    from tests.helpers.http_server import seed_dir

    state = tmp_path / "state"
    init_state_dir(state, seed_from=seed_dir(tmp_path, [CPU_AXPY]))
    bare = kz("token", "issue", "runner", "gpu-1", "--state-dir", str(state))
    assert bare.returncode == 0 and bare.stdout.strip().startswith("kz_") and "\n" not in bare.stdout.strip()
    doc = json.loads(kz("token", "issue", "admin", "ops", "--state-dir", str(state), "--json").stdout)
    assert doc["kind"] == "admin" and doc["id"] == "ops" and doc["token"].startswith("kz_")
