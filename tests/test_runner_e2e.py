"""The full pipeline: the real daemon + HTTP shim, real ``kz runner`` processes, the fixture packages.

Submissions go in through ``POST /api/submissions``; runners claim them over HTTP,
run them as child processes and report; the verdict is read back from the API,
the run's stored logs and the event log. Covered: an accepted run, a failed
build, timeouts, a crashing benchmark, junk on stdout, a package hunting for the
runner token, a runner killed mid-job (lease expiry, re-queue, a second runner
finishes it) and a runner stopped with SIGTERM (lease released).
"""
from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from test_job import PREFIX, leftovers, pack_fixture
from test_runner_loop import finish, start_runner

from kz_runner.worker.client import ZooClient

CONFIG = """\
queue:
  lease_seconds: {lease}
  max_attempts: 3
  reaper_interval_s: 0.2
timeouts:
  build_s: {build}
  benchmark_s: {bench}
repo:
  fsync: false
"""


def _start(tmp: Path, *, lease: float = 4, build: float = 30, bench: float = 15):
    from tests.helpers.http_server import LiveServer

    return LiveServer.start(tmp, kernels=[], runners=("r1", "r2"),
                            config_yaml=CONFIG.format(lease=lease, build=build, bench=bench))


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    server = _start(tmp_path_factory.mktemp("e2e"))
    yield server
    server.stop()


def submit(live, name: str, tmp_path: Path) -> str:
    """Upload fixture ``name`` like `kz submit` does; returns the submission uuid."""
    tarball = pack_fixture(name, tmp_path, with_scorecard=False)
    client = ZooClient(live.url, None)
    resp = client.upload_multipart("/api/submissions", {"kernel_id": f"{PREFIX}/{name}", "submitter_id": "carol"},
                                   "package", tarball, headers={"X-Submitter-Id": "carol"})
    assert resp.status == 202, resp.body
    return resp.body["uuid"]


def status(live, uuid: str) -> dict:
    return ZooClient(live.url, None).request_json("GET", f"/api/submissions/{uuid}/status").body


def wait_status(live, uuid: str, wanted: set[str], timeout: float = 60) -> dict:
    end = time.monotonic() + timeout
    while True:
        doc = status(live, uuid)
        if doc["status"] in wanted or time.monotonic() > end:
            return doc
        time.sleep(0.05)


def run_once(live, tmp_path: Path, runner: str = "r1", *extra: str) -> tuple[int, str]:
    proc = start_runner(live.url, tmp_path / f"work-{runner}", "--once", "--wait", "10", *extra,
                        token=live.tokens[f"runner:{runner}"])
    return finish(proc, timeout=90)


def stored_logs(live, uuid: str) -> bytes:
    return (live.state_dir / "runs" / uuid / "logs.txt").read_bytes()


def events_of(live, uuid: str) -> list[dict]:
    out = []
    for seg in sorted((live.state_dir / "events").glob("*.jsonl")):
        for line in seg.read_text().splitlines():
            ev = json.loads(line)
            if ev.get("subject", {}).get("submission") == uuid or ev.get("payload", {}).get("uuid") == uuid:
                out.append(ev)
    return out


def test_accepted_run_through_the_whole_pipeline(live, tmp_path):
    uuid = submit(live, "ok", tmp_path)
    code, err = run_once(live, tmp_path)
    assert code == 0, err
    doc = status(live, uuid)
    assert doc["status"] == "accepted", doc
    assert len(doc["commit_sha"]) == 40 and doc["runner_id"] == "r1"
    env = json.loads((live.state_dir / "runs" / uuid / "env.json").read_text())
    assert env["arch"] == "cpu" and env["runner_version"] and "benchmark_s" in env["timings"]
    assert b"benchmark.py exited with status 0" in stored_logs(live, uuid)
    kernel = ZooClient(live.url, None).request_json("GET", f"/api/kernels/{PREFIX}/ok").body
    best = kernel["bench_result"]["cases"][0]["metrics_best"]["latency_us"]
    assert best["commit_sha"] == doc["commit_sha"]


def test_failed_build_is_rejected_with_build_ok_false(live, tmp_path):
    uuid = submit(live, "build_fails", tmp_path)
    code, err = run_once(live, tmp_path)
    assert code == 0, err
    doc = status(live, uuid)
    assert doc["status"] == "rejected" and doc["reasons"][0]["code"] == "BUILD_FAILED", doc
    result = json.loads((live.state_dir / "runs" / uuid / "result.json").read_text())
    assert result["overall"]["build_ok"] is False and result["cases"][0]["correctness"] == "skipped"
    assert b"BUILD-BROKEN" in stored_logs(live, uuid)


@pytest.mark.parametrize("name, code, marker", [
    ("bench_crashes", "BENCHMARK_CRASHED", b"CRASH-MARKER"),
    ("bench_junk", "BAD_OUTPUT", b"JUNK-MARKER"),
])
def test_broken_benchmarks_are_rejected_with_their_code_and_logs(live, tmp_path, name, code, marker):
    uuid = submit(live, name, tmp_path)
    rc, err = run_once(live, tmp_path)
    assert rc == 0, err
    doc = status(live, uuid)
    assert doc["status"] == "rejected" and doc["reasons"][0]["code"] == code, doc
    assert marker in stored_logs(live, uuid)


def test_the_runner_token_is_invisible_to_the_package(live, tmp_path):
    uuid = submit(live, "token_thief", tmp_path)
    code, err = run_once(live, tmp_path)
    assert code == 0, err
    logs = stored_logs(live, uuid)
    assert b"THIEF-VERDICT: no credentials found" in logs, logs[-3000:]
    assert live.tokens["runner:r1"].encode() not in logs
    assert status(live, uuid)["status"] == "accepted"


def test_a_runner_killed_mid_job_loses_the_lease_and_another_runner_finishes(live, tmp_path):
    uuid = submit(live, "slow", tmp_path)
    victim = start_runner(live.url, tmp_path / "work-victim", "--wait", "10", token=live.tokens["runner:r1"])
    try:
        assert wait_status(live, uuid, {"running"})["status"] == "running"
        time.sleep(1.0)  # inside the benchmark's sleep
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait(30)
    # The lease expires (nobody renews it), the job goes back to the queue, r2 takes it.
    code, err = run_once(live, tmp_path, "r2")
    assert code == 0, err
    doc = status(live, uuid)
    assert doc["status"] == "accepted" and doc["runner_id"] == "r2", doc
    assert doc["attempts"] == 2
    types = [e["type"] for e in events_of(live, uuid)]
    assert "job.lease_expired" in types and types.count("job.claimed") == 2
    assert "job.lease_renewed" in types  # r2's run outlasts one lease: it was renewed while running
    assert "job.released" not in types


def test_sigterm_releases_the_lease_at_once(live, tmp_path):
    uuid = submit(live, "slow", tmp_path)
    proc = start_runner(live.url, tmp_path / "work-term", "--wait", "10", "--grace", "0.5",
                        token=live.tokens["runner:r1"])
    assert wait_status(live, uuid, {"running"})["status"] == "running"
    # The runner has the job once it fetched the package (which renews the lease). A SIGTERM
    # before that, while the claim's answer is still on its way, stops an idle runner; that
    # lost claim is queued again after queue.claim_confirm_s (test_daemon_queue).
    end = time.monotonic() + 60
    while "job.lease_renewed" not in [e["type"] for e in events_of(live, uuid)] and time.monotonic() < end:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    code, err = finish(proc)
    assert code == 0, err
    released = [e for e in events_of(live, uuid) if e["type"] == "job.released"]
    assert len(released) == 1 and released[0]["payload"]["reason"] == "runner stopping", \
        ([e["type"] for e in events_of(live, uuid)], err)
    assert status(live, uuid)["status"] == "queued"
    # Leave the module's queue empty for the other tests.
    code, err = run_once(live, tmp_path, "r2")
    assert code == 0 and status(live, uuid)["status"] == "accepted", err


def test_timeouts_kill_the_steps_and_reject(tmp_path):
    server = _start(tmp_path / "srv", build=2, bench=2)
    try:
        build = submit(server, "build_hangs", tmp_path)
        bench = submit(server, "bench_hangs_grandchild", tmp_path)
        for _ in range(2):
            code, err = run_once(server, tmp_path)
            assert code == 0, err
        assert status(server, build)["reasons"][0]["code"] == "BUILD_TIMEOUT"
        doc = status(server, bench)
        assert doc["status"] == "rejected" and doc["reasons"][0]["code"] == "BENCHMARK_TIMEOUT", doc
        assert leftovers(stored_logs(server, bench), b"GRANDCHILD_TAG") == []
    finally:
        server.stop()
