"""The upload's submitter id and Idempotency-Key: one rule, the same on the client and the server."""
from __future__ import annotations

import re

import pytest

from kz_daemon.api import authz
from kz_daemon.core.errors import ZooError
from kz_daemon.intake import idempotency
from kz_runner.contract import upload

KEYS = ["k", "a b", "~" * 128, "~" * 129, "", "key\n", "ключ", "tab\there", " lead"]
IDS = ["alice", "a.b_c@d+e-f", "x" * 64, "x" * 65, "", "alice\n", "al ice", "ålice"]


@pytest.mark.parametrize("key", KEYS)
def test_client_and_server_take_the_same_idempotency_keys(key):
    server_takes = idempotency.key_error(key) is None
    assert upload.is_idempotency_key(key) == server_takes
    assert server_takes == bool(re.fullmatch(r"[ -~]{1,128}", key))


@pytest.mark.parametrize("value", IDS)
def test_client_and_server_take_the_same_submitter_ids(value):
    try:
        authz.check_submitter_id(value, "submitter_id")
        server_takes = True
    except ZooError:
        server_takes = False
    assert upload.is_submitter_id(value) == server_takes
    assert server_takes == bool(re.fullmatch(r"[A-Za-z0-9._@+-]{1,64}", value))


def test_a_trailing_newline_is_not_a_valid_submitter_id_or_key():
    assert not upload.is_submitter_id("alice\n")
    assert not upload.is_idempotency_key("k\n")
