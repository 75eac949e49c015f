"""Queue: arch match, one job per kernel in flight, fairness, leases, attempts, cancel, runner tarball."""
from __future__ import annotations

import asyncio
import tarfile
import threading

import pytest
import yaml

from kz_daemon.core.errors import ZooError
from kz_daemon.ops.runtime import init_state_dir
from kz_daemon.ops.service import Zoo
from tests.helpers.daemon import AXPY_ID, EXAMPLES, axpy_result, axpy_tarball, drop_into_inbox, drop_queued_axpy
from tests.helpers.events import hold_log_appends
from tests.helpers.submissions import every

OTHER = "cpu/Elementwise/Axpy/fp32/other_impl"
THIRD = "cpu/Elementwise/Axpy/fp32/third_impl"


class Clock:
    """A settable clock for lease expiry (the reaper thread is slowed down in these tests)."""

    def __init__(self):
        import time

        self.now = time.time()

    def __call__(self):
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def zoo(tmp_path, clock):
    state = tmp_path / "kz"
    state.mkdir()
    (state / "kz.yaml").write_text("queue:\n  lease_seconds: 60\n  max_attempts: 2\n  reaper_interval_s: 3600\n")
    z = Zoo(init_state_dir(state, seed_from=EXAMPLES), clock=clock)
    z.start()
    yield z
    z.stop()


queue = drop_queued_axpy


def test_arch_must_match(zoo):
    queue(zoo, AXPY_ID, "a")
    assert zoo.claim("gpu-runner", "sm_90", 0) is None
    assert zoo.claim("cpu-runner", "cpu", 0) is not None


def test_one_job_per_kernel_in_flight_and_fair_order(zoo):
    a1 = queue(zoo, AXPY_ID, "a1")
    a2 = queue(zoo, AXPY_ID, "a2")
    b1 = queue(zoo, OTHER, "b1")
    first = zoo.claim("r1", "cpu", 0)
    second = zoo.claim("r2", "cpu", 0)
    assert (first.uuid, second.uuid) == (a1, b1)  # a2 waits: its kernel has a job in flight
    assert zoo.claim("r3", "cpu", 0) is None
    zoo.cancel(a1, "operator", "test")
    third = zoo.claim("r3", "cpu", 0)
    assert third.uuid == a2


def test_lease_expiry_requeues_then_fails_after_max_attempts(zoo, clock):
    sub_uuid = queue(zoo, AXPY_ID, "x")
    c1 = zoo.claim("r1", "cpu", 0)
    assert zoo.renew(sub_uuid, "r1", c1.lease_id) == clock.now + 60
    clock.now += 61
    from kz_daemon.queue import leases as q

    assert q.reap(zoo) == 1
    sub = zoo.store.submission(sub_uuid)
    assert sub.status == "queued" and sub.attempts == 1
    with pytest.raises(ZooError) as info:
        zoo.renew(sub_uuid, "r1", c1.lease_id)
    assert info.value.code == "LEASE_LOST"
    c2 = zoo.claim("r2", "cpu", 0)
    assert c2.attempt == 2
    clock.now += 61
    q.reap(zoo)
    sub = zoo.store.submission(sub_uuid)
    assert sub.status == "failed" and sub.reasons[-1]["code"] == "ATTEMPTS_EXHAUSTED"
    assert "the last: the lease of runner r2 expired" in sub.reasons[-1]["message"]
    assert zoo.claim("r3", "cpu", 0) is None


def test_release_puts_the_job_back(zoo):
    sub_uuid = queue(zoo, AXPY_ID, "x")
    c1 = zoo.claim("r1", "cpu", 0)
    zoo.release(sub_uuid, "r1", c1.lease_id, "shutting down")
    assert zoo.submission(sub_uuid).status == "queued"
    with pytest.raises(ZooError):
        zoo.release(sub_uuid, "r1", c1.lease_id, "again")
    assert zoo.claim("r2", "cpu", 0).uuid == sub_uuid


def test_the_last_release_says_why_the_attempts_ran_out(zoo):
    # A job given back on every attempt (a runner's MACHINE_BUSY, say) fails saying how the last one ended.
    sub_uuid = queue(zoo, AXPY_ID, "x")
    for attempt in range(1, zoo.config.queue.max_attempts + 1):
        claim = zoo.claim(f"r{attempt}", "cpu", 0)
        zoo.release(sub_uuid, f"r{attempt}", claim.lease_id, f"MACHINE_BUSY: too loaded ({attempt})")
    sub = zoo.store.submission(sub_uuid)
    assert sub.status == "failed" and sub.reasons[-1]["code"] == "ATTEMPTS_EXHAUSTED"
    last = f"MACHINE_BUSY: too loaded ({zoo.config.queue.max_attempts})"
    assert sub.reasons[-1]["message"].endswith(f"the last: {last}"), sub.reasons[-1]


def test_claim_waits_for_a_job(zoo):
    got = {}
    t = threading.Thread(target=lambda: got.setdefault("c", zoo.claim("r1", "cpu", 20)))
    t.start()
    before = set(every(zoo.store))
    drop_into_inbox(zoo.config.paths.spool, "late.tar.gz", axpy_tarball())
    t.join(30)
    (sub_uuid,) = set(every(zoo.store)) - before
    assert got["c"].uuid == sub_uuid


def test_cancel_rules(zoo):
    sub_uuid = queue(zoo, AXPY_ID, "x")
    assert zoo.cancel(sub_uuid, "alice").status == "cancelled"
    with pytest.raises(ZooError) as info:
        zoo.cancel(sub_uuid, "alice")
    assert info.value.code == "CONFLICT"
    with pytest.raises(ZooError) as info:
        zoo.cancel("00000000-0000-0000-0000-000000000000", "alice")
    assert info.value.code == "NOT_FOUND"


@pytest.mark.parametrize("decision", ["claim", "renew", "release", "cancel"])
def test_a_decision_does_not_hold_the_zoo_lock_through_its_fsync(zoo, monkeypatch, decision):
    sub_uuid = queue(zoo, AXPY_ID, "x")
    lease = zoo.claim("r1", "cpu", 0).lease_id if decision != "claim" else None
    gate = threading.Event()
    batches = hold_log_appends(monkeypatch, gate.is_set, every=True)
    call = {"claim": lambda: zoo.claim("r1", "cpu", 0),
            "renew": lambda: zoo.renew(sub_uuid, "r1", lease),
            "release": lambda: zoo.release(sub_uuid, "r1", lease, "bye"),
            "cancel": lambda: zoo.cancel(sub_uuid, "alice")}[decision]
    done = []
    worker = threading.Thread(target=lambda: done.append(call()))
    worker.start()
    while not batches:  # the decision is made and its fsync has begun
        threading.Event().wait(0.001)
    assert zoo.lock.acquire(timeout=10), "zoo.lock is held through the fsync"
    zoo.lock.release()
    assert not done  # the caller still waits for its event to be durable
    gate.set()
    worker.join(20)
    assert done and zoo.store.seq == zoo.store.state.seq


def test_renewals_on_the_http_loop_share_fsyncs(zoo, monkeypatch):
    sub_uuid = queue(zoo, AXPY_ID, "x")
    lease = zoo.claim("r1", "cpu", 0).lease_id
    gate = threading.Event()
    batches = hold_log_appends(monkeypatch, gate.is_set, every=True)
    renewals = 30

    async def main():
        tasks = [asyncio.ensure_future(zoo.renew_async(sub_uuid, "r1", lease)) for _ in range(renewals)]
        while len(zoo.store._futures) < renewals:  # every renewal is decided and waits
            await asyncio.sleep(0.001)
        assert not any(t.done() for t in tasks)
        gate.set()
        return await asyncio.gather(*tasks)

    expiries = asyncio.run(main())
    assert expiries == [zoo.clock() + 60] * renewals
    assert sum(batches) == renewals and len(batches) <= 2
    with pytest.raises(ZooError) as info:
        asyncio.run(zoo.renew_async(sub_uuid, "r2", lease))
    assert info.value.code == "LEASE_LOST"


def test_an_http_decision_waits_in_a_thread_while_the_zoo_lock_is_held(zoo):
    from tests.helpers.threads import held_in_another_thread

    sub_uuid = queue(zoo, AXPY_ID, "x")

    async def main(release):
        task = asyncio.ensure_future(zoo.cancel_async(sub_uuid, "alice"))
        for _ in range(20):  # the loop keeps serving while the decision waits for the lock
            await asyncio.sleep(0.005)
        assert not task.done()
        release.set()
        await asyncio.wait_for(task, 20)

    with held_in_another_thread(zoo.lock) as release:  # like an accept saga's decision
        asyncio.run(main(release))
    assert zoo.submission(sub_uuid).status == "cancelled"


def members(path):
    with tarfile.open(path) as tar:
        return {m.name: (tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()}


def test_runner_package_carries_the_head_scorecard(zoo):
    sub_uuid = queue(zoo, AXPY_ID, "x")
    c = zoo.claim("r1", "cpu", 0)
    with pytest.raises(ZooError):
        zoo.runner_package(sub_uuid, "intruder")
    path = zoo.runner_package(sub_uuid, "r1")
    got = members(path)
    bench = f"{AXPY_ID}/.kernel_package/bench_result.yaml"
    assert got[bench] == zoo.git.read_file(bench)
    assert f"{AXPY_ID}/src/axpy.py" in got
    first = path.read_bytes()
    path.unlink()
    assert zoo.runner_package(sub_uuid, "r1").read_bytes() == first  # deterministic
    assert c.timeouts["build_s"] > 0


def test_runner_package_of_a_new_kernel_has_a_seed(zoo):
    sub_uuid = queue(zoo, OTHER, "new")
    zoo.claim("r1", "cpu", 0)
    card = yaml.safe_load(members(zoo.runner_package(sub_uuid, "r1"))[f"{OTHER}/.kernel_package/bench_result.yaml"])
    assert card["kernel_id"] == OTHER
    records = [r for c in card["cases"] for r in c["metrics_best"].values()]
    assert records and {r["commit_sha"] for r in records} == {"0000000"}
    assert [c["test_case_id"] for c in card["cases"]] == ["n4k", "n64k", "n1m"]


def test_runner_failure_rejects_without_commit(zoo):
    head = zoo.git.head()
    sub_uuid = queue(zoo, AXPY_ID, "x")
    c = zoo.claim("r1", "cpu", 0)
    view = zoo.report_result(sub_uuid, "r1", c.lease_id, None, b"boom", {},
                             {"code": "BENCHMARK_CRASHED", "message": "exit 1"})
    assert view.status == "rejected" and view.reasons[0]["code"] == "BENCHMARK_CRASHED"
    assert zoo.git.head() == head
    assert (zoo.config.paths.runs / sub_uuid / "logs.txt").read_bytes() == b"boom"


def test_failed_case_with_accept_is_422_and_rejected(zoo):
    head = zoo.git.head()
    sub_uuid = queue(zoo, AXPY_ID, "x")
    c = zoo.claim("r1", "cpu", 0)
    bad = axpy_result(AXPY_ID)
    bad["cases"][0]["correctness"] = "failed"
    bad["overall"]["accept"] = False
    with pytest.raises(ZooError) as info:
        zoo.report_result(sub_uuid, "r1", c.lease_id, bad, b"", {}, None)
    assert info.value.code == "RESULT_INVALID" and info.value.http_status == 422
    assert zoo.submission(sub_uuid).status == "rejected"
    assert zoo.git.head() == head


@pytest.mark.parametrize("mutate,code", [
    (lambda r: r.__setitem__("kernel_id", "cpu/x/y/z/w"), "RESULT_KERNEL_ID"),
    (lambda r: r["cases"].pop(), "RESULT_CASES"),
    (lambda r: r["cases"][1]["metrics"][0].__setitem__("value", float("nan")), "RESULT_NONFINITE"),
    (lambda r: r["overall"].__setitem__("build_ok", False), "BUILD_FAILED"),
    (lambda r: r["cases"][2].__setitem__("correctness", "skipped"), "ACCEPT_NOT_ALL_PASSED"),
])
def test_hard_checks_reject(zoo, mutate, code):
    head = zoo.git.head()
    sub_uuid = queue(zoo, AXPY_ID, "x")
    c = zoo.claim("r1", "cpu", 0)
    result = axpy_result(AXPY_ID)
    mutate(result)
    view = zoo.report_result(sub_uuid, "r1", c.lease_id, result, b"", {}, None)
    assert view.status == "rejected" and view.reasons[0]["code"] == code
    assert zoo.git.head() == head


def test_package_own_verdict_reject(zoo):
    sub_uuid = queue(zoo, AXPY_ID, "x")
    c = zoo.claim("r1", "cpu", 0)
    view = zoo.report_result(sub_uuid, "r1", c.lease_id, axpy_result(AXPY_ID, accept=False), b"", {}, None)
    assert view.status == "rejected" and view.reasons[0]["code"] == "PACKAGE_REJECTED"
    assert "test" in view.reasons[0]["message"]


def test_hand_result_accept_and_queue_view(zoo):
    sub_uuid = queue(zoo, THIRD, "t")
    c = zoo.claim("r1", "cpu", 0)
    qv = zoo.queue_view()
    assert qv["in_flight"][0]["uuid"] == sub_uuid and "r1" in qv["runners"]
    view = zoo.report_result(sub_uuid, "r1", c.lease_id, axpy_result(THIRD), b"", {}, None)
    assert view.status == "accepted" and view.commit_sha
    assert zoo.metrics()["submissions_by_status"]["accepted"] == 1


def test_package_frozen_after_queueing_is_never_claimed(zoo):
    from kz_daemon.storage.gitstore import format_message

    sub_uuid = queue(zoo, AXPY_ID, "x")
    path = f"{AXPY_ID}/.kernel_package/desc.yaml"
    with zoo.git_lock:
        desc = zoo.git.read_file(path).replace(b"status: normal", b"status: frozen")
        zoo.git.commit_changes({path: desc}, format_message("operator: freeze", {}), "op <op@x>", zoo.git.head())
    assert zoo.claim("r1", "cpu", 0) is None
    view = zoo.submission(sub_uuid)
    assert view.status == "rejected" and view.reasons[0]["code"] == "PACKAGE_FROZEN"


def test_saga_that_cannot_start_is_rolled_back_without_a_commit(zoo):
    head = zoo.git.head()
    sub_uuid = queue(zoo, AXPY_ID, "x")
    c = zoo.claim("r1", "cpu", 0)
    (zoo.config.paths.pending / sub_uuid / "package.tar.gz").unlink()  # the stored package is lost
    view = zoo.report_result(sub_uuid, "r1", c.lease_id, axpy_result(AXPY_ID), b"", {}, None)
    assert view.status == "failed" and view.reasons[-1]["code"] == "ROLLED_BACK"
    assert zoo.git.head() == head


def test_a_claim_nobody_confirms_is_queued_again_after_the_confirm_window(zoo, clock):
    # The claim's answer may never reach its runner (it was stopped mid-poll, the connection
    # dropped): the job must not wait out the whole lease, and a confirmed one keeps it.
    from kz_daemon.queue import leases as q

    lost = queue(zoo, AXPY_ID, "lost")
    kept = queue(zoo, OTHER, "kept")
    c_lost = zoo.claim("r1", "cpu", 0)
    c_kept = zoo.claim("r2", "cpu", 0)
    assert (c_lost.uuid, c_kept.uuid) == (lost, kept)
    assert zoo.store.state.queue.in_flight[lost].expires_at == clock.now + 30  # claim_confirm_s
    zoo.runner_package(kept, "r2")  # the runner fetches its package: confirmed, the full lease
    assert zoo.store.state.queue.in_flight[kept].expires_at == clock.now + 60
    clock.now += 31
    assert q.reap(zoo) == 1
    assert zoo.submission(lost).status == "queued" and zoo.submission(kept).status == "running"
    with pytest.raises(ZooError) as info:
        zoo.runner_package(lost, "r1")
    assert info.value.code == "LEASE_LOST"
