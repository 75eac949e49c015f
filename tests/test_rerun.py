"""Reruns: an accepted record measured again, as its own kind of job, never touching the scorecard.

The reducer's rerun lifecycle on its own; the queue's handling over a real ``Zoo`` (a
rerun claimed like a job, pinned to a runner, its lease expiring, refused for a record
that is not accepted); and the whole loop on the CPU lane: the CPU Axpy example accepted
through a real ``kz runner``, ``kz rerun`` of it served by a second real runner run, the
figures beside the record's, the record's page listing the rerun, the scorecard and the
branch unchanged.
"""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from kz_daemon.core.errors import ZooError
from kz_daemon.queue import reruns
from kz_events import events as ev
from kz_events.reducer import InvalidTransition, apply_record, next_rerun
from kz_events.state import State, Submission
from tests.helpers.daemon import AXPY_ID, ROOT, accept_axpy, axpy_tarball, drop_and_decide, seeded_zoo
from tests.helpers.http_server import CPU_AXPY, LiveServer, package_tarball
from tests.test_runner_loop import finish, start_runner

CARD = f"{AXPY_ID}/.kernel_package/bench_result.yaml"


# -- the reducer -----------------------------------------------------------------------------------

def _fold(state: State, *events: ev.Event) -> State:
    for event in events:
        apply_record(state, state.seq + 1, "2026-12-01T00:00:00.000000Z", event.TYPE, event.payload())
    return state


def test_the_rerun_lifecycle_in_the_reducer():
    state = State()
    if hasattr(state, "accepted"):  # a State that keeps finished records compactly
        state.accepted["rec"] = "cpu/a/b/c/k"
    else:  # one that keeps finished submissions whole
        state.submissions["rec"] = Submission("rec", "cpu/a/b/c/k", "alice", "http", "t", "accepted", [])
    asked = ev.RerunRequested(rerun_id="r1", uuid="rec", kernel_id="cpu/a/b/c/k", arch="cpu", runner="gpu-7", by="root")
    _fold(state, asked)
    assert state.reruns["r1"]["status"] == "queued"
    assert next_rerun(state, "cpu", "other") is None and next_rerun(state, "cpu", "gpu-7") == "r1"
    with pytest.raises(InvalidTransition):  # pinned to gpu-7
        _fold(state, ev.RerunClaimed(rerun_id="r1", uuid="rec", runner_id="other", lease_id="l", lease_expires_at=9.0,
                                     attempt=1))
    _fold(state, ev.RerunClaimed(rerun_id="r1", uuid="rec", runner_id="gpu-7", lease_id="l1", lease_expires_at=9.0,
                                 attempt=1),
          ev.RerunReleased(rerun_id="r1", uuid="rec", runner_id="gpu-7", lease_id="l1", reason="stop", expired=False),
          ev.RerunClaimed(rerun_id="r1", uuid="rec", runner_id="gpu-7", lease_id="l2", lease_expires_at=9.0,
                          attempt=2))
    with pytest.raises(InvalidTransition):  # a stale lease cannot report
        _fold(state, ev.RerunReported(rerun_id="r1", uuid="rec", runner_id="gpu-7", lease_id="l1",
                                      result_sha256="0" * 64, cases=[], overall={}, env={}, env_changes=[]))
    _fold(state, ev.RerunReported(rerun_id="r1", uuid="rec", runner_id="gpu-7", lease_id="l2", result_sha256="0" * 64,
                                  cases=[], overall={"speedup": 1.0}, env={}, env_changes=[]))
    done = state.reruns["r1"]
    assert done["status"] == "done" and done["attempts"] == 2 and done["lease"] is None
    assert [h[1] for h in done["history"]] == ["queued", "running", "queued", "running", "done"]
    with pytest.raises(InvalidTransition):  # only an accepted record
        _fold(state, ev.RerunRequested(rerun_id="r2", uuid="nope", kernel_id="cpu/a/b/c/k", arch="cpu", runner=None,
                                       by="root"))
    assert State.from_json(state.to_json()).reruns == state.reruns  # snapshots keep them


# -- the queue, over a real Zoo ---------------------------------------------------------------------

def _zoo(tmp_path):
    return seeded_zoo(tmp_path, "queue:\n  max_attempts: 2\nconfirmation: {margin: 0}\n")


def test_a_rerun_is_claimed_like_a_job_pinned_to_its_runner_and_requeued_when_its_lease_expires(tmp_path):
    with _zoo(tmp_path) as zoo:
        record = accept_axpy(zoo, AXPY_ID, "record", 5.0)
        head = zoo.git.head()
        rerun_id = reruns.request(zoo, record.uuid[:8], "root", runner="r-pinned")
        assert zoo.claim("r-other", "cpu", 0) is None  # pinned: nobody else gets it
        claim = zoo.claim("r-pinned", "cpu", 0)
        assert (claim.uuid, claim.kernel_id, claim.attempt) == (rerun_id, AXPY_ID, 1)
        package = zoo.runner_package(rerun_id, "r-pinned")  # the record's folder at its source commit
        assert package.exists() and package.stat().st_size > 0
        zoo.renew(rerun_id, "r-pinned", claim.lease_id)
        assert reruns.get(zoo, rerun_id)["status"] == "running"
        from kz_daemon.queue import leases

        leases.reap(zoo, now=zoo.clock() + 10_000)  # its lease runs out: back in line, attempt counted
        assert reruns.get(zoo, rerun_id)["status"] == "queued"
        again = zoo.claim("r-pinned", "cpu", 0)
        zoo.release(rerun_id, "r-pinned", again.lease_id, "stopping")  # attempts spent (max 2): failed
        failed = reruns.get(zoo, rerun_id)
        assert failed["status"] == "failed" and failed["reason"]["code"] == "ATTEMPTS_EXHAUSTED"
        assert zoo.git.head() == head  # nothing of it reached git
        rejected = drop_and_decide(zoo, "bad.tar.gz", axpy_tarball(AXPY_ID, mutate=lambda f: f.__setitem__(
            "src/NOTES.md", b"bad")))
        with pytest.raises(ZooError) as refused:
            reruns.request(zoo, rejected.uuid, "root")
        assert refused.value.code in ("CONFLICT", "NOT_FOUND")  # queued, not an accepted record


# -- end to end on the CPU lane ---------------------------------------------------------------------

def _wait(live, uuid: str, statuses: set[str], timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    with live.client() as http:
        while True:
            doc = http.get(f"/api/submissions/{uuid}/status").json()
            if doc["status"] in statuses or time.monotonic() > deadline:
                return doc
            time.sleep(0.1)


def test_kz_rerun_measures_an_accepted_cpu_record_again_and_changes_nothing(tmp_path):
    live = LiveServer.start(tmp_path, kernels=[CPU_AXPY], runners=("r1",))
    try:
        with live.client() as anon:
            resp = live.submit(anon, CPU_AXPY, package_tarball(CPU_AXPY), submitter="alice")
        assert resp.status_code == 202, resp.text
        uuid = resp.json()["uuid"]
        code, err = finish(start_runner(live.url, tmp_path / "work-1", "--once", "--wait", "30",
                                        token=live.tokens["runner:r1"]), timeout=240)
        assert code == 0, err[-3000:]
        record = _wait(live, uuid, {"accepted", "rejected", "failed"})
        assert record["status"] == "accepted", record["reasons"]
        head, card = live.zoo.git.head(), live.zoo.git.read_file(CARD)

        runner = start_runner(live.url, tmp_path / "work-2", "--once", "--wait", "60", token=live.tokens["runner:r1"])
        rerun = subprocess.run([sys.executable, "-m", "kz_daemon.cli", "rerun", uuid[:8], "--server", live.url,
                                "--token", live.tokens["admin"], "--timeout", "240"],
                               cwd=ROOT, capture_output=True, text=True, timeout=300)
        code, err = finish(runner, timeout=240)
        assert code == 0, err[-3000:]
        assert rerun.returncode == 0, rerun.stdout + rerun.stderr
        out = rerun.stdout
        assert out.startswith("rerun ") and f"of {CPU_AXPY} (record {uuid[:8]}): done" in out, out
        for case in ("n4k", "n64k", "n1m"):
            assert case in out
        assert "overall: " in out and "environment" in out

        with live.client() as anon:
            doc = anon.get(f"/api/submissions/{uuid}/status").json()
            page = anon.get(f"/submissions/{uuid}").text
        (done,) = doc["reruns"]
        assert done["status"] == "done" and done["by"] == "root"
        assert [c["test_case_id"] for c in done["cases"]] == ["n4k", "n64k", "n1m"]
        for case in done["cases"]:  # each figure beside the record's, with the change
            assert case["original"] > 0 and case["value"] > 0 and isinstance(case["delta_pct"], float)
            assert case["correctness"] == "passed" and case["within_noise"] in (True, False)
        assert done["overall"]["correct"] is True
        assert f'id="rerun-{done["rerun_id"][:8]}"' in page and "done" in page
        # the scorecard and the branch are as the record left them; the record is still accepted
        assert live.zoo.git.head() == head and live.zoo.git.read_file(CARD) == card
        assert doc["status"] == "accepted" and doc["commit_sha"] == record["commit_sha"]
    finally:
        live.stop()
