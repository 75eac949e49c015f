"""The hashed token store behind runner and submitter auth."""
from __future__ import annotations

import stat

import yaml

from kz_daemon.config.tokens import Principal, TokenStore, bearer_token, ensure_local_tokens


def test_issue_verify_and_hash_only_on_disk(tmp_path):
    store = TokenStore(tmp_path / "auth.yaml")
    token = store.issue("runner", "gpu-0")
    assert store.verify(token) == Principal("runner", "gpu-0")
    assert store.verify(token + "x") is None
    assert store.verify("") is None
    raw = (tmp_path / "auth.yaml").read_text()
    assert token not in raw
    doc = yaml.safe_load(raw)
    assert doc["tokens"][0]["id"] == "gpu-0" and len(doc["tokens"][0]["sha256"]) == 64
    assert stat.S_IMODE((tmp_path / "auth.yaml").stat().st_mode) == 0o600


def test_other_process_edits_are_picked_up_and_revoke_works(tmp_path):
    a = TokenStore(tmp_path / "auth.yaml")
    b = TokenStore(tmp_path / "auth.yaml")
    token = a.issue("submitter", "alice")
    assert b.verify(token) == Principal("submitter", "alice")
    assert b.revoke("submitter", "alice") == 1
    assert a.verify(token) is None


def test_bearer_header_parsing():
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer  abc ") == "abc"
    assert bearer_token("Basic abc") is None
    assert bearer_token(None) is None
    assert bearer_token("Bearer ") is None


def test_local_tokens_are_0600_and_reused(tmp_path):
    paths = ensure_local_tokens(tmp_path)
    runner = paths["runner"].read_text().strip()
    assert stat.S_IMODE(paths["runner"].stat().st_mode) == 0o600
    assert stat.S_IMODE(paths["admin"].stat().st_mode) == 0o600
    again = ensure_local_tokens(tmp_path)
    assert again["runner"].read_text().strip() == runner
    store = TokenStore(tmp_path / "auth.yaml")
    assert store.verify(runner) == Principal("runner", "local-runner")
    assert store.verify(paths["admin"].read_text().strip()) == Principal("admin", "admin")
    # a token file that no longer verifies is replaced
    paths["runner"].write_text("stale\n")
    fresh = ensure_local_tokens(tmp_path)["runner"].read_text().strip()
    assert fresh != "stale" and store.verify(fresh) == Principal("runner", "local-runner")
