"""Revocation: an admin takes an accepted record back; the best is restored by a new commit, history kept."""
from __future__ import annotations

import contextlib
import copy
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
import yaml

from kz_daemon.accept.revoke import CRASH_POINTS
from kz_daemon.config.settings import Config
from kz_daemon.core.scorecard import recompute_best
from kz_daemon.ops.repo_audit import audit_state_dir
from kz_daemon.ops.runtime import init_state_dir
from kz_daemon.ops.service import Zoo
from kz_daemon.storage.gitstore import format_message
from tests.helpers.daemon import (
    AXPY_ID,
    EXAMPLES,
    ROOT,
    accept_axpy,
    axpy_result,
    axpy_tarball,
    drop_and_decide,
    real_run,
)
from tests.helpers.http_server import LiveServer

CARD = f"{AXPY_ID}/.kernel_package/bench_result.yaml"
NO_CONFIRMATION = "confirmation: {margin: 0}\n"


def _card(zoo, sha=None) -> dict:
    return yaml.safe_load(zoo.git.read_file(CARD, sha))


def _best(card: dict) -> list:
    return [c["metrics_best"]["latency_us"] for c in card["cases"]]


def _real_accept(zoo, tmp_path, name: str, factor: float = 1.0):
    """Submit the CPU Axpy example, run it for real as runner r1, report it (latencies times ``factor``)."""
    uuid = drop_and_decide(zoo, f"{name}.tar.gz", axpy_tarball(
        mutate=lambda f: f.__setitem__("src/NOTES.md", name.encode()))).uuid
    claim = zoo.claim("r1", "cpu", wait_s=10)
    result = real_run(zoo.runner_package(claim.uuid, "r1"), tmp_path / name, runner_id="r1")
    for case in result["cases"]:
        for metric in case["metrics"]:
            if metric["name"] == "latency_us":
                metric["value"] *= factor
                if "spread" in metric:  # the interval moves with the measurement
                    metric["spread"] = dict(metric["spread"], lo=metric["spread"]["lo"] * factor,
                                            hi=metric["spread"]["hi"] * factor)
    view = zoo.report_result(uuid, "r1", claim.lease_id, result)
    assert view.status == "accepted", view.reasons
    return view


def test_recompute_best_replays_the_remaining_records_over_the_baseline():
    metas = [{"test_case_id": "c", "primary_metric": "ms",
              "metrics": [{"name": "ms", "direction": "lower_better"}, {"name": "gbps", "direction": "higher_better"}]}]
    rec = lambda v, sha: {"value": v, "submitter": "s", "commit_sha": sha, "recorded_at": "t"}  # noqa: E731
    seed = {"cases": [{"test_case_id": "c", "metrics_best": {"ms": rec(0, "0000000"), "gbps": rec(0, "0000000")}}]}
    run = lambda ms, gbps, sha: {"cases": [{"test_case_id": "c",  # noqa: E731
                                            "metrics_current": {"ms": rec(ms, sha), "gbps": rec(gbps, sha)}}]}
    head = {"cases": [{"test_case_id": "c", "metrics_best": {"ms": rec(1, "bad"), "gbps": rec(99, "bad")},
                       "metrics_current": {"ms": rec(1, "bad")}, "correctness_current": "passed"}]}
    before = copy.deepcopy(head)
    out = recompute_best(head, metas, seed, [run(5, 10, "a"), run(4, 8, "b")])
    assert out["cases"][0]["metrics_best"] == {"ms": rec(4, "b"), "gbps": rec(10, "a")}
    assert out["cases"][0]["metrics_current"] == head["cases"][0]["metrics_current"] and head == before
    seeded = recompute_best(head, metas, seed, [])["cases"][0]["metrics_best"]
    assert {r["commit_sha"] for r in seeded.values()} == {"0000000"}


@pytest.fixture
def live(tmp_path):
    server = LiveServer.start(tmp_path, runners=("r1",), config_yaml=NO_CONFIRMATION)
    yield server
    server.stop()


def test_revoked_best_is_restored_end_to_end(live, tmp_path):
    zoo = live.zoo
    slow = _real_accept(zoo, tmp_path, "slow", factor=10.0)
    best = _real_accept(zoo, tmp_path, "best")
    assert _best(_card(zoo))[0]["commit_sha"] == best.commit_sha
    before = _card(zoo)
    head = zoo.git.head()
    path = f"/api/submissions/{best.uuid}/revoke"
    with live.client() as anon, live.client("runner:r1") as runner, live.client("admin") as admin:
        assert anon.post(path, json={"reason": "x"}).status_code == 401
        assert runner.post(path, json={"reason": "x"}).status_code == 403
        assert admin.post(path, json={}).status_code == 400
        resp = admin.post(path, json={"reason": "timed a cached result"})
        assert resp.status_code == 200, resp.text
        doc = resp.json()
        assert doc["status"] == "revoked" and doc["terminal"]
        again = admin.post(path, json={"reason": "twice"})  # idempotent: the same commit, no second one
        assert again.status_code == 200 and again.json()["status"] == "revoked"
        page = anon.get(f"/submissions/{best.uuid}")
        assert page.status_code == 200 and "status-revoked" in page.text and "timed a cached result" in page.text

    # events: revoked, then the commit recorded
    sub = zoo.store.submission(best.uuid)
    entry = next(r for r in sub.reasons if r["stage"] == "revoke")
    assert (entry["by"], entry["message"], entry["best_changed"]) == ("root", "timed a cached result", True)
    # git: one new commit on top, with its trailers; the best is the slow record again
    (commit,) = list(zoo.git.log(stop=head))
    assert commit.sha == entry["sha"] == zoo.git.head() and commit.parents == (head,)
    assert commit.trailers["Revokes"] == best.uuid and commit.trailers["Revoked-By"] == "root"
    assert commit.trailers["Kz-Step"] == "revoke" and commit.trailers["Kz-Submission"] == best.uuid
    after = _card(zoo)
    slow_card = _card(zoo, slow.sha_br)
    assert _best(after) == [c["metrics_current"]["latency_us"] for c in slow_card["cases"]]
    # the current record and the source area are the record that stands again
    assert [c["metrics_current"] for c in after["cases"]] == [c["metrics_current"] for c in slow_card["cases"]]
    assert [c["metrics_current"] for c in before["cases"]] != [c["metrics_current"] for c in after["cases"]]
    assert zoo.git.read_file(f"{AXPY_ID}/src/NOTES.md") == b"slow"
    # the index follows
    index = zoo.index()
    assert index["head"] == commit.sha
    entry_index = next(k for k in index["kernels"] if k["kernel_id"] == AXPY_ID)
    assert entry_index["cases"][0]["best"]["commit_sha"] == slow.commit_sha
    # a record that is not accepted cannot be revoked
    with live.client("admin") as admin:
        unknown = admin.post("/api/submissions/00000000-0000-4000-8000-000000000000/revoke", json={"reason": "x"})
        assert unknown.status_code == 404, unknown.text
        assert admin.post("/api/submissions/ffff0000/revoke", json={"reason": "x"}).status_code == 404
        malformed = admin.post("/api/submissions/no-such-uuid/revoke", json={"reason": "x"})
        assert malformed.status_code == 400 and malformed.json()["error"]["code"] == "BAD_REQUEST"
    live.stop()
    assert [f for f in audit_state_dir(live.state_dir) if f.severity == "error"] == []
    live.stop = lambda: None  # already stopped for the audit


def _state(tmp_path) -> Config:
    state = tmp_path / "kz"
    init_state_dir(state, seed_from=EXAMPLES)
    (state / "kz.yaml").write_text(NO_CONFIRMATION)
    return Config.load(state)


def _kz(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kz_daemon.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=env or dict(os.environ, PYTHONPATH=str(ROOT)))


@contextlib.contextmanager
def _running(config: Config) -> Iterator[Zoo]:
    """A started ``Zoo`` on ``config``, stopped on the way out."""
    zoo = Zoo(config)
    zoo.start()
    try:
        yield zoo
    finally:
        zoo.stop()


def _audit_errors(config: Config) -> list:
    """The error findings of ``kz audit`` on the state directory."""
    return [f for f in audit_state_dir(config.state_dir) if f.severity == "error"]


def test_revoking_a_record_that_is_neither_a_best_nor_the_latest_makes_a_commit_that_changes_no_file(tmp_path):
    config = _state(tmp_path)
    with _running(config) as zoo:
        fast = accept_axpy(zoo, AXPY_ID, "fast", 5.0)
        slow = accept_axpy(zoo, AXPY_ID, "slow", 9.0)
        accept_axpy(zoo, AXPY_ID, "later", 7.0)
        head = zoo.git.head()
        card = zoo.git.read_file(CARD)
        assert zoo.revoke(slow.uuid, "root", "wrong machine").status == "revoked"
        (commit,) = list(zoo.git.log(stop=head))
        assert commit.trailers["Revokes"] == slow.uuid
        assert zoo.git.tree_of(commit.sha) == zoo.git.tree_of(head) and zoo.git.read_file(CARD) == card
        assert _best(_card(zoo))[0]["commit_sha"] == fast.commit_sha
        entry = next(r for r in zoo.store.submission(slow.uuid).reasons if r["stage"] == "revoke")
        assert entry["best_changed"] is False
    assert _audit_errors(config) == []


def test_kz_revoke_on_a_stopped_daemon_restores_the_seed_when_no_record_remains(tmp_path):
    config = _state(tmp_path)
    with _running(config) as zoo:
        only = accept_axpy(zoo, AXPY_ID, "only", 5.0)
        bad = drop_and_decide(zoo, "bad.tar.gz", axpy_tarball())
        claim = zoo.claim("r", "cpu", 5)
        zoo.report_result(bad.uuid, "r", claim.lease_id, axpy_result(AXPY_ID, accept=False))
    refused = _kz("revoke", bad.uuid, "--reason", "x", "--state-dir", str(config.state_dir))
    assert refused.returncode == 1 and "CONFLICT" in refused.stderr
    done = _kz("revoke", only.uuid, "--reason", "benchmark bug", "--state-dir", str(config.state_dir))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"revoked: {AXPY_ID} ({only.uuid[:8]}") and "benchmark bug" in done.stdout
    with _running(config) as zoo:
        assert {r["commit_sha"] for r in _best(_card(zoo))} == {"0000000"}
        assert zoo.git.commit_info(zoo.git.head()).trailers["Revoked-By"] == "operator"
    assert _audit_errors(config) == []


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_sigkill_inside_the_revocation_recovers_without_a_second_commit(point, tmp_path):
    config = _state(tmp_path)
    with _running(config) as zoo:
        accept_axpy(zoo, AXPY_ID, "slow", 9.0)
        best = accept_axpy(zoo, AXPY_ID, "best", 5.0)
        head = zoo.git.head()
    env = dict(os.environ, KZ_CRASH_AT=point, PYTHONPATH=str(ROOT))
    child = _kz("revoke", best.uuid, "--reason", "crash", "--state-dir", str(config.state_dir), env=env)
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]

    with _running(config) as zoo:  # restart: recovery finishes the revocation
        sub = zoo.store.submission(best.uuid)
        entry = next(r for r in sub.reasons if r["stage"] == "revoke")
        commits = list(zoo.git.log(stop=head))
        assert [c.trailers["Revokes"] for c in commits] == [best.uuid]
        assert entry["sha"] == commits[0].sha == zoo.git.head()
        assert _best(_card(zoo))[0]["value"] == 9.0
        assert zoo.revoke(best.uuid, "root", "again").status == "revoked"  # idempotent
        assert len(list(zoo.git.log(stop=head))) == 1
    assert _audit_errors(config) == []


def test_audit_flags_a_revocation_commit_the_log_does_not_know(tmp_path):
    config = _state(tmp_path)
    with _running(config) as zoo:
        best = accept_axpy(zoo, AXPY_ID, "best", 5.0)
        with zoo.git_lock:
            zoo.git.commit_changes({}, format_message("revoke by hand", {
                "Kz-Submission": best.uuid, "Kz-Step": "revoke", "Revokes": best.uuid}),
                zoo.config.repo.author, zoo.git.head())
    codes = {f.code for f in _audit_errors(config)}
    assert "COMMIT_WITHOUT_EVENTS" in codes
