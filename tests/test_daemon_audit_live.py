"""`kz audit` beside a running daemon: an index.json behind HEAD is a warning (INDEX_BEHIND) while
the daemon holds the event log's lock, an error (INDEX_STALE) once it is not running; a clean stop
leaves index.json at HEAD."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kz_daemon.ops.repo_audit import audit_state_dir, daemon_running
from kz_daemon.ops.runtime import init_state_dir
from kz_daemon.ops.service import Zoo
from tests.helpers.daemon import (
    AXPY_ID,
    EXAMPLES,
    ROOT,
    accept_axpy,
    wait_for,
)

NEW = "cpu/Elementwise/Axpy/fp32/audit_impl"


@pytest.fixture
def config(tmp_path):
    return init_state_dir(tmp_path / "kz", seed_from=EXAMPLES)


def errors(findings):
    return [f for f in findings if f.severity == "error"]


def kz_audit(state_dir):
    out = subprocess.run([sys.executable, "-m", "kz_daemon.cli", "audit", "--state-dir", str(state_dir), "--json"],
                         cwd=ROOT, capture_output=True, text=True, check=False,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    return out.returncode, json.loads(out.stdout)


def test_daemon_running_follows_the_event_log_lock(config):
    assert not daemon_running(config.paths.events)
    zoo = Zoo(config)
    zoo.start()
    try:
        assert daemon_running(config.paths.events)
    finally:
        zoo.stop()
    assert not daemon_running(config.paths.events)


def test_index_behind_head_is_a_warning_while_the_daemon_runs_and_an_error_after(config):
    zoo = Zoo(config)
    zoo.start()
    try:
        accept_axpy(zoo, AXPY_ID, "a")
        wait_for(lambda: zoo.store.state.index_head == zoo.git.head())
        behind = config.paths.index.read_bytes()  # index.json at the first accept's HEAD
        accept_axpy(zoo, NEW, "b")
        head = zoo.git.head()
        wait_for(lambda: zoo.store.state.index_head == head)
        # the file as the running daemon leaves it between an accept and its background write
        config.paths.index.write_bytes(behind)
        findings = audit_state_dir(config.state_dir)
        assert errors(findings) == [], findings
        (warning,) = [f for f in findings if f.code == "INDEX_BEHIND"]
        assert warning.severity == "warning"
        assert "2 commits behind HEAD" in warning.message and "running daemon" in warning.message
        rc, doc = kz_audit(config.state_dir)
        assert rc == 0 and doc["ok"] and "INDEX_BEHIND" in {f["code"] for f in doc["findings"]}, doc
        # behind AND not what a rebuild at its own commit gives: an error even while running
        tampered = json.loads(behind)
        tampered["kernels"] = tampered["kernels"][:-1]
        config.paths.index.write_text(json.dumps(tampered))
        assert "INDEX_STALE" in {f.code for f in errors(audit_state_dir(config.state_dir))}
        config.paths.index.write_bytes(behind)
    finally:
        zoo.stop()
    # the same file with no daemon running (as a kill between the accept and the write leaves it)
    assert json.loads(config.paths.index.read_text())["head"] != head
    (stale,) = errors(audit_state_dir(config.state_dir))
    assert stale.code == "INDEX_STALE" and "no daemon is running" in stale.message
    rc, doc = kz_audit(config.state_dir)
    assert rc == 1 and not doc["ok"]


def test_accept_then_stop_at_once_leaves_a_current_index(config):
    zoo = Zoo(config)
    zoo.start()
    views = [accept_axpy(zoo, NEW, "n", 3.0), accept_axpy(zoo, AXPY_ID, "a", 2.0)]
    zoo.stop()  # no wait for the background index writer
    doc = json.loads(config.paths.index.read_text())
    assert doc["head"] == views[-1].sha_br
    assert NEW in {k["kernel_id"] for k in doc["kernels"]}
    findings = audit_state_dir(config.state_dir)
    assert [f for f in findings if f.code.startswith("INDEX")] == [] and errors(findings) == [], findings
    rc, out = kz_audit(config.state_dir)
    assert rc == 0 and out["ok"], out
