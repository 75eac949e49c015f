"""Retention: `kz gc` and the daemon's sweep prune finished submissions' files, and the API still answers.

A real daemon whose clock runs 40 days behind writes the submissions, so the log says
they finished 40 days ago; the sweeps then run at the real time.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import yaml
from starlette.testclient import TestClient

from kz_daemon.config.settings import DEFAULT_YAML, Config
from kz_daemon.config.tokens import TokenStore
from kz_daemon.core.errors import ZooError
from kz_daemon.http.app import create_app
from kz_daemon.ops.runtime import init_state_dir
from kz_daemon.ops.service import Zoo
from kz_daemon.storage.pending import LOGS_FILE, PACKAGE_FILE, RESULT_FILE, SUBMISSION_FILE
from kz_daemon.storage.run_logs import TAILS_FILE
from kz_daemon.upkeep import prune_runs as gc
from tests.helpers.daemon import (
    AXPY_ID,
    EXAMPLES,
    ROOT,
    axpy_result,
    axpy_tarball,
    drop_and_decide,
    drop_queued_axpy,
    wait_for,
)
from tests.helpers.submissions import every

DAY = 86400.0
BEHIND = 40 * DAY
CONFIG = "repo: {fsync: false}\n"


def _state(tmp_path, extra: str = "") -> Config:
    state = tmp_path / "kz"
    init_state_dir(state, seed_from=EXAMPLES)
    (state / "kz.yaml").write_text(CONFIG + extra)
    return Config.load(state)


def _run(zoo, name: str, accept: bool) -> str:
    sub_uuid = drop_and_decide(zoo, f"{name}.tar.gz", axpy_tarball(
        mutate=lambda f: f.__setitem__("src/NOTES.md", name.encode()))).uuid
    claim = zoo.claim("r", "cpu", 5)
    assert claim.uuid == sub_uuid
    view = zoo.report_result(sub_uuid, "r", claim.lease_id, axpy_result(AXPY_ID, 5.0, accept=accept),
                             b"full build log\n", {"host": "h"}, None, log_tails={"build": "TAIL-" + name})
    assert view.status == ("accepted" if accept else "rejected"), view.reasons
    return sub_uuid


def _kz_gc(config: Config, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kz_daemon.cli", "gc", "--state-dir", str(config.state_dir),
                           *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))


def _tree(config: Config) -> set[str]:
    return {str(p.relative_to(config.state_dir)) for base in (config.paths.pending, config.paths.runs)
            for p in base.rglob("*")}


@pytest.fixture
def old_zoo(tmp_path):
    """A running daemon holding submissions that ended 40 days ago: accepted, rejected, cancelled; one queued."""
    config = _state(tmp_path)
    zoo = Zoo(config, clock=lambda: time.time() - BEHIND)
    zoo.start()
    subs = {"accepted": _run(zoo, "acc", True), "rejected": _run(zoo, "rej", False)}
    subs["cancelled"] = drop_queued_axpy(zoo, AXPY_ID, "can")
    zoo.cancel(subs["cancelled"], "alice")
    subs["queued"] = drop_queued_axpy(zoo, AXPY_ID, "que")
    zoo.subs = subs
    yield zoo
    zoo.stop()


def test_retention_settings_load_with_defaults_and_refuse_negatives(tmp_path):
    keep = Config.from_dict(yaml.safe_load(DEFAULT_YAML), tmp_path).retention
    assert keep == Config.default(tmp_path).retention
    assert (keep.pending_days, keep.run_logs_days) == (7.0, 30.0)
    loaded = Config.from_dict({"retention": {"pending_days": 0, "run_logs_days": 90}}, tmp_path)
    assert (loaded.retention.pending_days, loaded.retention.run_logs_days) == (0.0, 90.0)
    for bad in ({"pending_days": -1}, {"sweep_interval_s": 0}, {"logs_days": 3}):
        with pytest.raises(ZooError) as info:
            Config.from_dict({"retention": bad}, tmp_path)
        assert info.value.code == "CONFIG_INVALID"


def test_young_entries_are_kept_and_the_package_goes_before_the_logs(old_zoo):
    config, subs = old_zoo.config, old_zoo.subs
    with old_zoo.store.lock:
        done = gc.finished(every(old_zoo.store).values())
    assert {d.uuid for d in done} == {subs["accepted"], subs["rejected"], subs["cancelled"]}
    # one day after they ended: nothing is due
    assert gc.plan(config, done, time.time() - BEHIND + DAY) == []
    # ten days after: packages go (and the cancelled entry, which never ran, goes whole); logs stay
    due = {(r.path.relative_to(config.state_dir).as_posix(), r.what)
           for r in gc.plan(config, done, time.time() - BEHIND + 10 * DAY)}
    assert due == {(f"pending/{subs['accepted']}/{PACKAGE_FILE}", "package"),
                   (f"pending/{subs['rejected']}/{PACKAGE_FILE}", "package"),
                   (f"pending/{subs['cancelled']}", "pending entry")}


def test_kz_gc_beside_the_running_daemon_prunes_only_finished_entries(old_zoo):
    config, subs = old_zoo.config, old_zoo.subs
    pending, runs = config.paths.pending, config.paths.runs
    before = _tree(config)
    dry = _kz_gc(config, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert _tree(config) == before  # --dry-run removes nothing
    assert f"would remove {pending / subs['cancelled']} (pending entry" in dry.stdout
    assert subs["queued"] not in dry.stdout

    done = _kz_gc(config)
    assert done.returncode == 0, done.stderr
    summary = done.stdout.strip().splitlines()[-1]
    assert summary.startswith("kz gc: removed ") and "of 3 submission(s)" in summary, done.stdout
    listed = lambda out, verb: {line.split(" (")[0][len(verb) + 1:]  # noqa: E731
                                for line in out.splitlines() if line.startswith(verb + " ")}
    assert listed(done.stdout, "removed") == listed(dry.stdout, "would remove")
    # accepted: the record a revocation needs stays, the package and logs go
    acc = subs["accepted"]
    assert sorted(p.name for p in (pending / acc).iterdir()) == [SUBMISSION_FILE]
    assert (runs / acc / RESULT_FILE).is_file()
    assert not (runs / acc / LOGS_FILE).exists() and not (runs / acc / TAILS_FILE).exists()
    # not accepted: gone whole, the runs folder as well
    for name in ("rejected", "cancelled"):
        assert not (pending / subs[name]).exists() and not (runs / subs[name]).exists()
    # never a non-terminal submission's files
    assert (pending / subs["queued"] / PACKAGE_FILE).is_file()
    assert not [p for base in (pending, runs) for p in base.iterdir() if p.name.startswith(gc.TRASH_PREFIX)]

    again = _kz_gc(config)
    assert again.returncode == 0 and "removed 0 file(s)" in again.stdout, again.stdout

    # the API and the pages still answer for every pruned submission
    app = create_app(old_zoo, TokenStore(config.state_dir / "auth.yaml"))
    with TestClient(app) as client:
        for name in ("accepted", "rejected", "cancelled"):
            uuid = subs[name]
            status = client.get(f"/api/submissions/{uuid}/status")
            assert status.status_code == 200 and status.json()["status"] == name, status.text
            page = client.get(f"/submissions/{uuid}")
            assert page.status_code == 200, page.text
        for name in ("accepted", "rejected"):
            uuid = subs[name]
            assert "log_tails" not in client.get(f"/api/submissions/{uuid}/status").json()
            logs = client.get(f"/api/submissions/{uuid}/logs")
            assert logs.status_code == 200 and logs.json()["pruned"] is True, logs.text
            assert "Logs pruned" in client.get(f"/submissions/{uuid}").text
        accepted = client.get(f"/api/submissions/{acc}/status").json()
        assert accepted["commit_sha"] and len(accepted["cases"]) == 3  # result.json and METAS kept
        queued = client.get(f"/submissions/{subs['queued']}").text
        assert "Logs pruned" not in queued


def test_logs_txt_goes_before_the_tails(old_zoo):
    """logs.txt goes before log_tails.json: while the tail is there the logs are not called pruned."""
    config, acc = old_zoo.config, old_zoo.subs["accepted"]
    with old_zoo.store.lock:
        done = gc.finished(every(old_zoo.store).values())
    order = [r.path.name for r in gc.plan(config, done, time.time()) if r.uuid == acc and r.what == "run logs"]
    assert order.index(LOGS_FILE) < order.index(TAILS_FILE)


def test_retention_zero_keeps_everything(tmp_path):
    config = _state(tmp_path, "retention: {pending_days: 0, run_logs_days: 0}\n")
    zoo = Zoo(config, clock=lambda: time.time() - BEHIND)
    zoo.start()
    try:
        uuid = drop_queued_axpy(zoo, AXPY_ID, "keep")
        zoo.cancel(uuid, "alice")
        assert zoo.sweep_retention().count == 0
        assert (config.paths.pending / uuid / PACKAGE_FILE).is_file()
    finally:
        zoo.stop()


def test_the_daemon_sweeps_at_start_and_clears_a_crashed_sweeps_leftovers(tmp_path):
    config = _state(tmp_path)
    zoo = Zoo(config, clock=lambda: time.time() - BEHIND)
    zoo.start()
    try:
        uuid = drop_queued_axpy(zoo, AXPY_ID, "old")
        zoo.cancel(uuid, "alice")
        # its own clock says the submission just ended: nothing to prune yet
        assert zoo.sweep_retention().count == 0
    finally:
        zoo.stop()
    leftover = config.paths.pending / f"{gc.TRASH_PREFIX}123-{uuid}"
    (leftover / "sub").mkdir(parents=True)
    (leftover / "sub" / "f").write_bytes(b"x" * 10)
    assert (config.paths.pending / uuid).is_dir()
    zoo = Zoo(config)
    zoo.start()
    try:
        wait_for(lambda: not (config.paths.pending / uuid).exists() and not leftover.exists(), timeout=30)
        assert zoo.submission(uuid).status == "cancelled"
    finally:
        zoo.stop()
