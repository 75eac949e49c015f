"""The event log anchored in git: accept commits carry the chain head, and kz audit catches a log
rewritten with a fresh, whole hash chain, and a trailer that disagrees with the log."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kz_daemon.ops.runtime import init_state_dir
from kz_daemon.ops.service import Zoo
from kz_daemon.storage import anchor
from kz_daemon.storage.gitstore import GitStore
from kz_events.codec import GENESIS, canonical_bytes, line_hash
from kz_events.read.audit import check_anchors
from tests.helpers.daemon import AXPY_ID, EXAMPLES, accept_axpy

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def accepted(tmp_path):
    config = init_state_dir(tmp_path / "kz", seed_from=EXAMPLES)
    zoo = Zoo(config)
    zoo.start()
    try:
        view = accept_axpy(zoo, AXPY_ID, "a")
    finally:
        zoo.stop()
    return config, view.uuid


def kz_audit(state_dir):
    out = subprocess.run([sys.executable, "-m", "kz_daemon.cli", "audit", "--state-dir", str(state_dir), "--json"],
                         cwd=ROOT, capture_output=True, text=True, check=False,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    return out.returncode, out.stdout


def anchored_commits(config):
    git = GitStore.open(config.paths.repo, config.repo.branch)
    try:
        return [c for c in git.log() if anchor.TRAILER in c.trailers]
    finally:
        git.close()


def rewrite_log(events_dir: Path, edit) -> None:
    """Apply ``edit(event)`` to every event, then recompute every line's prev: a whole, fresh chain."""
    for snap in events_dir.glob("snapshot*"):
        snap.unlink()
    prev = GENESIS
    for seg in sorted(events_dir.glob("*.jsonl")):
        out = []
        for raw in seg.read_bytes().splitlines():
            event = json.loads(raw)
            edit(event)
            event["prev"] = prev
            line = canonical_bytes(event)
            prev = line_hash(line)
            out.append(line + b"\n")
        seg.write_bytes(b"".join(out))


def test_each_accept_commit_carries_a_chain_head_the_log_holds(accepted):
    config, sub_uuid = accepted
    commits = anchored_commits(config)
    assert {c.trailers["Kz-Step"] for c in commits} == {"source", "scorecard"}
    heads = [anchor.parse_head(c.trailers[anchor.TRAILER]) for c in commits]
    assert all(h is not None and h[0] > 0 for h in heads)
    assert check_anchors(config.paths.events, heads) == []
    code, out = kz_audit(config.state_dir)
    assert "ANCHOR" not in out and "TRAILER_MISMATCH" not in out, out


def test_a_log_rewritten_with_a_whole_chain_fails_its_anchors(accepted):
    config, sub_uuid = accepted

    def older_pid(event):
        if event["type"] == "daemon.started":
            event["payload"]["pid"] += 1  # an edit before every anchor

    rewrite_log(config.paths.events, older_pid)
    code, out = kz_audit(config.state_dir)
    assert code != 0
    doc = json.loads(out)
    text = json.dumps(doc)
    assert "CHAIN_BROKEN" not in text  # the chain itself is whole again
    assert "ANCHOR_MISMATCH" in text, text


def test_a_trailer_that_disagrees_with_the_log_is_reported(accepted):
    config, sub_uuid = accepted

    def other_submitter(event):
        if event["type"] == "submission.received" and event["payload"]["uuid"] == sub_uuid:
            event["payload"]["submitter_id"] = "mallory"

    rewrite_log(config.paths.events, other_submitter)
    code, out = kz_audit(config.state_dir)
    assert code != 0
    assert "TRAILER_MISMATCH" in out and "mallory" in out, out
