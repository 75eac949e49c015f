"""The index's fast paths give exactly the reference answers.

- ``yamlio.load_yaml`` (direct construction over libyaml's node tree) equals
  ``yaml.load(text, Loader=yaml.CSafeLoader)``, values and exceptions alike;
- ``pysource.check_benchmark_source`` (METAS read with ``json.loads``, the rest of
  the module parsed with the list blanked) equals the whole-module AST path;
- the index of every example package, the newcomer fixture and every failing
  package of tests/test_contract_validate.py's RULES is the same document with the
  fast paths as with the reference functions put in their place.
"""
from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import yaml

from kz_runner.contract import pysource, validate, yamlio
from kz_runner.contract.index import build_index, dumps
from kz_runner.contract.pysource import BENCHMARK_FILE, _fast_benchmark_check, _full_benchmark_check
from kz_runner.contract.yamlio import load_yaml
from tests.helpers.contract_fixtures import NEWCOMER_REPO, ROOT, copy_newcomer, mark_repo, write_package
from tests.test_contract_validate import RULES

# ---------------------------------------------------------------- YAML


def reference_yaml(text):
    """What PyYAML's safe C loader answers: ("ok", value) or ("error", type, message)."""
    try:
        return ("ok", yaml.load(text, Loader=yaml.CSafeLoader))
    except Exception as exc:  # noqa: BLE001 - the exception itself is what is compared
        return ("error", type(exc), str(exc))


def fast_yaml(text):
    try:
        return ("ok", load_yaml(text))
    except Exception as exc:  # noqa: BLE001
        return ("error", type(exc), str(exc))


def same(a, b) -> bool:
    """Equality that also treats NaN as equal to NaN (YAML .nan)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


YAML_DOCS = [
    "",
    "# only a comment\n",
    "a: 1\nb: [1, 2.5, -3, 0x1f, 0o17, 1_000, .inf, -.inf, .nan]\n",
    "a: yes\nb: No\nc: ~\nd: null\ne: 'quoted'\nf: \"2026-08-02T00:00:00Z\"\n",
    "when: 2026-08-02T00:00:00Z\nday: 2026-08-02\nsexagesimal: 1:30\n",
    "base: &b {x: 1, y: [1, 2]}\nuse: *b\nother: *b\n",          # aliases share one object
    "base: &b {x: 1}\nmerged:\n  <<: *b\n  y: 2\n",                 # merge key
    "= : value\n",                                                   # the value key
    "? [1, 2]\n: unhashable key\n",
    "? {a: 1}\n: unhashable key\n",
    "dup: 1\ndup: 2\n",
    "set: !!set {a, b}\n",
    "omap: !!omap [a: 1, b: 2]\n",
    "pairs: !!pairs [a: 1, a: 2]\n",
    "bin: !!binary aGVsbG8=\n",
    "tagged: !!str 123\nint: !!int '7'\nfloat: !!float '1'\n",
    "bad: !!int x\n",
    "unknown: !custom 1\n",
    "python: !!python/object:os.system [ls]\n",
    "a: [unclosed\n",
    "a: 1\n---\nb: 2\n",
    "- " * 200 + "x\n",                                             # deep nesting
    "time: 2026-13-45T99:99:99Z\n",
    "1: int key\n2.5: float key\nnull: null key\ntrue: bool key\n",
    "[a, {b: c}, [d]]\n",
    "plain scalar\n",
    "multi: |\n  line one\n  line two\nfolded: >\n  a\n  b\n",
]


@pytest.mark.parametrize("text", YAML_DOCS, ids=range(len(YAML_DOCS)))
def test_load_yaml_equals_the_safe_c_loader(text):
    ref, got = reference_yaml(text), fast_yaml(text)
    assert same(ref, got), (ref, got)
    assert same(reference_yaml(text.encode()), fast_yaml(text.encode()))


def test_load_yaml_keeps_alias_identity():
    doc = load_yaml("base: &b {x: 1}\nuse: *b\n")
    assert doc["base"] is doc["use"]
    loop = load_yaml("r: &r [*r]\n")
    assert loop["r"][0] is loop["r"]


def contract_yaml_files():
    paths = sorted(p for base in (ROOT / "examples", NEWCOMER_REPO) for p in base.rglob("*.yaml"))
    assert len(paths) >= 6
    return paths


def test_load_yaml_equals_the_safe_c_loader_on_every_contract_file():
    for path in contract_yaml_files():
        text = path.read_text()
        assert same(reference_yaml(text), fast_yaml(text)), path


# ---------------------------------------------------------------- METAS


def benchmark_sources():
    paths = sorted(p for base in (ROOT / "examples", NEWCOMER_REPO)
                   for p in base.rglob("benchmark.py") if p.parent.name == ".kernel_package")
    assert len(paths) >= 4
    return paths


def test_every_example_benchmark_takes_the_fast_path_with_the_reference_answer():
    for path in benchmark_sources():
        data = path.read_bytes()
        fast = _fast_benchmark_check(data, BENCHMARK_FILE)
        assert fast is not None, path
        assert fast == _full_benchmark_check(data, BENCHMARK_FILE), path


BASE = (ROOT / "examples" / "cpu" / "Elementwise" / "Axpy" / "fp32" / "numpy_ref" / ".kernel_package"
        / "benchmark.py").read_text()
NAME = pysource.METAS_NAME
START = f"{NAME} = ["


def variant(old: str, new: str) -> str:
    assert old in BASE, old
    return BASE.replace(old, new, 1)


# (id, source, must the fast path answer?)
METAS_VARIANTS = [
    ("as is", BASE, True),
    ("comment inside", variant('"n4k",', '"n4k",  # the small case, [not a list]'), True),
    ("hash in a string", variant('"n4k"', '"n4k#1"'), True),
    ("trailing commas", variant('"fp32"}', '"fp32",}'), True),
    ("True False None", variant('"dtype": "fp32"', '"dtype": None, "a": True, "b": False'), True),
    ("non-ASCII before the list", variant(START, f"{NAME} = [  # café\n"), True),
    ("non-ASCII in a string", variant('"n4k"', '"n4k-é"'), True),
    ("read later", BASE + f"\nprint(len({NAME}))\n", True),
    ("JSON words", variant('"fp32"}', '"fp32", "x": true}'), False),
    ("NaN word", variant("1e-6", "NaN"), False),
    ("Infinity word", variant("1e-6", "Infinity"), False),
    ("single quotes", variant('"n4k"', "'n4k'"), False),
    ("backslash escape", variant('"n4k"', '"n\\x34k"'), False),
    ("unicode escape", variant('"n4k"', '"n\\u0034k"'), False),
    ("implicit concatenation", variant('"n4k"', '"n4" "k"'), False),
    ("two numbers", variant("4096", "40 96"), False),
    ("empty item", variant(START, f"{NAME} = [,"), False),
    ("double comma", variant('"fp32"}', '"fp32",,}'), False),
    ("underscore number", variant("4096", "4_096"), False),
    ("hex number", variant("4096", "0x1000"), False),
    ("leading dot", variant("1e-6", ".5"), False),
    ("trailing dot", variant("1e-6", "1."), False),
    ("leading zero", variant("4096", "04096"), False),
    ("plus sign", variant("4096", "+4096"), False),
    ("negative zero", variant("4096", "-0"), True),
    ("huge float", variant("1e-6", "1e400"), True),
    ("duplicate key", variant('"dtype": "fp32"', '"dtype": "fp32", "dtype": "fp16"'), True),
    ("tuple inside", variant('{"n": 4096, "dtype": "fp32"}', '("a", 1)'), False),
    ("set inside", variant('{"n": 4096, "dtype": "fp32"}', '{1, 2}'), False),
    ("int key", variant('{"n": 4096, "dtype": "fp32"}', '{1: 2}'), False),
    ("computed", variant('"n": 4096', '"n": 4096 * 2'), False),
    ("call", variant('"n": 4096', '"n": int(4096)'), False),
    ("subscripted", variant("\n]\n", "\n][:1]\n"), False),
    ("added to", variant("\n]\n", "\n] + []\n"), False),
    ("chained assignment", variant(START, f"OTHER = {START}"), False),
    ("also chained", variant(START, f"{NAME} = OTHER = ["), False),
    ("annotated", variant(START, f"{NAME}: list = ["), False),
    ("bound twice", BASE + f"\n{NAME} = []\n", False),
    ("augmented later", BASE + f"\n{NAME} += []\n", False),
    ("also in a function", BASE + f"\ndef f():\n    {NAME} = []\n", True),
    ("in a docstring first", f'"""\n{NAME} = [1]\n"""\n' + BASE, False),
    ("only in a docstring", variant(START, f'"""\n{START}"""\nMETAS = ['), False),
    ("keyword argument", f"f(\n{NAME} = [1]\n)\n" + BASE.replace(NAME, "OTHER"), False),
    ("in a block", variant(START, f"if True:\n  {START}"), False),
    ("syntax error elsewhere", BASE + "\ndef broken(:\n", False),
    ("syntax error inside", variant('"n4k",', '"n4k" :: ,'), False),
    ("unclosed", BASE[: BASE.index(START) + len(START) + 20], False),
    ("deep nesting", variant('"fp32"}', '"fp32", "d": ' + "[" * 60 + "]" * 60 + "}"), False),
    ("crlf", BASE.replace("\n", "\r\n"), False),
    ("no main guard", BASE.replace('if __name__ == "__main__":', "if True:"), True),
    ("empty list", BASE[: BASE.index(START)] + f"{NAME} = []\n" + BASE[BASE.index("\n]\n") + 3:], True),
    ("one line", BASE[: BASE.index(START)] + f'{NAME} = [{{"test_case_id": "x"}}]  # c\n'
     + BASE[BASE.index("\n]\n") + 3:], True),
    ("not a literal list", variant(START, f"{NAME} = list(["), False),
    ("bad item schema", variant('"lower_better"', '"lower"'), True),
    ("hash in a comment after a closer", variant('"n4k",', '"n4k"]  # ]\n,'), False),
    ("comment with a quote", variant('"n4k",', '"n4k",  # say "hi", ]\n'), True),
    ("comma after a comment", variant('"n4k",', '"n4k"  # c\n  ,'), True),
    ("comma before a closer after space", variant('"fp32"}', '"fp32" ,  }'), True),
    ("comma after an opener", variant('{"n": 4096', '{, "n": 4096'), False),
    ("comma after a colon", variant('"n": 4096', '"n": , 4096'), False),
    ("words in strings", variant('"n4k"', '"True, None, False,]"'), True),
    ("exponent of 3 digits", variant("1e-6", "1e-300"), True),
    ("long digits", variant("4096", "4" * 320 + ".0"), True),
    ("lowercase word", variant("1e-6", "true"), False),
    ("null word", variant("1e-6", "null"), False),
    ("nested 50 deep", variant('"fp32"}', '"fp32", "d": ' + "[" * 47 + "]" * 47 + "}"), True),
    ("nested 51 deep", variant('"fp32"}', '"fp32", "d": ' + "[" * 48 + "]" * 48 + "}"), False),
    ("many shallow brackets", variant('"fp32"}', '"fp32", "d": [' + "[], " * 80 + "]}"), True),
    ("list follows the list", variant("\n]\n", "\n]\n[1, [2]]\n"), True),
    ("tab in a string", variant('"n4k"', '"n4\tk"'), False),
]


@pytest.mark.parametrize("name,source,fast", METAS_VARIANTS, ids=[v[0] for v in METAS_VARIANTS])
def test_metas_fast_path_agrees_with_the_ast(name, source, fast):
    for data in (source, source.encode(), b"\xef\xbb\xbf" + source.encode()):
        answer = _fast_benchmark_check(data, BENCHMARK_FILE)
        assert (answer is not None) == fast, answer
        reference = _full_benchmark_check(data, BENCHMARK_FILE)
        if answer is not None:
            assert answer == reference
        assert pysource.check_benchmark_source(data, BENCHMARK_FILE) == reference


# ---------------------------------------------------------------- the whole index


def reference_paths(monkeypatch) -> None:
    """Put the reference functions where the fast paths are used."""
    monkeypatch.setattr(pysource, "_fast_benchmark_check", lambda source, file: None)
    monkeypatch.setattr(validate, "load_yaml", lambda text: yaml.load(text, Loader=yaml.CSafeLoader))
    monkeypatch.setattr(yamlio, "load_yaml", lambda text: yaml.load(text, Loader=yaml.CSafeLoader))


def both_indexes(repo: Path, monkeypatch) -> tuple[str, str]:
    """The index text of ``repo`` with the fast paths, and with the reference functions."""
    fast = dumps(build_index(repo))
    with monkeypatch.context() as patch:
        reference_paths(patch)
        reference = dumps(build_index(repo))
    return fast, reference


def test_index_of_the_examples_and_the_newcomer_is_the_same_with_the_reference_paths(tmp_path, monkeypatch):
    repo = mark_repo(tmp_path / "repo")
    for arch in ("cpu", "gfx928", "sm_90"):
        shutil.copytree(ROOT / "examples" / arch, repo / arch, dirs_exist_ok=True, symlinks=True)
    newcomer = mark_repo(tmp_path / "newcomer")
    copy_newcomer(newcomer)
    for root in (repo, newcomer):
        fast, reference = both_indexes(root, monkeypatch)
        assert fast == reference
        assert '"kernels":' in fast and '"valid":true' in fast


@pytest.mark.parametrize("rule,mutate,code,still_valid", RULES, ids=[r[0] for r in RULES])
def test_index_of_every_failing_fixture_is_the_same_with_the_reference_paths(tmp_path, monkeypatch, rule,
                                                                           mutate, code, still_valid):
    repo = mark_repo(tmp_path / "repo")
    mutate(write_package(repo))
    write_package(repo, "cpu/Elementwise/Axpy/fp32/other")  # a valid neighbour
    fast, reference = both_indexes(repo, monkeypatch)
    assert fast == reference
    if code not in ("KERNEL_ID_INVALID", "KERNEL_PACKAGE_MISSING"):  # those are not packages to the index
        assert f'"code":"{code}"' in fast


def test_fast_paths_are_taken_on_the_bench_package(tmp_path):
    pkg = write_package(mark_repo(tmp_path / "repo"))
    data = (pkg / ".kernel_package" / "benchmark.py").read_bytes()
    assert _fast_benchmark_check(data, BENCHMARK_FILE) is not None
    text = (pkg / ".kernel_package" / "bench_result.yaml").read_text()
    loader = yamlio._Loader(text)
    try:
        node = loader.get_single_node()
        assert yamlio._construct_plain(loader, node) == yaml.load(text, Loader=yaml.CSafeLoader)
    finally:
        loader.dispose()


# ---------------------------------------------------------------- non-finite numbers


def walk_nonfinite(value, path=""):
    """The paths of NaN/infinite floats by plain recursion (what nonfinite_paths must name)."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [path or "$"]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in walk_nonfinite(v, f"{path}.{k}" if path else str(k))]
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in walk_nonfinite(v, f"{path}[{i}]")]
    return []


@pytest.mark.parametrize("value", [
    {"a": [1.0, {"b": 2}], "c": "x"},
    {"a": [1.0, {"b": float("nan")}], "c": float("inf")},
    {"when": __import__("datetime").date(2026, 8, 2), "v": float("-inf")},   # not JSON: the walk decides
    {float("nan"): 1.0},                                                       # a NaN key is not a value
    [(1.0, float("nan"))],
    {"deep": [[[[float("inf")]]]]},
    float("nan"),
    [],
])
def test_nonfinite_paths_names_every_nan_and_infinity(value):
    from kz_runner.contract.schema_check import nonfinite_paths

    assert list(nonfinite_paths(value)) == walk_nonfinite(value)
