"""Start-up recovery (kz_daemon/ops/recovery.py): SIGKILL the daemon at every point of the accept saga;
after restart recovery leaves all terminal, nothing doubled. Then each start-up decision on its own:
sagas finished from what reached git or rolled back, results judged again, expired leases, the
index brought to HEAD, stale git locks, intake outcomes, confirmation runs and revocations."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from kz_daemon.accept import revoke, saga as accept
from kz_daemon.accept.saga import CRASH_POINTS
from kz_daemon.ops import recovery
from kz_daemon.ops.repo_audit import audit_state_dir
from kz_daemon.ops.runtime import init_state_dir
from kz_daemon.ops.service import Zoo
from kz_daemon.queue import confirm
from kz_daemon.storage.gitstore import GitStore
from kz_events import events as ev
from kz_events.read.story import iter_events
from kz_events.status import Status
from tests.helpers.daemon import (
    AXPY_ID,
    EXAMPLES,
    ROOT,
    accept_axpy,
    axpy_result,
    axpy_tarball,
    drop_into_inbox,
    drop_queued_axpy,
    real_run,
    wait_for,
)
from tests.helpers.submissions import every

GIT = shutil.which("git")


@pytest.fixture(scope="module")
def real_result(tmp_path_factory):
    """One real run of the CPU Axpy package (build_test_env.py + benchmark.py as child processes)."""
    base = tmp_path_factory.mktemp("real")
    config = init_state_dir(base / "kz", seed_from=EXAMPLES)
    zoo = Zoo(config)
    zoo.start()
    try:
        drop_into_inbox(config.paths.spool, "p.tar.gz", axpy_tarball())
        claim = zoo.claim("r", "cpu", wait_s=30)
        result = real_run(zoo.runner_package(claim.uuid, "r"), base / "run")
    finally:
        zoo.stop()
    assert result["overall"]["accept"] is True
    path = base / "result.json"
    path.write_text(json.dumps(result))
    return path


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_sigkill_inside_the_saga_recovers_cleanly(point, real_result, tmp_path):
    config = init_state_dir(tmp_path / "kz", seed_from=EXAMPLES)
    drop_into_inbox(config.paths.spool, "p.tar.gz", axpy_tarball(
        mutate=lambda f: f.__setitem__("src/CHANGELOG", point.encode())))
    g = GitStore.open(config.paths.repo)
    base = g.head()
    g.close()
    env = dict(os.environ, KZ_CRASH_AT=point, PYTHONPATH=str(ROOT))
    child = subprocess.run([sys.executable, "-m", "tests.helpers.daemon_child", str(config.state_dir),
                            str(real_result)], env=env, cwd=ROOT, capture_output=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()[-2000:]

    zoo = Zoo(config)  # restart: recovery runs in start()
    zoo.start()
    try:
        subs = list(every(zoo.store).values())
        assert len(subs) == 1
        sub = subs[0]
        assert sub.status == "accepted", (sub.status, sub.reasons)
        commits = list(zoo.git.log(stop=base))
        assert [c.trailers.get("Kz-Step") for c in commits] == ["scorecard", "source"]
        assert all(c.trailers["Kz-Submission"] == sub.uuid for c in commits)
        assert commits[1].sha == sub.sha_src and commits[0].sha == sub.sha_br == zoo.git.head()
        card = zoo.git.read_file(f"{AXPY_ID}/.kernel_package/bench_result.yaml").decode()
        assert "__PENDING_COMMIT__" not in card and sub.sha_src in card
        wait_for(lambda: zoo.git._mark("kz-index") == zoo.git.tree_of(zoo.git.head()))
    finally:
        zoo.stop()
    assert [f for f in audit_state_dir(config.state_dir) if f.severity == "error"] == []
    assert not list((config.paths.repo / ".git").rglob("*.lock"))
    if GIT:
        subprocess.run([GIT, "-C", str(config.paths.repo), "fsck", "--strict"], check=True, capture_output=True)
        status = subprocess.run([GIT, "-C", str(config.paths.repo), "status", "--porcelain"], check=True,
                                capture_output=True, text=True).stdout
        assert status == ""


# -- each start-up decision of recovery.recover, in process, on a real state dir -----------------
# A crash is stood in for by Halt, raised at one of the saga's named crash points: the code after
# that point never runs, and the state dir is left as a SIGKILL there leaves it (every event
# before it is durable). Recovery then runs on a fresh Zoo that is not started, so the report and
# the events it emitted are recovery's own.
LEASE_S = 60.0


class Halt(BaseException):
    """The daemon stops dead at a crash point (BaseException: no ``except Exception`` swallows it)."""


class Clock:
    """A settable clock, so leases expire without waiting."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def config(tmp_path):
    state = tmp_path / "kz"
    state.mkdir()
    # the reaper never runs on its own here: lease expiry is recovery's decision in these tests
    (state / "kz.yaml").write_text(f"queue:\n  lease_seconds: {LEASE_S:.0f}\n  max_attempts: 2\n"
                                   "  reaper_interval_s: 3600\n")
    return init_state_dir(state, seed_from=EXAMPLES)


@contextlib.contextmanager
def running(config, clock=time.time):
    zoo = Zoo(config, clock=clock)
    zoo.start()
    try:
        yield zoo
    finally:
        zoo.stop()


@contextlib.contextmanager
def recovering(config, clock=time.time):
    """A restarted daemon before its threads: (zoo, recovery report, seq before recovery)."""
    zoo = Zoo(config, clock=clock)
    try:
        seq = zoo.store.state.seq
        yield zoo, recovery.recover(zoo), seq
    finally:
        zoo.stop()


def halting_at(monkeypatch, module, name, point):
    """Make ``module.name`` (a crash-point function) raise Halt at ``point``."""
    def crash(at: str) -> None:
        if at == point:
            raise Halt(at)
    monkeypatch.setattr(module, name, crash)


def events_after(config, seq: int) -> list[str]:
    return [e["type"] for e in iter_events(config.paths.events, after_seq=seq)]


def head_of(config) -> str:
    git = GitStore.open(config.paths.repo)
    try:
        return git.head()
    finally:
        git.close()


def saga_commits(zoo, base: str) -> list:
    return list(zoo.git.log(stop=base))


def accept_halted_at(config, monkeypatch, point: str) -> tuple[str, str]:
    """Queue, claim and report an accepting Axpy result; the daemon halts at ``point``. (uuid, base head)."""
    with running(config) as zoo, monkeypatch.context() as m:
        base = zoo.git.head()
        sub_uuid = drop_queued_axpy(zoo, AXPY_ID, "p")
        claim = zoo.claim("r", "cpu", 5)
        halting_at(m, accept, "crash_point", point)
        with pytest.raises(Halt):
            zoo.report_result(sub_uuid, "r", claim.lease_id, axpy_result(AXPY_ID), b"", {}, None)
        assert zoo.store.submission(sub_uuid).status == Status.ACCEPTING
    return sub_uuid, base


def assert_accepted_once(zoo, sub_uuid: str, base: str) -> None:
    sub = zoo.store.submission(sub_uuid)
    assert sub.status == Status.ACCEPTED, sub.reasons
    commits = saga_commits(zoo, base)
    assert [c.trailers.get("Kz-Step") for c in commits] == ["scorecard", "source"]
    assert (commits[1].sha, commits[0].sha) == (sub.sha_src, sub.sha_br)
    assert zoo.git.head() == sub.sha_br
    assert zoo.index()["head"] == sub.sha_br


@pytest.mark.parametrize("point", ["after_result_reported", "before_source_commit", "before_source_ref"])
def test_saga_with_nothing_in_git_runs_from_the_start(point, config, monkeypatch):
    # before_source_ref: commit 1's objects were written but the branch never moved to it
    sub_uuid, base = accept_halted_at(config, monkeypatch, point)
    assert head_of(config) == base
    with recovering(config) as (zoo, report, seq):
        assert report.sagas_finished == [sub_uuid] and report.sagas_rolled_back == []
        assert_accepted_once(zoo, sub_uuid, base)
        assert events_after(config, seq) == ["accept.source_committed", "accept.scorecard_committed",
                                             "index.updated", "accept.completed"]


def test_saga_with_nothing_in_git_and_its_package_gone_is_rolled_back(config, monkeypatch):
    sub_uuid, base = accept_halted_at(config, monkeypatch, "after_result_reported")
    (config.paths.pending / sub_uuid / "package.tar.gz").unlink()
    with recovering(config) as (zoo, report, seq):
        assert report.sagas_rolled_back == [sub_uuid] and report.sagas_finished == []
        assert zoo.store.submission(sub_uuid).status == Status.FAILED
        assert events_after(config, seq) == ["accept.rolled_back"]
        assert zoo.git.head() == base


def test_source_commit_without_its_event_is_found_by_its_trailer_not_made_again(config, monkeypatch):
    sub_uuid, base = accept_halted_at(config, monkeypatch, "after_source_commit")
    with recovering(config) as (zoo, report, seq):
        assert report.sagas_finished == [sub_uuid]
        assert_accepted_once(zoo, sub_uuid, base)
        assert events_after(config, seq)[:2] == ["accept.source_committed", "accept.scorecard_committed"]


def test_logged_source_commit_gets_its_scorecard_commit(config, monkeypatch):
    sub_uuid, base = accept_halted_at(config, monkeypatch, "after_source_event")
    with recovering(config) as (zoo, report, seq):
        assert report.sagas_finished == [sub_uuid]
        assert_accepted_once(zoo, sub_uuid, base)
        assert events_after(config, seq) == ["accept.scorecard_committed", "index.updated", "accept.completed"]


@pytest.mark.parametrize("point, emitted", [
    ("after_scorecard_commit", ["accept.scorecard_committed", "index.updated", "accept.completed"]),
    ("after_scorecard_event", ["index.updated", "accept.completed"]),
    ("after_index", ["index.updated", "accept.completed"]),
])
def test_both_commits_in_git_only_get_the_missing_events(point, emitted, config, monkeypatch):
    sub_uuid, base = accept_halted_at(config, monkeypatch, point)
    head = head_of(config)
    assert head != base
    with recovering(config) as (zoo, report, seq):
        assert report.sagas_finished == [sub_uuid]
        assert_accepted_once(zoo, sub_uuid, base)
        assert zoo.git.head() == head  # no commit made by recovery
        assert events_after(config, seq) == emitted


def test_saga_that_cannot_finish_after_its_source_commit_stays_accepting(config, monkeypatch):
    sub_uuid, base = accept_halted_at(config, monkeypatch, "after_source_event")
    (config.paths.runs / sub_uuid / "result.json").unlink()  # the scorecard cannot be written without it
    with recovering(config) as (zoo, report, seq):
        sub = zoo.store.submission(sub_uuid)
        assert sub.status == Status.ACCEPTING  # left for the reaper / the next start-up to retry
        assert report.sagas_rolled_back == []
        assert [c.trailers.get("Kz-Step") for c in saga_commits(zoo, base)] == ["source"]
        assert "accept.rolled_back" not in events_after(config, seq)


def test_saga_left_pending_is_not_reported_as_finished(config, monkeypatch):
    sub_uuid, _base = accept_halted_at(config, monkeypatch, "after_source_event")
    (config.paths.runs / sub_uuid / "result.json").unlink()
    with recovering(config) as (zoo, report, _seq):
        assert zoo.store.submission(sub_uuid).status == Status.ACCEPTING
        assert sub_uuid not in report.sagas_finished
        assert report.sagas_pending == [sub_uuid] and report.sagas_rolled_back == []


@pytest.mark.parametrize("point", ["after_source_commit", "after_source_event"])
def test_a_saga_half_way_in_git_is_finished_before_the_next_accept_commits(point, config, monkeypatch):
    """A saga stopped after its source commit (a full disk under the log, while the daemon kept
    serving) left the branch at that commit; the next accept committed on top, and the first
    saga's scorecard commit then met a moved branch on every retry (seen in the chaos test)."""
    with running(config) as zoo:
        base = zoo.git.head()
        other = "cpu/Elementwise/Axpy/fp32/second_impl"  # another kernel: one job in flight per kernel
        first, second = drop_queued_axpy(zoo, AXPY_ID, "first"), drop_queued_axpy(zoo, other, "second")
        claim = zoo.claim("r", "cpu", 5)
        assert claim.uuid == first
        with monkeypatch.context() as m:
            halting_at(m, accept, "crash_point", point)
            with pytest.raises(Halt):
                zoo.report_result(first, "r", claim.lease_id, axpy_result(AXPY_ID), b"", {}, None)
        assert zoo.store.submission(first).status == Status.ACCEPTING
        claim = zoo.claim("r2", "cpu", 5)
        assert claim.uuid == second
        view = zoo.report_result(second, "r2", claim.lease_id, axpy_result(other), b"", {}, None)
        assert view.status == "accepted", view.reasons
        subs = every(zoo.store)
        assert subs[first].status == Status.ACCEPTED, subs[first].reasons
        commits = saga_commits(zoo, base)
        assert [(c.trailers.get("Kz-Submission"), c.trailers.get("Kz-Step")) for c in commits] == [
            (second, "scorecard"), (second, "source"), (first, "scorecard"), (first, "source")]
        assert zoo.git.head() == subs[second].sha_br and zoo.index()["head"] == subs[second].sha_br
    assert [f for f in audit_state_dir(config.state_dir) if f.severity == "error"] == []


@pytest.mark.parametrize("point", ["before_source_ref", "after_source_commit"])
def test_saga_retried_after_a_harness_change_keeps_heads_harness(point, config, monkeypatch):
    # an ordinary submission accepted after a maintainer's harness commit: the retried commit 1
    # (recomputed, or found by its trailer) keeps HEAD's benchmark.py, and is made once
    bench = f"{AXPY_ID}/.kernel_package/benchmark.py"
    with running(config) as zoo, monkeypatch.context() as m:
        sub_uuid = drop_queued_axpy(zoo, AXPY_ID, "p")
        newer = zoo.git.read_file(bench) + b"\n# the maintainers' newer harness\n"
        with zoo.git_lock:
            base = zoo.git.commit_changes({bench: newer}, "maintainers: harness", "kernel_zoo <kz@localhost>",
                                          zoo.git.head())
        claim = zoo.claim("r", "cpu", 5)
        halting_at(m, accept, "crash_point", point)
        with pytest.raises(Halt):
            zoo.report_result(sub_uuid, "r", claim.lease_id, axpy_result(AXPY_ID), b"", {}, None)
    with recovering(config) as (zoo, report, _seq):
        assert report.sagas_finished == [sub_uuid]
        assert_accepted_once(zoo, sub_uuid, base)
        assert zoo.git.read_file(bench) == newer


def report_without_verdict(config, result: dict) -> tuple[str, str]:
    """Queue and claim an Axpy job, then log its result.reported alone (a torn append). (uuid, base)."""
    with running(config) as zoo:
        base = zoo.git.head()
        sub_uuid = drop_queued_axpy(zoo, AXPY_ID, "p")
        claim = zoo.claim("r", "cpu", 5)
        metas = zoo.pending.metas(sub_uuid)
        with zoo.lock:
            sub = zoo.store.submission(sub_uuid)
            run = confirm.store_run(zoo.pending, sub, result, b"", {}, None)
            zoo.store.emit(ev.ResultReported(
                uuid=sub_uuid, runner_id="r", lease_id=claim.lease_id, result_sha256=run.sha256,
                overall_accept=result["overall"]["accept"], build_ok=True,
                cases=accept.case_summary(result, metas), env={}))
        sub = zoo.store.submission(sub_uuid)
        assert sub.status == Status.RUNNING and sub_uuid not in zoo.store.state.queue.in_flight
    return sub_uuid, base


def test_accepting_result_without_its_verdict_is_judged_again_and_committed(config):
    sub_uuid, base = report_without_verdict(config, axpy_result(AXPY_ID))
    with recovering(config) as (zoo, report, seq):
        assert report.results_rejudged == [sub_uuid] and report.sagas_finished == [sub_uuid]
        assert_accepted_once(zoo, sub_uuid, base)
        assert events_after(config, seq)[0] == "accept.started"


def test_failing_result_without_its_verdict_is_judged_again_and_rejected(config):
    sub_uuid, base = report_without_verdict(config, axpy_result(AXPY_ID, accept=False, correctness="failed"))
    with recovering(config) as (zoo, report, seq):
        assert report.results_rejudged == [sub_uuid] and report.sagas_finished == []
        sub = zoo.store.submission(sub_uuid)
        assert sub.status == Status.REJECTED
        assert sub.reasons[-1]["stage"] == "result"
        assert events_after(config, seq)[0] == "submission.rejected"
        assert zoo.git.head() == base


def assert_implausible(sub) -> None:
    assert sub.status == Status.REJECTED, sub.reasons
    assert sub.reasons[-1]["code"] == "IMPLAUSIBLE_RESULT", sub.reasons
    assert "below the physics floor" in sub.reasons[-1]["message"]


def test_result_below_the_physics_floor_judged_again_is_rejected_as_implausible(config):
    # 10 ps for the Axpy cases: no device moves their bytes that fast (kz_daemon/guards/physics.py)
    sub_uuid, base = report_without_verdict(config, axpy_result(AXPY_ID, 0.00001))
    with recovering(config) as (zoo, report, _seq):
        assert report.results_rejudged == [sub_uuid] and report.sagas_finished == []
        assert_implausible(zoo.store.submission(sub_uuid))
        assert zoo.git.head() == base


def test_start_up_judges_a_result_below_the_physics_floor_as_implausible(config):
    sub_uuid, base = report_without_verdict(config, axpy_result(AXPY_ID, 0.00001))
    with running(config) as zoo:  # Zoo.start: confirm.recover decides it before recovery.recover
        assert_implausible(zoo.store.submission(sub_uuid))
        assert zoo.git.head() == base


def claimed_then_down(config, clock, attempts: int) -> str:
    """Queue an Axpy job, claim it ``attempts`` times (releasing all but the last, fetching the last's package); the daemon stops."""
    with running(config, clock) as zoo:
        sub_uuid = drop_queued_axpy(zoo, AXPY_ID, "p")
        for n in range(attempts):
            claim = zoo.claim(f"r{n}", "cpu", 5)
            assert claim.uuid == sub_uuid and claim.attempt == n + 1
            if n + 1 < attempts:
                zoo.release(sub_uuid, f"r{n}", claim.lease_id, "test")
        zoo.runner_package(sub_uuid, f"r{attempts - 1}")  # fetched, as a runner does: the full lease
    return sub_uuid


def test_lease_expired_while_down_is_requeued_with_the_attempt_counted(config):
    clock = Clock()
    sub_uuid = claimed_then_down(config, clock, attempts=1)
    clock.now += LEASE_S + 1
    with recovering(config, clock) as (zoo, report, seq):
        assert report.leases_expired == 1
        sub = zoo.store.submission(sub_uuid)
        assert sub.status == Status.QUEUED and sub.attempts == 1
        assert list(zoo.store.state.queue.pending) == [sub_uuid] and not zoo.store.state.queue.in_flight
        assert events_after(config, seq) == ["job.lease_expired"]


def test_lease_expired_on_the_last_attempt_fails_the_submission(config):
    clock = Clock()
    sub_uuid = claimed_then_down(config, clock, attempts=2)  # max_attempts is 2
    clock.now += LEASE_S + 1
    with recovering(config, clock) as (zoo, report, seq):
        assert report.leases_expired == 1
        sub = zoo.store.submission(sub_uuid)
        assert sub.status == Status.FAILED and sub.attempts == 2
        assert sub.reasons[-1]["code"] == "ATTEMPTS_EXHAUSTED"
        assert events_after(config, seq) == ["job.lease_expired", "job.failed"]


def test_lease_still_valid_at_restart_is_kept(config):
    clock = Clock()
    sub_uuid = claimed_then_down(config, clock, attempts=1)
    clock.now += LEASE_S - 1
    with recovering(config, clock) as (zoo, report, seq):
        assert report.leases_expired == 0
        assert zoo.store.submission(sub_uuid).status == Status.RUNNING
        assert list(zoo.store.state.queue.in_flight) == [sub_uuid]


def test_index_at_head_is_left_current(config):
    with running(config):
        pass
    before = config.paths.index.read_bytes()
    with recovering(config) as (zoo, report, seq):
        assert report.index == "current"
        assert events_after(config, seq) == []
    assert config.paths.index.read_bytes() == before


def test_index_behind_head_is_updated_for_the_changed_packages(config):
    with running(config):
        pass
    git = GitStore.open(config.paths.repo)  # a commit the index never saw (made while the daemon was down)
    try:
        head = git.head()
        desc = git.read_file(f"{AXPY_ID}/.kernel_package/desc.yaml").decode()
        changed = desc.replace("description:", "description: changed while down.", 1)
        assert changed != desc
        new_head = git.commit_changes({f"{AXPY_ID}/.kernel_package/desc.yaml": changed.encode()},
                                      "edit while down", config.repo.author, head)
    finally:
        git.close()
    with recovering(config) as (zoo, report, seq):
        assert report.index == "updated"
        doc = json.loads(config.paths.index.read_text())
        assert doc["head"] == new_head == zoo.index()["head"]
        assert "index.updated" in events_after(config, seq)
        assert zoo.store.state.index_head == new_head


@pytest.mark.parametrize("damage", ["missing", "unreadable", "unknown head"])
def test_index_missing_or_unreadable_is_rebuilt(damage, config):
    with running(config):
        pass
    path = config.paths.index
    kernels = {e["kernel_id"] for e in json.loads(path.read_text())["kernels"]}
    if damage == "missing":
        path.unlink()
    elif damage == "unreadable":
        path.write_text("{not json")
    else:
        doc = json.loads(path.read_text())
        doc["head"] = "f" * 40
        path.write_text(json.dumps(doc))
    with recovering(config) as (zoo, report, seq):
        assert report.index == "rebuilt"
        doc = json.loads(path.read_text())
        assert doc["head"] == zoo.git.head()
        assert {e["kernel_id"] for e in doc["kernels"]} == kernels
        assert "index.updated" in events_after(config, seq)


def test_stale_git_lock_files_are_removed(config):
    with running(config):
        pass
    git_dir = config.paths.repo / ".git"
    for rel in ("index.lock", "refs/heads/main.lock"):
        (git_dir / rel).write_text("left by a killed writer\n")
    with recovering(config) as (zoo, report, _seq):
        assert report.git_locks_removed == ["index.lock", os.path.join("refs", "heads", "main.lock")]
        assert not list(git_dir.rglob("*.lock"))


def test_intake_outcome_written_but_not_logged_gets_its_events(config, tmp_path):
    other = init_state_dir(tmp_path / "other", seed_from=EXAMPLES)
    with running(other) as zoo:
        sub_uuid = drop_queued_axpy(zoo, AXPY_ID, "p")
    # the outcome folder as intake writes it before its events: present on disk, absent from this log
    shutil.copytree(other.paths.pending / sub_uuid, config.paths.pending / sub_uuid)
    with recovering(config) as (zoo, report, seq):
        assert report.intake_recovered == 1
        sub = zoo.store.submission(sub_uuid)
        assert sub.status == Status.QUEUED and sub.kernel_id == AXPY_ID
        assert list(zoo.store.state.queue.pending) == [sub_uuid]


def test_result_far_ahead_logged_without_its_verdict_asks_for_a_confirmation_run(tmp_path):
    # Zoo.start judges such a result (confirm.recover) before recovery.recover would accept it
    state = tmp_path / "kz"
    state.mkdir()
    (state / "kz.yaml").write_text("queue:\n  reaper_interval_s: 3600\nconfirmation:\n  cpu_margin: 0.5\n")
    config = init_state_dir(state, seed_from=EXAMPLES)
    with running(config) as zoo:
        accept_axpy(zoo, AXPY_ID, "recorded", latency=10.0)
    sub_uuid, base = report_without_verdict(config, axpy_result(AXPY_ID, latency=1.0))  # 10x ahead
    with running(config) as zoo:
        sub = zoo.store.submission(sub_uuid)
        assert sub.status == Status.QUEUED and "confirmation" in sub.result
        assert zoo.git.head() == base  # nothing committed before the second run
        assert zoo.claim("r", "cpu", 0) is None  # the first result's runner may not confirm it
        assert zoo.claim("other", "cpu", 0).uuid == sub_uuid


@pytest.mark.parametrize("point", revoke.CRASH_POINTS)
def test_revocation_stopped_half_way_is_finished_with_one_commit(point, config, monkeypatch):
    with running(config) as zoo:
        accept_axpy(zoo, AXPY_ID, "slow", 9.0)
        best = accept_axpy(zoo, AXPY_ID, "best", 5.0)
        head = zoo.git.head()
        with monkeypatch.context() as m:
            halting_at(m, revoke, "_crash_point", point)
            with pytest.raises(Halt):
                zoo.revoke(best.uuid, "root", "measured wrong")
    zoo = Zoo(config)
    try:
        assert revoke.recover(zoo) == [best.uuid]
        sub = zoo.store.submission(best.uuid)
        commits = list(zoo.git.log(stop=head))
        assert [c.trailers["Revokes"] for c in commits] == [best.uuid]
        assert revoke.revocation(sub)["sha"] == commits[0].sha == zoo.git.head()
        assert revoke.recover(zoo) == []  # finished: nothing left for the next start-up
    finally:
        zoo.stop()
