"""The index's speed paths give exactly the answers of the paths they replace.

- ``pysource._json_like_list`` (one pass of regular expressions and ``raw_decode``)
  equals the token-by-token reader ``_json_like_list_tokens`` on generated inputs:
  the same list and end offset, or a refusal from both;
- the full benchmark check built on it equals the whole-module AST path;
- a parallel build (forked workers claiming chunks, this process decoding what they
  send) gives the serial document, also when a worker dies; the daemon's cold start
  forks only while no other thread runs.
"""
from __future__ import annotations

import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kz_runner.contract import index as index_module
from kz_runner.contract import pysource
from kz_runner.contract.index import build_index, dumps
from kz_runner.contract.index_cache import ContentsCache
from kz_runner.contract.pysource import (
    BENCHMARK_FILE,
    _fast_benchmark_check,
    _full_benchmark_check,
    _json_like_list,
    _json_like_list_tokens,
    _NotJsonLike,
)
from tests.helpers.contract_fixtures import mark_repo, write_package

# ---------------------------------------------------------------- METAS list reader


def reader_answer(read, text: str, start: int = 0):
    try:
        value, end = read(text, start)
    except _NotJsonLike:
        return "refused"
    return value, end


def assert_same_reading(text: str, start: int = 0) -> None:
    fast = reader_answer(_json_like_list, text, start)
    slow = reader_answer(_json_like_list_tokens, text, start)
    assert fast == slow, (text, fast, slow)
    if fast != "refused":  # same types too (1 vs 1.0 vs True compare equal)
        assert repr(fast) == repr(slow)


#: pieces a METAS-like text is made of, hostile ones included
TOKENS = ["[", "]", "{", "}", ",", ":", " ", "\n", "\t", '"a"', '""', '"a,]"', '"#x"', '"True"', '"é"',
          "'q'", "1", "-1", "0", "-0", "1e5", "1E-5", "2.5", "1.", ".5", "-", "+1", "e", "04", "1_0", "0x1",
          "True", "False", "None", "true", "null", "NaN", "Infinity", "-Infinity", "Truex",
          "# c\n", '# "q\n', "#]\n", "\\", '"\\n"', "x", "(", ")", "\v", "é", "1e400", "*", "\r"]

VALID_EXAMPLES = [
    "[]", "[1]", "[1,]", "[1 ,]", "[1 , ]", "[ 1, 2, ]", '[{"a": 1,},]', '[{"a": [True, False, None,],},]',
    '[{"a": 1}  # c\n,]', '[{"a": 1},  # c\n]', '[# "\n1]', '["#", "]", "a,]", "True"]', "[[[]]]",
    '[1, # ,]\n]', "[-0, 1e400, 1E5, 2.5]",
]
INVALID_EXAMPLES = [
    "[", "[,]", "[1,,]", "[,1]", '[{"a":,}]', '[{"a" 1}]', "[1 2]", '["a" "b"]', "[true]", "[NaN]",
    "[1.]", "[.5]", "[+1]", "[04]", "[1_0]", "[0x1]", "['a']", '["\\n"]', "[Truex]", "[True1]",
    "[1 # c", "[(1)]", "[1\v]", '[{1: 2}]', "[{}{}]", "[[][]]", "[e]", "[1e]", "[-]", '["a\tb"]',
]


@pytest.mark.parametrize("text", VALID_EXAMPLES + INVALID_EXAMPLES)
def test_list_reader_examples(text):
    assert_same_reading(text)
    assert_same_reading(text + "\n\nx = 1\n")
    assert_same_reading("X = " + text + "\n[1, 2]\n", 4)
    if text in VALID_EXAMPLES:
        assert reader_answer(_json_like_list, text) != "refused", text


def test_list_reader_nesting_limit():
    for depth in (49, 50, 51, 52, 80):
        text = "[" * depth + "]" * depth
        assert_same_reading(text)
        assert (reader_answer(_json_like_list, text) == "refused") == (depth > pysource._MAX_DEPTH)
        text = "[" + '{"k": ' * (depth - 1) + "1" + "}" * (depth - 1) + "]"
        assert_same_reading(text)
        assert_same_reading("[" + ", ".join(["[[[]]]"] * depth) + "]")  # many brackets, shallow


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(TOKENS), max_size=40))
@example(["1", ",", " ", "]"])
@example(['"a,]"', ","])
def test_list_reader_agrees_on_token_soup(tokens):
    assert_same_reading("[" + "".join(tokens))


def literal(depth: int = 0):
    """A Python literal of the JSON-like subset, with optional comments and trailing commas."""
    blank = st.sampled_from(["", " ", "\n  ", "  # note\n", '  # "quoted" ]\n', "\t"])
    scalar = st.one_of(
        st.integers(-10**6, 10**6).map(str),
        st.floats(allow_nan=False, allow_infinity=False).map(repr).filter(lambda s: "inf" not in s),
        st.sampled_from(["True", "False", "None", "1e-6", "-0", "1E3"]),
        st.text(st.characters(blacklist_characters='"\\\n\r\0\f', blacklist_categories=("Cs",)),
                max_size=6).map(lambda s: f'"{s}"'))
    if depth >= 3:
        return scalar
    inner = st.deferred(lambda: literal(depth + 1))
    items = st.lists(st.tuples(blank, inner, blank), max_size=4)
    trailing = st.sampled_from(["", ",", ", ", ",\n"])

    def make_list(parts, tail):
        body = ",".join(f"{a}{v}{b}" for a, v, b in parts)
        return "[" + body + (tail if parts else "") + "]"

    keys = st.text(st.characters(whitelist_categories=("Ll", "Nd"), whitelist_characters="_#,]"), max_size=5)
    pairs = st.lists(st.tuples(blank, keys, inner), max_size=4)

    def make_dict(parts, tail):
        body = ",".join(f'{a}"{k}": {v}' for a, k, v in parts)
        return "{" + body + (tail if parts else "") + "}"

    return st.one_of(scalar, st.builds(make_list, items, trailing), st.builds(make_dict, pairs, trailing))


@settings(max_examples=400, deadline=None)
@given(literal(), st.data())
def test_list_reader_agrees_on_literals_and_their_mutations(value, data):
    text = f"[{value}]"
    assert_same_reading(text)
    assert reader_answer(_json_like_list, text) != "refused" or "-0" in text or "e" in text.lower() \
        or '"' in text  # a valid literal is read (bar JSON-only number rules and control characters)
    # one edit after the opening bracket: drop, double or replace a character
    if len(text) > 1:
        at = data.draw(st.integers(1, len(text) - 1))
        edit = data.draw(st.sampled_from(["drop", "double", "replace"]))
        piece = data.draw(st.sampled_from(TOKENS))
        mutated = {"drop": text[:at] + text[at + 1:], "double": text[:at] + text[at] + text[at:],
                   "replace": text[:at] + piece + text[at + 1:]}[edit]
        assert_same_reading(mutated)
        assert_same_reading(mutated + "\n]\n[1, 2]")


# ---------------------------------------------------------------- the benchmark check


@settings(max_examples=150, deadline=None)
@given(literal(), st.sampled_from(["", "\nprint(KERNEL_ZOO_TEST_CASE_METAS)\n", "\n[1, 2]\n"]))
def test_benchmark_check_with_generated_metas_equals_the_ast_path(value, after):
    source = f"import sys\n\nKERNEL_ZOO_TEST_CASE_METAS = [{value}]\n{after}\nif __name__ == \"__main__\":\n    pass\n"
    fast = _fast_benchmark_check(source, BENCHMARK_FILE)
    reference = _full_benchmark_check(source, BENCHMARK_FILE)
    if fast is not None:
        assert fast == reference
    assert pysource.check_benchmark_source(source, BENCHMARK_FILE) == reference


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

    from kz_daemon.indexer import startup_workers

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
    from kz_daemon import indexer
    from kz_daemon.runtime import init_state_dir
    from kz_daemon.service import Zoo
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
    from kz_runner.contract.pysource import decode_utf8_sig

    for data in (b"", b"\xef\xbb", b"\xef\xbb\xbf", b"\xef\xbb\xbfabc", b"ab\xffc", b"\xef\xbb\xbfab\xffc",
                 "é".encode() + b"\xef\xbb\xbf", b"\xef\xbb\xbf\xef\xbb\xbfx", b"\xc3"):
        def answer(decode, data=data):
            try:
                return "ok", decode(data)
            except UnicodeDecodeError as exc:
                return "error", exc.start, exc.end, exc.reason
        assert answer(decode_utf8_sig) == answer(lambda d: d.decode("utf-8-sig")), data


def test_benchmark_text_with_a_lone_surrogate_goes_to_the_reference_path():
    source = ('KERNEL_ZOO_TEST_CASE_METAS = [{"test_case_id": "a\ud800"}]\n'
              'if __name__ == "__main__":\n    pass\n')
    assert _fast_benchmark_check(source, BENCHMARK_FILE) is None
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
