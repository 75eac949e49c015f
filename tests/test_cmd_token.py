"""``kz token`` issues tokens the token store accepts, lists principals, and revokes them."""
from __future__ import annotations

import json
import stat
import subprocess
import sys

from kz_daemon.config.tokens import Principal, TokenStore


def kz(*args, **kw):
    return subprocess.run([sys.executable, "-m", "kz_daemon", *args], capture_output=True, text=True, **kw)


def test_issue_list_revoke(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    out = kz("token", "--state-dir", str(state), "issue", "runner", "gpu-host-3")
    assert out.returncode == 0, out.stderr
    token = out.stdout.strip()
    assert TokenStore(state / "auth.yaml").verify(token) == Principal("runner", "gpu-host-3")

    secret = tmp_path / "creds" / "sub.token"
    out = kz("token", "--state-dir", str(state), "issue", "submitter", "alice", "--out", str(secret))
    assert out.returncode == 0, out.stderr
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert TokenStore(state / "auth.yaml").verify(secret.read_text().strip()) == Principal("submitter", "alice")

    listed = json.loads(kz("token", "--state-dir", str(state), "list", "--json").stdout)
    assert listed == [{"kind": "runner", "id": "gpu-host-3"}, {"kind": "submitter", "id": "alice"}]

    assert kz("token", "--state-dir", str(state), "revoke", "runner", "gpu-host-3").returncode == 0
    assert TokenStore(state / "auth.yaml").verify(token) is None
    assert kz("token", "--state-dir", str(state), "revoke", "runner", "gpu-host-3").returncode == 1


def test_missing_state_dir_and_missing_action_are_usage_errors(tmp_path):
    assert kz("token", "--state-dir", str(tmp_path / "nope"), "list").returncode == 2
    assert kz("token", "--state-dir", str(tmp_path)).returncode == 2


def test_state_dir_may_follow_the_action(tmp_path):
    out = kz("token", "issue", "runner", "gpu0", "--state-dir", str(tmp_path), "--out", str(tmp_path / "t"))
    assert out.returncode == 0, out.stderr
    listed = json.loads(kz("token", "list", "--json", "--state-dir", str(tmp_path)).stdout)
    assert listed == [{"kind": "runner", "id": "gpu0"}]
    # given before the action, it still counts when the action does not repeat it
    assert json.loads(kz("token", "--state-dir", str(tmp_path), "list", "--json").stdout) == listed
