"""The stored runs read back as result documents: an object, or null; anything else is damage, said so."""
from __future__ import annotations

import pytest

from kz_daemon.storage.pending import RESULT_FILE, PendingStore


def test_a_stored_run_reads_back_as_an_object_or_null_and_a_damaged_file_is_not_taken_for_one(tmp_path):
    store = PendingStore(tmp_path / "pending", tmp_path / "runs")
    run = store.store_run("u1", {"cases": [], "overall": {"accept": True}}, b"log", {}, None)
    assert run.result == store.load_result("u1") == {"cases": [], "overall": {"accept": True}}
    assert store.store_run("u2", None, b"", {}, {"code": "TIMEOUT"}).result is None
    assert store.load_result("u2") is None and store.load_run("u2").failure == {"code": "TIMEOUT"}
    with pytest.raises(FileNotFoundError):
        store.load_result("u1", "confirm-")
    # a result.json damaged into another JSON value: never handed on as if it were a result document
    (store.run_folder("u1") / RESULT_FILE).write_text("[1, 2]\n")
    with pytest.raises(ValueError, match="holds list, not an object"):
        store.load_result("u1")
    assert store.load_run("u1").result is None
