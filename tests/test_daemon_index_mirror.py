"""index.json stays equal to a full rebuild; mirrors receive the branch; `kz daemon` runs until SIGTERM."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from kz_daemon.accept import indexer
from kz_daemon.ops.repo_audit import audit_state_dir
from kz_daemon.ops.runtime import init_state_dir
from kz_daemon.ops.service import Zoo
from tests.helpers.daemon import AXPY_ID, EXAMPLES, ROOT, accept_axpy, axpy_tarball, drop_into_inbox, wait_for
from tests.helpers.submissions import every

NEW = "cpu/Elementwise/Axpy/fp32/second"


@pytest.fixture
def zoo(tmp_path):
    state = tmp_path / "kz"
    state.mkdir()
    bare = tmp_path / "mirror.git"
    (state / "kz.yaml").write_text(f"mirrors:\n  - {{name: backup, url: {bare}}}\n")
    z = Zoo(init_state_dir(state, seed_from=EXAMPLES))
    z.start()
    yield z
    z.stop()


def strip(doc):
    return {k: v for k, v in doc.items() if k != "generated_at"}


def test_incremental_index_equals_full_rebuild(zoo):
    v0 = zoo.store.state.index_version
    accept_axpy(zoo, AXPY_ID, "a", 5.0)
    accept_axpy(zoo, NEW, "b", 3.0)
    accept_axpy(zoo, AXPY_ID, "c", 9.0)
    wait_for(lambda: zoo.store.state.index_head == zoo.git.head())
    doc = json.loads(zoo.config.paths.index.read_text())
    assert zoo.store.state.index_version > v0
    assert zoo.index() == doc
    assert doc["head"] == zoo.git.head()
    with zoo.git_lock:
        zoo.git.sync_files()
        rebuilt = indexer.build(zoo.git.root, zoo.git.head())
    assert strip(doc) == strip(rebuilt)
    assert NEW in {k["kernel_id"] for k in doc["kernels"]}
    assert zoo.indexer._fast.hits == 3  # every accept took the O(log N) path
    assert [f for f in audit_state_dir(zoo.config.state_dir) if f.severity == "error"] == []


def test_audit_finds_a_stale_index_and_a_foreign_kz_commit(zoo):
    accept_axpy(zoo, AXPY_ID, "a")
    wait_for(lambda: zoo.store.state.index_head == zoo.git.head())
    path = zoo.config.paths.index
    doc = json.loads(path.read_text())
    doc["kernels"] = doc["kernels"][:-1]
    path.write_text(json.dumps(doc))
    from kz_daemon.storage.gitstore import format_message

    with zoo.git_lock:
        zoo.git.commit_changes({"x.txt": b"x"}, format_message("forged", {"Kz-Submission": "nope"}),
                               "x <x@x>", zoo.git.head())
    codes = {f.code for f in audit_state_dir(zoo.config.state_dir)}
    assert {"INDEX_STALE", "COMMIT_WITHOUT_EVENTS", "HEAD_MISMATCH"} <= codes


def test_mirror_receives_the_branch(zoo, tmp_path):
    from dulwich.repo import Repo

    view = accept_axpy(zoo, AXPY_ID, "a")
    wait_for(lambda: any(m.get("ok") and m.get("sha") == view.sha_br
                         for m in zoo.store.state.mirrors.values()))
    bare = Repo(str(tmp_path / "mirror.git"))
    assert bare.refs[b"refs/heads/main"].decode() == view.sha_br
    bare.close()


def test_kz_daemon_runs_until_sigterm(tmp_path):
    state = tmp_path / "kz"
    proc = subprocess.Popen([sys.executable, "-m", "kz_daemon.cli", "daemon", "--state-dir", str(state),
                             "--seed-from", str(EXAMPLES), "--no-http"], cwd=ROOT, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        line = proc.stderr.readline()
        assert "ready" in line, line
        drop_into_inbox(state / "spool", "p.tar.gz", axpy_tarball())
        wait_for(lambda: any((state / "pending").iterdir()))
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(30)
    assert rc == 0
    zoo = Zoo(init_state_dir(state))
    try:
        (sub,) = every(zoo.store).values()
        assert sub.status == "queued"
    finally:
        zoo.store.close()
        zoo.git.close()


def test_index_file_lagging_after_a_crash_is_caught_up(tmp_path):
    config = init_state_dir(tmp_path / "kz", seed_from=EXAMPLES)
    zoo = Zoo(config)
    zoo.start()
    stale = zoo.config.paths.index.read_bytes()
    accept_axpy(zoo, NEW, "n")
    zoo.stop()
    zoo.config.paths.index.write_bytes(stale)  # as if the writer had not run before a kill
    zoo = Zoo(config)
    zoo.start()
    try:
        assert NEW in {k["kernel_id"] for k in json.loads(config.paths.index.read_text())["kernels"]}
    finally:
        zoo.stop()
    assert [f for f in audit_state_dir(config.state_dir) if f.severity == "error"] == []


def test_kz_audit_command_runs_the_daemon_checks(zoo):
    accept_axpy(zoo, AXPY_ID, "a")
    wait_for(lambda: zoo.store.state.index_head == zoo.git.head())
    out = subprocess.run([sys.executable, "-m", "kz_daemon.cli", "audit", "--state-dir", str(zoo.config.state_dir),
                          "--json"], cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    doc = json.loads(out.stdout)
    assert out.returncode == 0 and doc["ok"] and "daemon" in doc["checked"], out.stdout + out.stderr
