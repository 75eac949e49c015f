"""A full disk answers 503 STORAGE_FULL with Retry-After, and the daemon recovers by itself.

Run for real on a small tmpfs holding the whole state directory (the test needs to
mount one: root, or skipped with the reason), and the headroom guard that refuses
uploads before the disk is full.
"""
from __future__ import annotations

import errno
import os
import subprocess

import pytest

from kz_events import events as ev
from kz_events.store import StorageError
from tests.helpers.http_server import CPU_AXPY, LiveServer, package_tarball


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
    with open(path, "wb") as out:
        try:
            while True:
                out.write(b"\0" * 65536)
                out.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
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
            assert server.zoo.store.state.submissions == {}
            ready = http.get("/readyz")
            assert ready.status_code == 503
            assert ready.json()["error"]["details"]["checks"]["disk"]["ok"] is False
    finally:
        server.stop()

