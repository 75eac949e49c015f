"""Spool intake: sidecars, owners, restarts, rescans, crash windows, the upload path."""
from __future__ import annotations

import io
import json
import os
import pwd

import pytest

from kz_daemon.core.errors import ZooError
from kz_daemon.intake import spool
from kz_daemon.intake.admit import validate_file
from kz_daemon.ops.runtime import init_state_dir
from kz_daemon.ops.service import Zoo
from tests.helpers.daemon import AXPY_ID, EXAMPLES, axpy_tarball, drop_into_inbox, wait_for
from tests.helpers.submissions import every


@pytest.fixture
def config(tmp_path):
    state = tmp_path / "kz"
    state.mkdir()
    (state / "kz.yaml").write_text("intake:\n  rescan_interval_s: 0.2\n")
    return init_state_dir(state, seed_from=EXAMPLES)


def started(config):
    z = Zoo(config)
    z.start()
    return z


def only_submission(zoo):
    subs = wait_for(lambda: list(every(zoo.store).values()))
    assert len(subs) == 1
    return zoo.wait_intake(subs[0].uuid, 30)


def test_sidecar_gives_uuid_and_submitter(config):
    zoo = started(config)
    try:
        wanted = "12345678-1234-4234-8234-123456789abc"
        drop_into_inbox(config.paths.spool, "p.tar.gz", axpy_tarball(),
                        {"uuid": wanted, "submitter_id": "agent-7"})
        view = only_submission(zoo)
        assert (view.uuid, view.submitter_id, view.status) == (wanted, "agent-7", "queued")
        pending = config.paths.pending / wanted
        assert (pending / "package.tar.gz").exists()
        doc = json.loads((pending / "submission.json").read_text())
        assert doc["metas"][0]["test_case_id"] == "n4k"
        assert os.listdir(config.spool_inbox) == []
        # work/ is cleaned right after the events are durable (not before: it holds the uuid till then)
        wait_for(lambda: os.listdir(config.paths.spool / "work") == [])
    finally:
        zoo.stop()


def test_without_sidecar_the_file_owner_submits(config):
    zoo = started(config)
    try:
        drop_into_inbox(config.paths.spool, "p.tar.gz", axpy_tarball())
        view = only_submission(zoo)
        assert view.submitter_id == pwd.getpwuid(os.getuid()).pw_name
        assert view.source == "spool"
    finally:
        zoo.stop()


def test_file_dropped_while_down_is_found_at_start(config):
    drop_into_inbox(config.paths.spool, "early.tar.gz", axpy_tarball())
    zoo = started(config)
    try:
        assert only_submission(zoo).status == "queued"
    finally:
        zoo.stop()


def test_periodic_rescan_finds_what_the_watcher_missed(config):
    zoo = started(config)
    try:
        zoo._watcher.stop()  # as if inotify overflowed: only the periodic rescan is left
        drop_into_inbox(config.paths.spool, "quiet.tar.gz", axpy_tarball())
        assert only_submission(zoo).status == "queued"
    finally:
        zoo.stop()


def test_claimed_but_not_logged_is_decided_once_after_restart(config):
    path = drop_into_inbox(config.paths.spool, "c.tar.gz", axpy_tarball())
    dirs = spool.SpoolDirs(config.paths.spool)
    claimed = spool.claim(dirs, path, lambda u: False, lambda: "2026-01-01T00:00:00Z")  # crash right after
    assert claimed.tarball.exists() and not path.exists()
    zoo = started(config)
    try:
        view = only_submission(zoo)
        assert view.uuid == claimed.uuid and view.status == "queued"
    finally:
        zoo.stop()


def test_outcome_written_but_not_logged_is_emitted_at_restart(config):
    zoo = Zoo(config)  # not started: drive the intake by hand up to the crash window
    path = drop_into_inbox(config.paths.spool, "c.tar.gz", axpy_tarball())
    claimed = spool.claim(zoo.intake.dirs, path, lambda u: False, lambda: "2026-01-01T00:00:00Z")
    meta = dict(claimed.meta, sha256="0" * 64)
    outcome, facts = validate_file(claimed.tarball, "c.tar.gz", config.limits, None)
    zoo.intake._record(claimed.uuid, meta, outcome, claimed.tarball, facts)  # ... then the process dies
    zoo.store.close()
    zoo.git.close()
    zoo = started(config)
    try:
        view = only_submission(zoo)
        assert view.uuid == claimed.uuid and view.status == "queued"
        assert zoo.store.state.seq > 0
    finally:
        zoo.stop()
    zoo = started(config)  # and a second restart changes nothing
    try:
        assert len(every(zoo.store)) == 1
    finally:
        zoo.stop()


def test_reused_sidecar_uuid_gets_a_fresh_one(config):
    zoo = started(config)
    try:
        same = "12345678-1234-4234-8234-123456789abc"
        drop_into_inbox(config.paths.spool, "a.tar.gz", axpy_tarball(), {"uuid": same})
        wait_for(lambda: zoo.store.knows(same))
        drop_into_inbox(config.paths.spool, "b.tar.gz", axpy_tarball(), {"uuid": same})
        subs = wait_for(lambda: len(every(zoo.store)) == 2 and every(zoo.store))
        assert same in subs and len(set(subs)) == 2
    finally:
        zoo.stop()


def test_drop_upload_and_wait_intake(config):
    zoo = started(config)
    try:
        sub_uuid = zoo.drop_upload(io.BytesIO(axpy_tarball()),
                                   {"submitter_id": "alice", "kernel_id": AXPY_ID, "filename": "x.tar.gz"})
        view = zoo.wait_intake(sub_uuid, 30)
        assert view.status == "queued" and view.submitter_id == "alice" and view.source == "http"
        assert zoo.wait_submission(sub_uuid, view.seq, 0.05).status == "queued"
    finally:
        zoo.stop()


def test_upload_over_the_cap_leaves_nothing(tmp_path):
    state = tmp_path / "kz"
    state.mkdir()
    (state / "kz.yaml").write_text("limits:\n  max_compressed_bytes: 1000\n")
    config = init_state_dir(state)
    zoo = Zoo(config)
    try:
        with pytest.raises(ZooError) as info:
            zoo.drop_upload(io.BytesIO(b"x" * 5000), {"submitter_id": "a"})
        assert info.value.code == "PAYLOAD_TOO_LARGE"
        assert os.listdir(config.spool_tmp) == [] and os.listdir(config.spool_inbox) == []
    finally:
        zoo.store.close()
        zoo.git.close()


def test_unknown_submission_is_not_found(config):
    zoo = Zoo(config)
    try:
        with pytest.raises(ZooError) as info:
            zoo.submission("nope")
        assert info.value.code == "NOT_FOUND"
    finally:
        zoo.store.close()
        zoo.git.close()


def test_upload_name_is_checked(config):
    zoo = started(config)
    try:
        sub_uuid = zoo.drop_upload(io.BytesIO(axpy_tarball()), {"submitter_id": "a", "filename": "pkg.zip"})
        view = zoo.wait_intake(sub_uuid, 30)
        assert view.status == "rejected" and view.reasons[0]["code"] == "TARBALL_NAME"
    finally:
        zoo.stop()


def test_a_file_that_crashes_the_checks_is_rejected_not_retried(config, monkeypatch):
    import kz_daemon.intake.admit as intake

    def boom(*args, **kwargs):
        raise RuntimeError("validator bug")

    zoo = Zoo(config)
    try:
        monkeypatch.setattr(intake, "validate_file", boom)
        drop_into_inbox(config.paths.spool, "p.tar.gz", axpy_tarball())
        assert zoo.scan_inbox() == 1
        (sub,) = every(zoo.store).values()
        assert sub.status == "rejected" and sub.reasons[0]["code"] == "INTAKE_FAILED"
        monkeypatch.undo()
        drop_into_inbox(config.paths.spool, "q.tar.gz", axpy_tarball())
        zoo.scan_inbox()
        assert sorted(s.status for s in every(zoo.store).values()) == ["queued", "rejected"]
    finally:
        zoo.store.close()
        zoo.git.close()
