"""The Zoo facade (kz_daemon/ops/service.py) end to end on CPU: spool → queued → claimed → real run →
accepted with the two-commit model, a failing result rejected, a stranger's report refused; then the
facade's methods one by one (lookups, long polls, the upload cap, claims, stop, the lock order)."""
from __future__ import annotations

import io
import json
import shutil
import subprocess
import threading
import uuid as uuidlib

import pytest
import yaml

from kz_daemon.core.errors import ZooError
from kz_daemon.ops.runtime import init_state_dir
from kz_daemon.ops.service import Zoo
from tests.helpers.daemon import (
    AXPY_ID,
    EXAMPLES,
    axpy_result,
    axpy_tarball,
    drop_into_inbox,
    drop_queued_axpy,
    real_run,
    wait_for,
)
from tests.helpers.submissions import every

GIT = shutil.which("git")


@pytest.fixture
def zoo(tmp_path):
    config = init_state_dir(tmp_path / "kz", seed_from=EXAMPLES)
    z = Zoo(config)
    z.start()
    yield z
    z.stop()


def git(repo, *args):
    return subprocess.run([GIT, "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def submit_and_run(zoo, tmp_path, kernel_id, data, name="pkg.tar.gz"):
    drop_into_inbox(zoo.config.paths.spool, name, data)
    sub_uuid = wait_for(lambda: next((u for u, s in every(zoo.store).items()
                                      if s.kernel_id == kernel_id and s.status != "accepted"
                                      and s.status != "rejected" or False), None))
    view = zoo.wait_intake(sub_uuid, 30)
    assert view.status == "queued", view
    claim = zoo.claim("runner-1", "cpu", wait_s=5)
    assert claim is not None and claim.uuid == sub_uuid
    package = zoo.runner_package(sub_uuid, "runner-1")
    result = real_run(package, tmp_path / f"run-{sub_uuid[:8]}")
    return sub_uuid, claim, result


def test_accept_gives_exactly_two_commits(zoo, tmp_path):
    base = zoo.git.head()
    index_version = zoo.store.state.index_version
    data = axpy_tarball(mutate=lambda f: f.__setitem__("src/NOTES.md", b"faster\n"))
    sub_uuid, claim, result = submit_and_run(zoo, tmp_path, AXPY_ID, data)
    assert result["overall"]["accept"] is True, result
    view = zoo.report_result(sub_uuid, "runner-1", claim.lease_id, result, b"log", {"host": "t"}, None)
    assert view.status == "accepted"
    log = list(zoo.git.log(stop=base))
    assert len(log) == 2
    commit2, commit1 = log
    assert view.commit_sha == commit1.sha and view.sha_br == commit2.sha == zoo.git.head()
    assert commit2.subject == f"bench_result update (source {commit1.sha[:7]})"
    assert commit1.trailers["Kz-Submission"] == sub_uuid and commit1.trailers["Kz-Step"] == "source"
    assert commit2.trailers["Kz-Runner"] == "runner-1"
    bench_path = f"{AXPY_ID}/.kernel_package/bench_result.yaml"
    # commit 1 leaves the scorecard alone, commit 2 changes only it
    assert zoo.git.read_file(bench_path, commit1.sha) == zoo.git.read_file(bench_path, base)
    assert zoo.git.read_file(f"{AXPY_ID}/src/NOTES.md", commit1.sha) == b"faster\n"
    changed = {p for p, _m, s in zoo.git.walk_files("", commit2.sha)} ^ set()
    diff = [p for p in changed if zoo.git.read_file(p, commit2.sha) != zoo.git.read_file(p, commit1.sha)]
    assert diff == [bench_path]
    card = yaml.safe_load(zoo.git.read_file(bench_path))
    shas = {r["commit_sha"] for c in card["cases"] for r in c["metrics_current"].values()}
    assert shas == {commit1.sha}
    assert zoo.index()["head"] == commit2.sha  # in memory at once; the file follows
    wait_for(lambda: zoo.store.state.index_version > index_version
             and json.loads(zoo.config.paths.index.read_text())["head"] == commit2.sha)
    if GIT:
        git(zoo.git.root, "fsck", "--strict")
        assert git(zoo.git.root, "rev-parse", "HEAD").strip() == commit2.sha


def test_new_kernel_id_becomes_a_new_package(zoo, tmp_path):
    kid = "cpu/Elementwise/Axpy/fp32/my_impl"
    assert not zoo.git.exists(kid)
    sub_uuid, claim, result = submit_and_run(zoo, tmp_path, kid, axpy_tarball(kid))
    assert zoo.store.submission(sub_uuid).new_kernel is True
    view = zoo.report_result(sub_uuid, "runner-1", claim.lease_id, result, b"", {}, None)
    assert view.status == "accepted", view.reasons
    card = yaml.safe_load(zoo.git.read_file(f"{kid}/.kernel_package/bench_result.yaml"))
    assert card["kernel_id"] == kid
    best = [r for c in card["cases"] for r in c["metrics_best"].values()]
    assert best and all(r["commit_sha"] == view.commit_sha for r in best)  # no sentinel survives
    assert {e["kernel_id"] for e in zoo.index()["kernels"]} >= {kid, AXPY_ID}


def test_failing_result_is_rejected_without_a_commit(zoo, tmp_path):
    def break_it(files):
        files["src/axpy.py"] = files["src/axpy.py"].replace(b"+ y", b"- y").replace(b"add(", b"subtract(")
    base = zoo.git.head()
    sub_uuid, claim, result = submit_and_run(zoo, tmp_path, AXPY_ID, axpy_tarball(mutate=break_it))
    assert result["overall"]["accept"] is False
    view = zoo.report_result(sub_uuid, "runner-1", claim.lease_id, result, b"", {}, None)
    assert view.status == "rejected"
    assert view.reasons[0]["stage"] == "result"
    assert zoo.git.head() == base


def test_result_from_a_stranger_is_refused(zoo, tmp_path):
    sub_uuid, claim, result = submit_and_run(zoo, tmp_path, AXPY_ID, axpy_tarball())
    with pytest.raises(ZooError) as info:
        zoo.report_result(sub_uuid, "someone-else", claim.lease_id, result, b"", {}, None)
    assert info.value.code == "LEASE_LOST"
    with pytest.raises(ZooError):
        zoo.report_result(sub_uuid, "runner-1", "wrong-lease", result, b"", {}, None)
    assert zoo.submission(sub_uuid).status == "running"


# -- the facade's methods one by one --------------------------------------------------------
OTHER_ID = "cpu/Elementwise/Axpy/fp32/other_impl"
BOUND_S = 60.0  # a bound on a thread that must finish, not a measurement


def finished(target, *args) -> dict:
    """Run ``target(*args)`` in a thread; {'value'|'error': ...} once it returns (AssertionError past BOUND_S)."""
    out: dict = {}

    def body():
        try:
            out["value"] = target(*args)
        except BaseException as exc:  # handed to the test thread
            out["error"] = exc
    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    thread.join(BOUND_S)
    assert not thread.is_alive(), f"{target.__name__} did not return within {BOUND_S} s"
    return out


@pytest.fixture
def idle_zoo(tmp_path):
    """A Zoo whose threads never run (intake is driven by scan_inbox): the log moves only when a test acts."""
    z = Zoo(init_state_dir(tmp_path / "kz", seed_from=EXAMPLES))
    yield z
    z.stop()


def take_idle(zoo, kernel_id=AXPY_ID) -> str:
    """Upload an Axpy package to a Zoo without threads and scan until intake decided it; its uuid."""
    sub_uuid = zoo.drop_upload(io.BytesIO(axpy_tarball(kernel_id)), {})
    wait_for(lambda: zoo.scan_inbox() or zoo.store.knows(sub_uuid))
    return sub_uuid


def queue_idle(zoo, kernel_id=AXPY_ID) -> str:
    """``take_idle``, checked to be queued (no claim is waiting)."""
    sub_uuid = take_idle(zoo, kernel_id)
    assert zoo.submission(sub_uuid).status == "queued"
    return sub_uuid


def test_submission_of_an_unknown_uuid_is_not_found(idle_zoo):
    unknown = str(uuidlib.uuid4())
    with pytest.raises(ZooError) as info:
        idle_zoo.submission(unknown)
    assert info.value.code == "NOT_FOUND" and info.value.details == {"uuid": unknown}
    with pytest.raises(ZooError) as info:
        idle_zoo.wait_submission(unknown, 0, 0.1)
    assert info.value.code == "NOT_FOUND"


def test_wait_submission_returns_at_once_when_the_log_already_moved(idle_zoo):
    sub_uuid = queue_idle(idle_zoo)
    seq = idle_zoo.store.state.seq
    got = finished(idle_zoo.wait_submission, sub_uuid, seq - 1, 3600.0)  # would block an hour if it waited
    assert got["value"].status == "queued" and got["value"].seq == seq


def test_wait_submission_times_out_with_the_unchanged_view(idle_zoo):
    sub_uuid = queue_idle(idle_zoo)
    seq = idle_zoo.store.state.seq
    view = idle_zoo.wait_submission(sub_uuid, seq, 0.2)
    assert (view.status, view.seq) == ("queued", seq)


def test_wait_submission_wakes_on_the_next_event(idle_zoo):
    sub_uuid = queue_idle(idle_zoo)
    seq = idle_zoo.store.state.seq
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(view=idle_zoo.wait_submission(sub_uuid, seq, 3600.0)),
                              daemon=True)
    thread.start()
    idle_zoo.cancel(sub_uuid, "owner", "test")
    thread.join(BOUND_S)
    assert not thread.is_alive()
    assert result["view"].status == "cancelled" and result["view"].seq > seq


def test_wait_intake_returns_after_the_first_verdict(zoo):
    queued = zoo.drop_upload(io.BytesIO(axpy_tarball()), {})
    assert zoo.wait_intake(queued, BOUND_S).status == "queued"
    bad = zoo.drop_upload(io.BytesIO(b"not a tarball"), {})
    view = zoo.wait_intake(bad, BOUND_S)
    assert view.status == "rejected" and view.reasons[0]["stage"] == "intake"


def test_wait_intake_of_a_file_intake_never_saw_times_out_as_received(idle_zoo):
    unknown = str(uuidlib.uuid4())
    view = idle_zoo.wait_intake(unknown, 0.2)
    assert (view.uuid, view.status) == (unknown, "received")


def test_drop_upload_over_the_size_cap_is_refused_and_leaves_nothing(tmp_path):
    state = tmp_path / "kz"
    state.mkdir()
    (state / "kz.yaml").write_text("limits:\n  max_compressed_bytes: 1024\n")
    zoo = Zoo(init_state_dir(state, seed_from=EXAMPLES))
    try:
        data = axpy_tarball()
        assert len(data) > 1024
        with pytest.raises(ZooError) as info:
            zoo.drop_upload(io.BytesIO(data), {"submitter_id": "alice"})
        assert info.value.code == "PAYLOAD_TOO_LARGE"
        assert list(zoo.spool.inbox.iterdir()) == [] and list(zoo.spool.tmp.iterdir()) == []
        small = zoo.drop_upload(io.BytesIO(b"x" * 1024), {})  # at the cap is accepted into the inbox
        assert sorted(p.name for p in zoo.spool.inbox.iterdir()) == [f"{small}.meta.json", f"{small}.tar.gz"]
    finally:
        zoo.stop()


def test_claim_honours_arch_and_returns_none_after_wait_s(idle_zoo):
    sub_uuid = queue_idle(idle_zoo)
    assert idle_zoo.claim("gpu", "sm_90", wait_s=0.2) is None
    assert idle_zoo.submission(sub_uuid).status == "queued"
    claim = idle_zoo.claim("cpu", "cpu", wait_s=0.2)
    assert (claim.uuid, claim.arch, claim.attempt) == (sub_uuid, "cpu", 1)
    assert idle_zoo.claim("cpu2", "cpu", wait_s=0.2) is None  # nothing left
    assert idle_zoo.metrics()["claims_total"] == 1


def test_claim_waiting_gets_a_job_queued_while_it_waits(idle_zoo):
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(claim=idle_zoo.claim("r", "cpu", wait_s=BOUND_S)),
                              daemon=True)
    thread.start()
    sub_uuid = take_idle(idle_zoo)  # the waiting claim may take it before this returns
    thread.join(BOUND_S + 5)
    assert not thread.is_alive()
    assert result["claim"] is not None and result["claim"].uuid == sub_uuid


def test_stop_is_idempotent_and_joins_its_threads(tmp_path):
    before = set(threading.enumerate())
    zoo = Zoo(init_state_dir(tmp_path / "kz", seed_from=EXAMPLES))
    zoo.start()
    mine = [t for t in threading.enumerate() if t not in before and t.name.startswith("kz-")]
    assert {"kz-intake", "kz-reaper", "kz-sync", "kz-gc"} <= {t.name for t in mine}
    zoo.stop()
    assert [t.name for t in mine if t.is_alive()] == []
    zoo.stop()  # again: no error, nothing left to join
    assert zoo.stopping


def test_concurrent_claim_and_report_respect_the_lock_order(zoo):
    # report_result takes lock -> git_lock (the saga) -> store.lock while claims take lock -> git_lock and
    # lock -> store.lock: with the documented order they interleave and every call returns
    first = drop_queued_axpy(zoo, AXPY_ID, "a")
    second = drop_queued_axpy(zoo, OTHER_ID, "b")
    claim = zoo.claim("r1", "cpu", 5)
    assert claim.uuid == first
    start = threading.Barrier(3)

    def report():
        start.wait()
        return zoo.report_result(first, "r1", claim.lease_id, axpy_result(AXPY_ID), b"", {}, None)

    def claim_other():
        start.wait()
        return zoo.claim("r2", "cpu", wait_s=BOUND_S)

    def read_views():
        start.wait()
        return [(zoo.queue_view(), zoo.metrics(), zoo.submission(first)) for _ in range(50)]

    outcomes: dict = {}
    threads = [threading.Thread(target=lambda f=f: outcomes.update({f.__name__: finished(f)}), daemon=True)
               for f in (report, claim_other, read_views)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(BOUND_S + 5)
    assert [t for t in threads if t.is_alive()] == []
    assert {name: "error" in got for name, got in outcomes.items()} == \
        {"report": False, "claim_other": False, "read_views": False}, outcomes
    assert outcomes["report"]["value"].status == "accepted"
    assert outcomes["claim_other"]["value"].uuid == second
