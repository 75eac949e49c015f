"""A full disk answers 503 STORAGE_FULL with Retry-After, and the daemon recovers by itself.

Run for real on a small tmpfs holding the whole state directory (the test needs to
mount one: root, or skipped with the reason), and the headroom guard that refuses
uploads before the disk is full.
"""
from __future__ import annotations

import errno
import os
import subprocess
import time
from pathlib import Path

import pytest
from dulwich.file import FileLocked

from kz_daemon.ops.runtime import init_state_dir
from kz_daemon.ops.service import Zoo
from kz_events import events as ev
from kz_events.log.store import StorageError
from kz_events.status import Status
from tests.helpers.daemon import AXPY_ID, EXAMPLES, axpy_result, drop_queued_axpy
from tests.helpers.http_server import CPU_AXPY, LiveServer, package_tarball
from tests.helpers.submissions import every


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs for a real full disk: {done.stderr.strip() or done.returncode}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(path, store):
    """Fill the file system, then the event log's last page, so the next append fails for real."""
    fill_disk(path)
    for _ in range(10_000):
        try:
            store.emit(ev.SpoolSkipped(name="filler-" + "x" * 500, reason="other"))
        except StorageError as exc:
            assert exc.full
            return
    raise AssertionError("the event log never ran out of space")


def test_full_disk_is_503_storage_full_and_recovers_without_restart(small_disk):
    server = LiveServer.start(small_disk, kernels=[CPU_AXPY],
                              config_yaml="limits:\n  min_free_bytes: 0\n")
    try:
        data = package_tarball(CPU_AXPY)
        with server.client() as http:
            first = server.submit(http, CPU_AXPY, data)
            assert first.status_code == 202, first.text
            queued = first.json()["uuid"]

            filler = small_disk / "filler"
            fill(filler, server.zoo.store)

            upload = server.submit(http, CPU_AXPY, data)  # the spool write fails
            assert upload.status_code == 503, upload.text
            assert upload.json()["error"]["code"] == "STORAGE_FULL"
            assert int(upload.headers["Retry-After"]) > 0
            assert not any((server.state_dir / "spool" / "tmp").iterdir()), "a partial upload was left"

            with server.client("submitter:alice") as alice:  # the event append fails
                cancel = alice.post(f"/api/submissions/{queued}/cancel", json={})
            assert cancel.status_code == 503, cancel.text
            assert cancel.json()["error"]["code"] == "STORAGE_FULL"
            assert "Retry-After" in cancel.headers

            ready = http.get("/readyz")
            assert ready.status_code == 503
            assert any(r.startswith("store:") for r in ready.json()["error"]["details"]["reasons"])
            assert http.get("/healthz").status_code == 200  # alive: a restart would not help

            os.unlink(filler)
            again = server.submit(http, CPU_AXPY, data)
            assert again.status_code == 202, again.text
            with server.client("submitter:alice") as alice:
                cancel = alice.post(f"/api/submissions/{queued}/cancel", json={})
            assert cancel.status_code == 200 and cancel.json()["status"] == "cancelled"
            assert http.get("/readyz").status_code == 200
    finally:
        server.stop()


def test_headroom_guard_refuses_uploads_before_the_disk_is_full(tmp_path):
    server = LiveServer.start(tmp_path, kernels=[CPU_AXPY],
                              config_yaml="limits:\n  min_free_bytes: 1099511627776000\n"
                                          "  min_free_percent: 100\n")
    try:
        with server.client() as http:
            resp = server.submit(http, CPU_AXPY, package_tarball(CPU_AXPY))
            assert resp.status_code == 503 and resp.json()["error"]["code"] == "STORAGE_FULL"
            assert int(resp.headers["Retry-After"]) > 0
            assert "headroom" in resp.json()["error"]["message"]
            assert every(server.zoo.store) == {}
            ready = http.get("/readyz")
            assert ready.status_code == 503
            assert ready.json()["error"]["details"]["checks"]["disk"]["ok"] is False
    finally:
        server.stop()



def fill_disk(path):
    """Write ``path`` until its file system refuses with ENOSPC."""
    with open(path, "wb") as out:
        try:
            while True:
                out.write(b"\0" * 65536)
                out.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


def poll(check, timeout=60.0):
    """``check()``'s first truthy value within ``timeout`` seconds (None when it never came)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    return None


def test_upload_acknowledged_while_the_log_is_full_appears_once_it_has_space(small_disk):
    # only the event log lives on the small disk: the spool takes the upload, the append fails
    server = LiveServer.start(small_disk.parent, kernels=[CPU_AXPY], settings={"intake_wait_s": 1.0},
                              config_yaml=f"paths:\n  events: {small_disk / 'events'}\n"
                                          "limits:\n  min_free_bytes: 0\n  min_free_percent: 0\n")
    try:
        filler = small_disk / "filler"
        fill(filler, server.zoo.store)
        with server.client() as http:
            upload = server.submit(http, CPU_AXPY, package_tarball(CPU_AXPY))
            assert upload.status_code == 202, upload.text
            assert upload.json()["status"] == "received"
            sub_uuid = upload.json()["uuid"]
            assert not server.zoo.store.knows(sub_uuid)
            status = http.get(f"/api/submissions/{sub_uuid}/status")
            assert status.status_code == 200, status.text  # the spool has it: not a 404
            assert status.json()["status"] == "received"

            os.unlink(filler)  # no restart: the running daemon's rescans record it
            queued = poll(lambda: (http.get(f"/api/submissions/{sub_uuid}/status").json()["status"]
                                   == "queued"))
            assert queued, http.get(f"/api/submissions/{sub_uuid}/status").text
        sub = server.zoo.store.submission(sub_uuid)
        assert sub.status == Status.QUEUED and sub.kernel_id == CPU_AXPY
        work = server.state_dir / "spool" / "work"
        assert poll(lambda: not any(work.iterdir()), 10), list(work.iterdir())
    finally:
        server.stop()


def configured_state(tmp_path, config_yaml: str = ""):
    """A state dir ``tmp_path/kz`` seeded from the examples, with ``config_yaml`` as its kz.yaml."""
    state = tmp_path / "kz"
    state.mkdir()
    if config_yaml:
        (state / "kz.yaml").write_text(config_yaml)
    return init_state_dir(state, seed_from=EXAMPLES)


def repo_on_small_disk(tmp_path, small_disk, reaper_s: float):
    """A state dir whose repo lives on the small disk; the reaper retries stalled sagas every ``reaper_s``."""
    return configured_state(tmp_path, f"paths:\n  repo: {small_disk / 'repo'}\n"
                                      f"queue:\n  reaper_interval_s: {reaper_s}\n")


def test_accept_on_a_full_repo_disk_waits_and_completes_once_it_has_space(tmp_path, small_disk):
    config = repo_on_small_disk(tmp_path, small_disk, 0.2)
    zoo = Zoo(config)
    zoo.start()
    try:
        base = zoo.git.head()
        sub_uuid = drop_queued_axpy(zoo, AXPY_ID, "p")
        claim = zoo.claim("r", "cpu", 5)
        filler = small_disk / "filler"
        fill_disk(filler)
        view = zoo.report_result(sub_uuid, "r", claim.lease_id, axpy_result(AXPY_ID), b"", {}, None)
        assert view.status == Status.ACCEPTING, view.reasons  # not failed: it waits for space
        time.sleep(0.5)  # the reaper retries (and fails) meanwhile
        assert zoo.store.submission(sub_uuid).status == Status.ACCEPTING

        os.unlink(filler)
        assert poll(lambda: zoo.store.submission(sub_uuid).status == Status.ACCEPTED), \
            zoo.store.submission(sub_uuid).status
        commits = list(zoo.git.log(stop=base))
        assert [c.trailers.get("Kz-Step") for c in commits] == ["scorecard", "source"]
        assert zoo.git.head() == zoo.store.submission(sub_uuid).sha_br
        assert not [p for p in (small_disk / "repo" / ".git").rglob("*.lock")]
    finally:
        zoo.stop()


def _enospc(lock):
    return OSError(errno.ENOSPC, "No space left on device")


def _file_locked(lock):
    return FileLocked(str(lock)[:-5], str(lock))


@pytest.mark.parametrize("lock_path, error", [
    # the write dies of ENOSPC and its lock file stays behind
    (("refs", "heads", "main.lock"), _enospc),
    # a failed write's lock met by the next attempt (the reaper's retry racing the report's
    # own cleanup): dulwich says FileLocked, which must not roll the saga back
    (("objects", "ab", "c" * 38 + ".lock"), _file_locked),
], ids=["enospc", "file_locked"])
def test_a_lock_left_by_a_failed_git_write_is_removed_and_the_saga_retried(tmp_path, monkeypatch,
                                                                             lock_path, error):
    zoo = Zoo(configured_state(tmp_path, "queue:\n  reaper_interval_s: 0.2\n"))
    zoo.start()
    try:
        base = zoo.git.head()
        sub_uuid = drop_queued_axpy(zoo, AXPY_ID, "p")
        claim = zoo.claim("r", "cpu", 5)
        real_commit = zoo.git.commit_changes
        lock = zoo.git.git_dir.joinpath(*lock_path)
        calls = []

        def fails_once(*args, **kwargs):
            calls.append(1)
            if len(calls) == 1:
                lock.parent.mkdir(exist_ok=True)
                lock.write_bytes(b"")
                raise error(lock)
            return real_commit(*args, **kwargs)

        monkeypatch.setattr(zoo.git, "commit_changes", fails_once)
        view = zoo.report_result(sub_uuid, "r", claim.lease_id, axpy_result(AXPY_ID), b"", {}, None)
        assert view.status in (Status.ACCEPTING, Status.ACCEPTED), view.reasons
        assert poll(lambda: zoo.store.submission(sub_uuid).status == Status.ACCEPTED), \
            zoo.store.submission(sub_uuid).status
        assert len(list(zoo.git.log(stop=base))) == 2
        assert not lock.exists()
    finally:
        zoo.stop()


def test_a_failed_object_write_leaves_no_lock_file(tmp_path, monkeypatch):
    # dulwich's GitFile keeps its .lock when the flush at close fails on a full disk
    zoo = Zoo(configured_state(tmp_path))
    try:
        store = zoo.git.store
        real_add = store.add_object

        def full_at_close(obj):
            hexsha = obj.id.decode()
            folder = Path(store.path) / hexsha[:2]
            folder.mkdir(exist_ok=True)
            (folder / (hexsha[2:] + ".lock")).write_bytes(b"half")
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(store, "add_object", full_at_close)
        with pytest.raises(OSError):
            zoo.git.commit_changes({"cpu/x/y/fp32/z/a.txt": b"fresh content"}, "m", "a <a@b>", zoo.git.head())
        assert not list(Path(store.path).rglob("*.lock"))
        monkeypatch.setattr(store, "add_object", real_add)
        assert zoo.git.commit_changes({"cpu/x/y/fp32/z/a.txt": b"fresh content"}, "m", "a <a@b>",
                                      zoo.git.head())
    finally:
        zoo.git.close()
        zoo.store.close()


def test_headroom_guard_watches_the_event_logs_own_disk(small_disk):
    # the state directory has room; only the disk the operator mounted for events/ is full
    server = LiveServer.start(small_disk.parent, kernels=[CPU_AXPY],
                              config_yaml=f"paths:\n  events: {small_disk / 'events'}\n")
    try:
        fill_disk(small_disk / "filler")
        with server.client() as http:
            started = time.monotonic()
            upload = server.submit(http, CPU_AXPY, package_tarball(CPU_AXPY))
            assert upload.status_code == 503, upload.text
            error = upload.json()["error"]
            assert error["code"] == "STORAGE_FULL" and "the event log's disk" in error["message"], error
            assert time.monotonic() - started < server.zoo.config.http.intake_wait_s  # refused, not waited out
            assert not any((server.state_dir / "spool" / "inbox").iterdir()), "the refused upload was spooled"
            disk = http.get("/readyz").json()["error"]["details"]["checks"]["disk"]
            assert disk["ok"] is False
            assert {d["folder"]: d["ok"] for d in disk["filesystems"]} == {"state_dir": True, "events": False}

            os.unlink(small_disk / "filler")
            again = server.submit(http, CPU_AXPY, package_tarball(CPU_AXPY))
            assert again.status_code == 202, again.text
    finally:
        server.stop()


def test_upload_is_answered_at_once_when_the_log_fails_during_its_wait(small_disk):
    # the guard off: the upload reaches the spool, intake's append fails; the answer does not
    # wait out intake_wait_s (a client's own timeout would fire first) but says "received" now
    server = LiveServer.start(small_disk.parent, kernels=[CPU_AXPY], settings={"intake_wait_s": 120.0},
                              config_yaml=f"paths:\n  events: {small_disk / 'events'}\n"
                                          "limits:\n  min_free_bytes: 0\n  min_free_percent: 0\n")
    try:
        fill(small_disk / "filler", server.zoo.store)
        with server.client() as http:
            started = time.monotonic()
            upload = server.submit(http, CPU_AXPY, package_tarball(CPU_AXPY))
            waited = time.monotonic() - started
            assert upload.status_code == 202, upload.text
            assert upload.json()["status"] == "received"
            assert waited < 60, f"the upload was answered after {waited:.0f} s"
    finally:
        server.stop()


def test_a_daemon_loop_failing_on_a_full_log_says_so_once_not_every_pass(small_disk, caplog):
    # the reaper runs every 0.05 s and each pass fails (an expired lease cannot be logged)
    zoo = Zoo(configured_state(small_disk.parent, f"paths:\n  events: {small_disk / 'events'}\n"
                                                  "queue:\n  reaper_interval_s: 0.05\n  lease_seconds: 1\n"))
    zoo.start()
    try:
        sub_uuid = drop_queued_axpy(zoo, AXPY_ID, "p")
        assert zoo.claim("r", "cpu", 5) is not None
        filler = small_disk / "filler"
        fill(filler, zoo.store)
        for _ in range(1000):  # the log's last page too, down to the shortest event
            try:
                zoo.store.emit(ev.SpoolSkipped(name="f", reason="other"))
            except StorageError:
                break
        time.sleep(3.0)  # the lease expires after 1 s: some 40 failing passes
        lines = [r for r in caplog.records if "lease reaper failed" in r.getMessage()]
        assert len(lines) == 1, (lines, zoo.store.submission(sub_uuid).status, zoo.store.health())
        os.unlink(filler)
        assert poll(lambda: zoo.store.submission(sub_uuid).status == Status.QUEUED), \
            zoo.store.submission(sub_uuid).status
        assert poll(lambda: "the lease reaper works again" in caplog.text, 10)
    finally:
        zoo.stop()
