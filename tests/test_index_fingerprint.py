"""The index's content cache is keyed on the whole validator: a change anywhere in the contract package drops it."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kz_runner.contract.indexing.cache import CONTRACT_DIR, validator_fingerprint


@pytest.mark.parametrize("changed", ["validate.py", "rules/floor.py", "rules/engine.py", "indexing/build.py"])
def test_a_change_to_any_contract_module_changes_the_fingerprint(changed, tmp_path):
    copy = tmp_path / "contract"
    shutil.copytree(CONTRACT_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = validator_fingerprint(copy)
    assert validator_fingerprint(copy) == before == validator_fingerprint(Path(CONTRACT_DIR))
    with open(copy / changed, "a", encoding="utf-8") as f:
        f.write("\n# a changed verdict\n")
    validator_fingerprint.cache_clear()
    assert validator_fingerprint(copy) != before
