"""The line reader of ``yamlio.load_yaml`` answers exactly as PyYAML's safe C loader.

- differential property tests: block-style documents generated in and around the
  subset the line reader takes (YAML 1.1 near-misses for every scalar type, keys
  that are numbers or bools, literal blocks, flow collections, comments, odd
  indentation, then random single-character damage) load to the same values, of
  the same types all the way down, or fail with the same exception, from str and
  from bytes;
- every contract YAML of examples/ and tests/fixtures/, a freshly written bench
  package and what the scorecard writer and the dry run write are read by the line
  reader itself (``yamlio._load_lines``), without libyaml;
- a list of inputs just outside the subset is refused by the line reader and
  still gets the safe loader's answer through libyaml;
- the memo of lines never shares a container between two results.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kz_daemon import scorecard
from kz_runner.contract import yamlio
from kz_runner.contract.dryrun import seed_bench_result
from kz_runner.contract.yamlio import load_yaml
from tests.helpers.contract_fixtures import ROOT, write_package

# ---------------------------------------------------------------- comparing answers


def same(a, b) -> bool:
    """Equal values of equal types all the way down (1 == True == 1.0 do not count); NaN equals NaN."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, dict):
        return len(a) == len(b) and all(same(ka, kb) and same(va, vb)
                                        for (ka, va), (kb, vb) in zip(a.items(), b.items()))
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def answer(load, text):
    """``("ok", value)`` or ``("error", exception type, message)``."""
    try:
        return ("ok", load(text))
    except Exception as exc:  # noqa: BLE001 - the exception itself is what is compared
        return ("error", type(exc), str(exc))


def reference(text):
    return answer(lambda t: yaml.load(t, Loader=yaml.CSafeLoader), text)


def assert_loads_like_pyyaml(text: str) -> None:
    for given_text in (text, text.encode("utf-8", "surrogatepass")):
        ref, got = reference(given_text), answer(load_yaml, given_text)
        assert same(ref, got), (given_text, ref, got)


def line_reader(text):
    """The line reader's own answer: the value, or None where it leaves the text to libyaml."""
    try:
        return ("ok", yamlio._load_lines(text))
    except Exception:  # noqa: BLE001 - any exception sends load_yaml to libyaml
        return None


# ---------------------------------------------------------------- generated documents

#: plain scalar texts, YAML 1.1 near-misses first
WORDS = [
    "yes", "Yes", "YES", "no", "No", "on", "On", "off", "OFF", "y", "Y", "n", "N", "true", "True", "TRUE",
    "tRue", "false", "False", "~", "null", "Null", "NULL", "nULL", "0x1F", "0x_1", "+0x1F", "0o17", "0o8",
    "017", "0123", "08", "0b101", "0b2", "1_000", "1__0", "1:20", "-1:20", "1:20.5", "190:20:30", "1:60",
    ".inf", "-.Inf", "+.INF", ".nan", ".NaN", "-.nan", "1e3", "1.0e+3", "1.0e3", "1.5e-05", "1E+3", "0.5",
    "0.", "-.5", ".5", "._1", "1.2.3", "1_0.5", "+1", "-1", "0", "-0", "+0", "2026-08-02",
    "2026-08-02T00:00:00Z", "2026-08-02 00:00:00", "2026-08-02t00:00:00.5+02:00", "2026-8-2", "2026-13-45",
    "2026-02-30", "=", "<<", "<", "abc", "a b", "a  b", "x#y", "x #y", "a:b", "a:", "a: b", "http://x.y/z",
    "1.0.0", "fp32", "-x", "--", "---", "...", "..", "a,b", "a[0]", "a{b}", "[x]", "{x}", "é", "µs",
    "日本", "emoji😀", "a'b", 'a"b', "%x", "@x", "`x", "!x", "!!str x", "&a x", "*a", "|", "|-", "|+", ">",
    "> x", "?x", "? x", ":x", "-", "- x", "#x", "a\\b", "\xa0x", "x\xa0", "a\u2028b", "a\x85b",
]
#: the typed near misses that are plain scalars in block and flow context alike
TAME_WORDS = [w for w in WORDS if not set(w) & set(" :#'\"[]{},&*!|>?%@`\\\xa0\u2028\x85") and w[0] != "-"] + [
    "-1", "-.Inf", "-0", "-.5", "-1_0", "-x"]
WILD_WORD = st.one_of(st.sampled_from(WORDS),
                      st.text(alphabet=st.sampled_from(list("ab01.9-_: #'\"[]{},&*!|>?%@`\\é~+eEoxn\t")),
                              min_size=1, max_size=8))
TAME_WORD = st.one_of(st.sampled_from(TAME_WORDS), st.sampled_from(["a b", "x#y", "a:b", "1:20", "é µs", "it's"]),
                      st.text(alphabet=st.sampled_from(list("ab01.9_~+eEoxné")), min_size=1, max_size=6))
SPACE = st.sampled_from([" ", " ", " ", "  ", "   "])
COMMENT = st.sampled_from(["", "", "", " # note", "  #", " #: x"])


@st.composite
def scalar(draw, tame=False):
    """A scalar's source text: plain, double- or single-quoted, maybe with a comment after it."""
    word = draw(TAME_WORD if tame else WILD_WORD)
    form = draw(st.sampled_from(["plain", "plain", "plain", "double", "single"]))
    if form == "double":
        word = '"' + word + '"'
    elif form == "single":
        word = "'" + word + "'"
    return word + draw(COMMENT)


@st.composite
def key(draw, tame=False):
    word = draw(st.one_of(st.sampled_from(["name", "a", "b", "value", "metrics_best", "1", "2.5", "true",
                                           "no", "null", "~", ".nan", "2026-08-02", "0x1F", "1:20"]
                                          + ([] if tame else ["=", "<<", "a b", "-x", "..."])),
                          TAME_WORD if tame else WILD_WORD))
    form = draw(st.sampled_from(["plain"] * 5 + ["double", "single"]))
    return {"plain": word, "double": '"' + word + '"', "single": "'" + word + "'"}[form]


@st.composite
def flow(draw, depth=1, tame=False):
    """A one-line flow collection, spaced in the usual and in odd ways."""
    comma = draw(st.sampled_from([", ", ", ", ",", " , ", ",  "]))
    colon = draw(st.sampled_from([": ", ": ", ":  "] if tame else [": ", ": ", ":", " : ", ":  "]))
    words = scalar(tame).map(lambda s: s.split(" #")[0].replace(":", "").replace("#", "") if tame else s)
    seqs = st.lists(words, max_size=3).map(lambda items: "[" + ", ".join(items) + "]")
    inner = st.one_of(words, seqs if tame else flow(depth - 1)) if depth else words
    end = st.sampled_from(["", " "] if tame else ["", "", ",", " "])
    if draw(st.booleans()):
        items = draw(st.lists(words if tame else inner, max_size=4))
        text = "[" + comma.join(items) + draw(end) + "]"
    else:
        items = draw(st.lists(st.tuples(key(tame).map(lambda k: k.replace(":", "").replace("#", "")
                                                      if tame else k), inner), max_size=4))
        text = "{" + comma.join(k + colon + v for k, v in items) + draw(end) + "}"
    if not tame and draw(st.integers(0, 9)) == 0:
        text = draw(st.sampled_from(["", " ", "{", "[", "  "])) + text
    return text


LITERAL_LINES = ["text", "y[i] = a * x[i] + y[i].", "a: b", "# not a comment", "- x", "", "", " ", "   ",
                 "  indented", "x  ", "it's", '"q"', "|", "é µs"]


@st.composite
def value_lines(draw, head: str, indent: int, depth: int, in_map: bool, tame: bool) -> list[str]:
    """The lines of a node after ``head`` (a key and its ':', or an entry's '-')."""
    kinds = ["scalar", "scalar", "scalar", "flow", "literal", "empty"] + (["nested", "nested"] if depth else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "scalar":
        return [head + draw(SPACE) + draw(scalar(tame))]
    if kind == "flow":
        return [head + draw(SPACE) + draw(flow(tame=tame))]
    if kind == "empty":
        return [head + draw(st.sampled_from(["", " ", "  # c"]))]
    if kind == "literal":
        headers = ["|", "|", "|-"] if tame else ["|", "|", "|", "|-", "|+", ">", "|2", "| # c", ">-", "|  "]
        width = indent + draw(st.integers(1 if tame else 0, 3))
        lines = st.sampled_from([line for line in LITERAL_LINES if line or not tame])
        first = st.sampled_from([line for line in LITERAL_LINES if line.strip()]) if tame else lines
        body = [draw(first)] + draw(st.lists(lines, max_size=4))
        if tame:
            body += draw(st.sampled_from([[], [""], ["", ""]]))
        return [head + " " + draw(st.sampled_from(headers))] + [" " * width + line if line.strip() else line
                                                                 for line in body]
    if in_map and draw(st.integers(0, 2)) == 0:  # an indentless sequence
        return [head] + draw(block_seq(indent, depth - 1, tame))
    child = indent + draw(st.sampled_from([1, 2, 2, 2, 3, 4]))
    lines = draw(block_seq(child, depth - 1, tame) if draw(st.booleans()) else block_map(child, depth - 1, tame))
    return [head] + lines


@st.composite
def block_map(draw, indent: int, depth: int, tame: bool) -> list[str]:
    lines: list[str] = []
    for _ in range(draw(st.integers(1, 4))):
        head = " " * indent + draw(key(tame)) + ":"
        lines += draw(value_lines(head, indent, depth, True, tame))
        lines += draw(st.sampled_from([[], [], [], [""], ["# comment"], [" " * indent + "  # deeper"]]))
    return lines


@st.composite
def block_seq(draw, indent: int, depth: int, tame: bool) -> list[str]:
    lines: list[str] = []
    for _ in range(draw(st.integers(1, 3))):
        dash = " " * indent + "-"
        if depth and draw(st.integers(0, 2)) == 0:  # '- key: value' and more keys under it
            gap = draw(st.sampled_from([1, 1, 2, 3]))
            inner = draw(block_map(indent + 1 + gap, depth - 1, tame))
            lines += [dash + " " * gap + inner[0][indent + 1 + gap:]] + inner[1:]
        else:
            lines += draw(value_lines(dash, indent, depth, False, tame))
    return lines


DAMAGE = [" ", "  ", "\t", "\r", "\n", ":", ": ", "-", "- ", "#", " #", '"', "'", "|", ">", "&a ", "*a", "!!str ",
          "[", "]", "{", "}", ",", "?", "? ", "---\n", "...\n", "%YAML 1.1\n", "\ufeff", "\x85", "\u2028", "\x00",
          "\x7f", "\\", "é", "\ud800"]


@st.composite
def damaged(draw, text: str) -> str:
    """``text`` with one place damaged: the near misses of the subset's edges."""
    at = draw(st.integers(0, len(text)))
    return text[:at] + draw(st.sampled_from(DAMAGE)) + text[at + draw(st.integers(0, 2)):]


@st.composite
def document(draw, tame: bool = False) -> str:
    """A block-style document; ``tame`` ones keep to the subset's syntax (their scalars still vary)."""
    lines = draw(block_seq(0, 3, tame) if draw(st.integers(0, 4)) == 0 else block_map(0, 3, tame))
    if tame:
        return "\n".join(lines) + draw(st.sampled_from(["\n", "\n\n", "\n# end\n"]))
    text = "\n".join(lines) + draw(st.sampled_from(["\n", "\n", "\n", "", "\n\n", "\n# end\n"]))
    return draw(damaged(text)) if draw(st.integers(0, 2)) == 0 else text


SETTINGS = settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(document())
@example("a: 1\nb: yes\nc: 1:20\nd: 1e3\ne: 1.0e+3\nf: 2026-08-02\ng: 0o17\nh: .nan\n")
@example("1: a\ntrue: b\n1.0: c\nnull: d\n~: e\n")
@example("a: |\n  x\n\n  y\n\n\nb: 2\n")
@example("a: |\n  x\n     \n  y\n     \nb: |-\n   z\n\n")
@example("a:\n- x\n- k: v\n  l: w\nb: [1, '2', \"3\"]\n")
@example("tags: [a, b]\nio:\n  - {name: x, shape: [N, 1]}\n")
@example(".nan: 1\n.nan: 2\n")
def test_generated_documents_load_as_pyyaml_loads_them(text):
    assert_loads_like_pyyaml(text)


@SETTINGS
@given(document(tame=True))
def test_generated_documents_of_the_subset_load_as_pyyaml_loads_them(text):
    assert_loads_like_pyyaml(text)


@SETTINGS
@given(document(tame=True).flatmap(damaged))
def test_damaged_documents_of_the_subset_load_as_pyyaml_loads_them(text):
    assert_loads_like_pyyaml(text)


@settings(SETTINGS, max_examples=300)
@given(st.lists(st.tuples(key(), st.one_of(scalar(), flow())), min_size=1, max_size=6))
def test_flat_mappings_of_near_miss_scalars_load_as_pyyaml_loads_them(pairs):
    assert_loads_like_pyyaml("".join(f"{k}: {v}\n" for k, v in pairs))


def test_plain_flat_documents_all_take_the_line_reader():
    """Flat mappings of usual keys and values (typed, quoted, flow) never leave the subset."""
    taken = []

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(st.tuples(st.sampled_from(["a", "name", "1", "yes"]),
                              st.sampled_from(["x", "0.5", "'q'", '"2026-08-02"', "[a, b]", "{k: v}", "~"])),
                    min_size=1, max_size=5))
    def run(pairs):
        text = "".join(f"{k}: {v}\n" for k, v in pairs)
        taken.append(line_reader(text) is not None)
        assert_loads_like_pyyaml(text)

    run()
    assert all(taken)


# ---------------------------------------------------------------- contract files take the line reader


def contract_texts(tmp_path: Path) -> dict[str, str]:
    """Every contract YAML of the repository, a fresh bench package's and what our writers write."""
    texts = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8")
             for base in (ROOT / "examples", ROOT / "tests" / "fixtures") for p in sorted(base.rglob("*.yaml"))}
    assert len(texts) >= 30
    pkg = write_package(tmp_path / "repo")
    for name in ("desc.yaml", "bench_result.yaml"):
        texts[f"write_package {name}"] = (pkg / ".kernel_package" / name).read_text(encoding="utf-8")
    metas = [{"test_case_id": case, "primary_metric": "latency_ms",
              "metrics": [{"name": "latency_ms", "unit": "ms", "direction": "lower_better"},
                          {"name": "gbps", "unit": "GB/s", "direction": "higher_better"}]}
             for case in ("small", "large")]
    seed = scorecard.seed_scorecard("cpu/Elementwise/Axpy/fp32/numpy_ref", metas)
    run = {"cases": [{"test_case_id": "small", "correctness": "passed",
                      "metrics": [{"name": "latency_ms", "value": 1.5e-05}, {"name": "gbps", "value": 12.0},
                                  {"name": "extra", "value": 3}]},
                     {"test_case_id": "large", "correctness": "skipped", "metrics": []}]}
    card = scorecard.update_scorecard(seed, "cpu/Elementwise/Axpy/fp32/numpy_ref", metas, run, "alice",
                                      "2026-08-02T00:00:00Z")
    texts["scorecard seed"] = scorecard.dump(seed).decode("utf-8")
    texts["scorecard pending"] = scorecard.dump(card).decode("utf-8")
    texts["scorecard stamped"] = scorecard.dump(scorecard.stamp(card, "0123abc" * 5 + "01234")).decode("utf-8")
    texts["dry run seed"] = yaml.safe_dump(seed_bench_result("cpu/a/b/c/k", metas), sort_keys=False)
    return texts


def test_every_contract_file_takes_the_line_reader_with_the_reference_answer(tmp_path):
    for name, text in contract_texts(tmp_path).items():
        ref = reference(text)
        assert ref[0] == "ok", name
        for given_text in (text, text.encode("utf-8")):
            got = line_reader(given_text)
            assert got is not None, f"{name} is left to libyaml"
            assert same(ref, got), name


def test_load_yaml_reads_contract_files_without_libyaml(tmp_path, monkeypatch):
    texts = contract_texts(tmp_path)
    expected = {name: yaml.load(text, Loader=yaml.CSafeLoader) for name, text in texts.items()}

    def no_libyaml(text):
        raise AssertionError("libyaml asked")

    monkeypatch.setattr(yamlio, "_load_libyaml", no_libyaml)
    for name, text in texts.items():
        assert same(load_yaml(text), expected[name]), name
        assert same(load_yaml(text.encode("utf-8")), expected[name]), name


# ---------------------------------------------------------------- just outside the subset

OUTSIDE = [
    "",                                           # empty document: None
    "# only a comment\n",
    "a: 1",                                       # no final newline
    "a: 1\r\nb: 2\r\n",                           # CR
    "a:\t1\n",                                    # tab
    "\ufeffa: 1\n",                               # BOM
    "a: 1\x85b: 2\n",                             # NEL is a line break to libyaml
    "a: b\u2028c\n",                              # so is LS
    "a: \x00\n",                                  # control character
    "---\na: 1\n",                                # document marker
    "a: 1\n...\n",
    "%YAML 1.1\n---\na: 1\n",                     # directive
    "a: &x 1\nb: *x\n",                           # anchor, alias
    "a: !!str 1\n",                               # tag
    "a: !custom 1\n",
    "? a\n: 1\n",                                 # complex key
    "base: {x: 1}\nm:\n  <<: {y: 2}\n",           # merge key (a flow mapping is merged too)
    "=: 1\n",                                     # the value key
    "a: hello\n  world\n",                        # multi-line plain scalar
    "a: \"hello\n  world\"\n",                    # multi-line quoted scalar
    "a: 'it''s'\n",                               # escaped single quote
    'a: "tab\\there"\n',                          # escape sequence
    "a: [1,\n  2]\n",                             # flow collection over two lines
    "a: [[1], 2]\n",                              # nested flow sequences
    "a: {b: {c: 1}}\n",                           # nested flow mappings
    "a: [a: 1]\n",                                # a pair in a flow sequence
    "a: [1, ]\n",                                 # trailing comma
    "a: {x}\n",                                   # flow mapping entry without value
    "a: [http://x]\n",                            # ':' in a flow plain scalar
    "a: >\n  folded\n  text\n",                   # folded block
    "a: |+\n  keep\n\n",                          # keep chomping
    "a: |2\n   explicit\n",                       # explicit indentation
    "a: |\n\n  leading blank\n",                  # leading blank line in a literal block
    "a: |\n  last line without newline",
    "a: 1\na: 2\n" + "b: x: y\n",                 # ': ' inside a plain scalar
    "a: b:\n",                                    # plain scalar ending with ':'
    "a: - x\n",                                   # entry where a value is expected
    "- - x\n",                                    # nested compact sequence
    "a:\n  - x\n  b: 1\n",                        # mapping key after an indented sequence
    "a:\n  b: 1\n c: 2\n",                        # indentation between levels
    "  a: 1\n",                                   # document indented as a whole
    "plain scalar\n",                             # top level scalar
    "[a, b]\n",                                   # top level flow collection
    "a : 1\n",                                    # space before ':'
    "'a' : 1\n",
    "k" * 1100 + ": long key\n",                  # over libyaml's simple key length
    "a: ?x\n",                                    # '?' starts a plain scalar in block context
    "a: @x\n",                                    # reserved indicator
    "a: 1\n- x\n",                                # entry in a mapping
    "a: '\ud800'\n",                              # lone surrogate
    "a: {" + ", ".join(f"k{i}: {i}" for i in range(13)) + "}\n",  # over 12 entries in a flow mapping
]


@pytest.mark.parametrize("text", OUTSIDE, ids=range(len(OUTSIDE)))
def test_inputs_outside_the_subset_go_to_libyaml_with_the_reference_answer(text):
    assert line_reader(text) is None
    assert_loads_like_pyyaml(text)


INSIDE = [
    "a: 1\nb: yes\nc: 1:20\nd: 1e3\ne: 1.0e+3\nf: 2026-08-02\ng: 0o17\nh: .nan\ni: -.Inf\nj: ~\nk:\n",
    "1: a\ntrue: b\n1.0: c\nnull: d\n-1: e\n'<<': f\n\"=\": g\n",
    "a: |\n  x\n     \n\n  # y\nb: |-\n   z\n\n\n",      # blank lines, spaces past the indentation
    "a:\n- x\n- k: v\n  l:\n  - y\nb:\n    -   c\n",  # indentless, compact, wide sequences
    "- a  # comment\n-\n- b: # comment\n  c: d\n",
    "a: {" + ", ".join(f"k{i}: {i}" for i in range(12)) + "}\n",
    "io:\n  - {name: x, shape: [B, H], note: 'a, b', other: \"c: d\"}\n  - []\n  - {}\n",
    "name: é µs 日本 emoji😀\nsummary: a #1 thing is a comment\nurl: http://x.y/z#frag\n",
    "a: b\n# comment\n   # deeper comment\n\nc: d  # trailing\n",
]


@pytest.mark.parametrize("text", INSIDE, ids=range(len(INSIDE)))
def test_inputs_inside_the_subset_take_the_line_reader(text):
    ref = reference(text)
    assert ref[0] == "ok"
    assert same(line_reader(text), ref)
    assert same(line_reader(text.encode("utf-8")), ref)
    assert_loads_like_pyyaml(text)


def test_undecodable_bytes_go_to_libyaml():
    for data in (b"a: \xff\n", b"\xff\xfea\x00:\x00 \x001\x00\n\x00", b"\xef\xbb\xbfa: 1\n"):
        assert line_reader(data) is None
        assert same(reference(data), answer(load_yaml, data))


def test_only_exact_str_and_bytes_take_the_line_reader():
    class Text(str):
        pass

    for given_text in (bytearray(b"a: 1\n"), Text("a: 1\n"), memoryview(b"a: 1\n")):
        assert line_reader(given_text) is None
        assert same(reference(given_text), answer(load_yaml, given_text))


# ---------------------------------------------------------------- memo safety


def test_memoised_lines_never_share_containers_between_results():
    text = ("tags: [a, b]\nio:\n  - {name: x, shape: [N]}\nrec: {value: 0.5}\n"
            "d: |\n  text\nm:\n  k: v\n")
    first = load_yaml(text)
    first["tags"].append("c")
    first["io"][0]["shape"].append("M")
    first["io"][0]["name"] = "changed"
    first["rec"]["value"] = 1
    first["m"]["k"] = "changed"
    assert same(load_yaml(text), yaml.load(text, Loader=yaml.CSafeLoader))
