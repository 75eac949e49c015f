"""The index's speed paths give exactly the answers of the serial build.

A parallel build (forked workers claiming chunks, this process decoding what they
send) gives the serial document, also when a worker dies; the daemon's cold start
forks only while no other thread runs. Plus the small helpers the index leans on.
"""
from __future__ import annotations

import json

import pytest

from kz_runner.contract.indexing import build as index_module
from kz_runner.contract.indexing.build import build_index, dumps
from kz_runner.contract.indexing.cache import ContentsCache
from kz_runner.contract.rules import pysource
from kz_runner.contract.rules.pysource import BENCHMARK_FILE
from tests.helpers.contract_fixtures import mark_repo, write_package

# ---------------------------------------------------------------- parallel builds


@pytest.fixture
def many(tmp_path, monkeypatch):
    root = mark_repo(tmp_path / "many")
    for i in range(40):
        write_package(root, f"cpu/Op{i % 3}/Sub/fp32/impl{i}", best=0.1 * (i + 1),
                      status="frozen" if i % 7 == 0 else "normal")
    write_package(root / "cpu/Op0/Sub/fp32/impl0/src", "nested")
    (root / "cpu/Op1/Sub/fp32/impl1/.kernel_package/desc.yaml").write_text("name: [unclosed\n")
    monkeypatch.setattr(index_module, "PARALLEL_MIN_PACKAGES", 2)
    monkeypatch.setattr(index_module, "_CHUNK", 3)  # many claims, so every process takes some
    return root


@pytest.mark.parametrize("workers", [2, 3, 5])
def test_parallel_build_equals_serial(many, workers):
    serial = dumps(build_index(many))
    assert dumps(build_index(many, workers=workers)) == serial
    cache = ContentsCache()
    assert dumps(build_index(many, cache=cache, workers=workers)) == serial
    assert cache.misses == 41 and cache.hits == 0
    assert dumps(build_index(many, cache=cache, workers=workers)) == serial  # now from the cache
    assert cache.hits == 41


def test_parallel_build_survives_a_worker_that_dies_at_once(many, monkeypatch):
    serial = dumps(build_index(many))

    def die(*_args):
        raise RuntimeError("worker lost")

    monkeypatch.setattr(index_module, "_worker", die)
    assert dumps(build_index(many, workers=2)) == serial


def test_parallel_build_survives_a_worker_that_dies_midway(many, monkeypatch):
    import os

    serial = dumps(build_index(many))
    parent = os.getpid()
    real_scan, real_chunk = index_module._scan, index_module._scan_chunk
    parent_calls = []
    worker_chunks = []

    def recording_scan(root, kernel_ids, *args, **kwargs):
        if os.getpid() == parent:
            parent_calls.append(list(kernel_ids))
        return real_scan(root, kernel_ids, *args, **kwargs)

    def scan_then_die(kernel_ids):
        worker_chunks.append(kernel_ids)
        if len(worker_chunks) == 3:  # two chunks sent, the third claimed and lost
            os._exit(3)
        return real_chunk(kernel_ids)

    monkeypatch.setattr(index_module, "_scan", recording_scan)
    monkeypatch.setattr(index_module, "_scan_chunk", scan_then_die)
    for workers in (2, 3):
        parent_calls.clear()
        cache = ContentsCache()
        assert dumps(build_index(many, cache=cache, workers=workers)) == serial
        assert cache.misses == 41
        # each worker delivered its first two chunks: the parent scanned only the rest, once
        assert len(parent_calls) == 1 and len(parent_calls[0]) == 40 - workers * 2 * 3


# ---------------------------------------------------------------- the daemon's start-up rebuild


def test_startup_workers_is_one_while_another_thread_runs():
    import threading

    from kz_daemon.accept.indexer import startup_workers

    alone = startup_workers()
    assert alone >= 1
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert startup_workers() == 1
    finally:
        stop.set()
        other.join()
    assert startup_workers() == alone


def test_daemon_cold_start_rebuild_uses_startup_workers(tmp_path, monkeypatch):
    from kz_daemon.accept import indexer
    from kz_daemon.ops.runtime import init_state_dir
    from kz_daemon.ops.service import Zoo
    from tests.helpers.daemon import EXAMPLES

    config = init_state_dir(tmp_path / "kz", seed_from=EXAMPLES)
    calls = []
    real_build = indexer.build

    def recording_build(*args, **kwargs):
        calls.append(kwargs.get("workers", 1))
        return real_build(*args, **kwargs)

    monkeypatch.setattr(indexer, "build", recording_build)
    monkeypatch.setattr(indexer, "startup_workers", lambda: 2)
    monkeypatch.setattr(index_module, "PARALLEL_MIN_PACKAGES", 1)
    zoo = Zoo(config)
    zoo.start()
    try:
        assert calls == [2]  # the cold start's full rebuild, before the threads started
        doc = json.loads(config.paths.index.read_text())
        with zoo.git_lock:
            serial = real_build(zoo.git.root, doc["head"], doc["generated_at"])
        assert doc == serial
    finally:
        zoo.stop()


# ---------------------------------------------------------------- small helpers


def test_decode_utf8_sig_equals_the_codec():
    from kz_runner.contract.rules.pysource import decode_utf8_sig

    for data in (b"", b"\xef\xbb", b"\xef\xbb\xbf", b"\xef\xbb\xbfabc", b"ab\xffc", b"\xef\xbb\xbfab\xffc",
                 "é".encode() + b"\xef\xbb\xbf", b"\xef\xbb\xbf\xef\xbb\xbfx", b"\xc3"):
        def answer(decode, data=data):
            try:
                return "ok", decode(data)
            except UnicodeDecodeError as exc:
                return "error", exc.start, exc.end, exc.reason
        assert answer(decode_utf8_sig) == answer(lambda d: d.decode("utf-8-sig")), data


def test_benchmark_text_with_a_lone_surrogate_is_a_syntax_problem():
    source = ('KERNEL_ZOO_TEST_CASE_METAS = [{"test_case_id": "a\ud800"}]\n'
              'if __name__ == "__main__":\n    pass\n')
    metas, problems = pysource.check_benchmark_source(source, BENCHMARK_FILE)
    assert metas is None and [p.code for p in problems] == ["PYTHON_SYNTAX"]


@pytest.mark.parametrize("text,huge", [
    (b"value: 0.5\nother: 12345.678e+12\n", False),
    (b"value: 1.0e+400\n", True),
    (b"value: 1E0400\n", True),
    (b"v: " + b"9" * 97 + b".0\n", False),
    (b"v: " + b"9" * 98 + b".0\n", True),
    (b"v: " + b"1_0" * 40 + b".0\n", True),
    (b"v: 190:20:30.15\n", False),
])
def test_may_hold_huge_number(text, huge):
    from kz_runner.contract.schema_check import may_hold_huge_number

    assert may_hold_huge_number(text) is huge
    if not huge:  # what the safe loader makes of it is finite
        import math

        import yaml

        def floats(value):
            if isinstance(value, float):
                yield value
            elif isinstance(value, dict):
                for item in value.values():
                    yield from floats(item)
        assert all(math.isfinite(v) for v in floats(yaml.safe_load(text)))


@pytest.mark.parametrize("text", [
    "v: .inf\n", "v: -.Inf\n", "v: .NAN\n", "v: !!float inf\n", "v: !!float nan\n", "v: 1.0e+400\n",
    "v: [1, .inf]\n", "v: " + "9" * 320 + ".0\n",
])
def test_bench_result_nonfinite_values_are_still_named(tmp_path, text):
    from kz_runner.contract.validate import Analysis, _check_bench

    an = Analysis("cpu/x/y/z/w")
    doc = ('schema_version: "1.0.0"\nkernel_id: cpu/x/y/z/w\ncases: []\n' + text).encode()
    _check_bench(an, doc)
    assert any(p.code == "NONFINITE_VALUE" for p in an.problems), (text, an.problems)


# ---------------------------------------------------------------- lookups in a sorted document

IDS = ["cpu/A/x/fp32/a", "cpu/A/x/fp32/a-b", "cpu/A/x/fp32/a/src/n", "cpu/A/x/fp32/a0",
       "cpu/A/x/fp32/b", "cpu/B/x/fp32/a"]


def test_family_and_prefix_find_what_a_scan_finds():
    kernels = [{"kernel_id": k} for k in sorted(IDS)]
    for kid in IDS + ["cpu/A/x/fp32/c", "cpu", "zzz"]:
        scan = [e for e in kernels if e["kernel_id"] == kid or e["kernel_id"].startswith(kid + "/")]
        assert index_module.family(kernels, kid) == scan, kid
        assert index_module.family(sorted(IDS), kid, key=None) == [e["kernel_id"] for e in scan]
    for prefix in ("cpu/A/x/fp32/", "cpu/B/", "cpu/A/x/fp32/a", "nothing/"):
        assert index_module.with_prefix(kernels, prefix) == \
            [e for e in kernels if e["kernel_id"].startswith(prefix)]
    assert index_module.is_sorted(kernels) and not index_module.is_sorted(kernels[::-1])


def _doc(ids, tag):
    return {"head": tag, "kernels": [{"kernel_id": k, "tag": tag} for k in sorted(ids)]}


@pytest.mark.parametrize("changed", IDS)
def test_index_file_refresh_equals_a_fresh_encoding(tmp_path, changed):
    """An accept's refresh re-encodes its kernel and the packages nested in it, and no neighbour
    (``…/a-b`` sorts between ``…/a`` and ``…/a/src/n``); the file equals one written from scratch."""
    from kz_daemon.accept.indexer import IndexFile

    live = IndexFile(tmp_path / "live.json")
    live.reset(_doc(IDS, "old"))
    ids = [k for k in IDS if not k.startswith(changed + "/")] + [changed + "/src/new"]
    new = _doc(ids, "old")
    for entry in new["kernels"]:
        if entry["kernel_id"] == changed or entry["kernel_id"].startswith(changed + "/"):
            entry["tag"] = "new"
    live.refresh(new, [changed])
    live.write(new)
    fresh = IndexFile(tmp_path / "fresh.json")
    fresh.reset(new)
    fresh.write(new)
    assert (tmp_path / "live.json").read_bytes() == (tmp_path / "fresh.json").read_bytes()
    assert live.order == sorted(ids)


def test_index_file_reset_sorts_a_document_read_back_unsorted(tmp_path):
    from kz_daemon.accept.indexer import IndexFile

    doc = {"head": "h", "kernels": [{"kernel_id": k} for k in reversed(IDS)]}
    index_file = IndexFile(tmp_path / "index.json")
    index_file.reset(doc)
    assert [k["kernel_id"] for k in doc["kernels"]] == sorted(IDS) == index_file.order
    index_file.write(doc)
    assert [k["kernel_id"] for k in json.loads((tmp_path / "index.json").read_text())["kernels"]] == sorted(IDS)
