"""The parse cache keeps one analysis per kernel: a replaced package's analysis is dropped."""
from __future__ import annotations

from kz_runner.contract.indexing.cache import ContentsCache
from kz_runner.contract.layout import CONTRACT_FILES, DESC, KP
from tests.helpers.daemon import AXPY_DIR, AXPY_ID


def _version(n: int) -> dict[str, bytes | None]:
    # the cache keys on the contract files: each version carries its own desc.yaml
    files = {name: (AXPY_DIR / KP / name).read_bytes() if (AXPY_DIR / KP / name).exists() else None
             for name in CONTRACT_FILES}
    files[DESC] = files[DESC] + f"# version {n}\n".encode()
    return files


def test_a_replaced_package_is_forgotten_in_memory():
    """Five versions of one kernel leave one analysis; another kernel and the newest version stay cached."""
    cache = ContentsCache()
    for n in range(5):
        cache.analyze(AXPY_ID, _version(n))
    assert len(cache) == 1
    cache.analyze("cpu/Reduction/Other/fp32/x", _version(0))
    assert len(cache) == 2
    hits = cache.hits
    cache.analyze(AXPY_ID, _version(4))
    assert cache.hits == hits + 1  # the newest version is still cached
    assert len(cache) == 2
