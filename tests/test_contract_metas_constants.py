"""METAS may name module-level literal constants; anything computed keeps the clear refusal."""
from __future__ import annotations

import pytest

from kz_runner.contract.rules.pysource import read_metas
from kz_runner.contract.validate import validate_package_dir
from tests.helpers.contract_fixtures import mark_repo, write_package

METRIC = '{"name": "ms", "unit": "ms", "direction": "lower_better"}'
CASE = ('{"test_case_id": "small", "params": {"n": _N}, "primary_metric": "ms", "metrics": _METRICS, '
        '"tolerance": {"correctness_atol": 0, "correctness_rtol": 0}}')
METAS = f"KERNEL_ZOO_TEST_CASE_METAS = [{CASE}]\n"


def source(before: str, after: str = "") -> str:
    return before + METAS + after + 'if __name__ == "__main__":\n    pass\n'


def test_constants_bound_once_above_are_resolved():
    metas, problems = read_metas(source(f"_N = 4096\n_M = {METRIC}\n_METRICS: list = [_M]\n"))
    assert problems == []
    assert metas[0]["metrics"] == [{"name": "ms", "unit": "ms", "direction": "lower_better"}]
    assert metas[0]["params"] == {"n": 4096}


def test_a_package_using_a_constant_validates(tmp_path):
    pkg = write_package(mark_repo(tmp_path / "repo"))
    bench = pkg / ".kernel_package" / "benchmark.py"
    text = bench.read_text()
    start = text.index('"metrics": [')
    end = text.index("]", start) + 1
    metrics = text[start + len('"metrics": '):end]
    bench.write_text(f"_METRICS = {metrics}\n" + text[:start] + '"metrics": _METRICS' + text[end:])
    report = validate_package_dir(pkg)
    assert report.valid, [p.render() for p in report.problems]


@pytest.mark.parametrize("before,after,says", [
    (f"def make():\n    return [{METRIC}]\n_N = 1\n_METRICS = make()\n", "", "`make()` is computed"),
    (f"_N = 1\n_METRICS = [{METRIC}]\n", "_METRICS = []\n", "`_METRICS` is bound 2 times"),
    (f"_N = 1\n_METRICS = [{METRIC}]\n_METRICS += []\n", "", "`_METRICS` is bound 2 times"),
    (f"_N = 1\nfor _METRICS in [[{METRIC}]]:\n    pass\n", "", "not bound by a plain module-level"),
    (f"_N = 1\nif True:\n    _METRICS = [{METRIC}]\n", "", "not bound by a plain module-level"),
    (f"_N = 1\n_METRICS = [{METRIC}]\ndef f():\n    global _METRICS\n    _METRICS = []\n", "",
     "`_METRICS` is bound 2 times"),
    ("_N = 1\n", f"_METRICS = [{METRIC}]\n", "`_METRICS` is bound after it is used"),
    ("_N = 1\n", "", "`_METRICS` is not bound at module level"),
    (f"import os\n_N = os.cpu_count\n_METRICS = [{METRIC}]\n", "", "`os.cpu_count` is computed"),
    (f"_N = 1\n_METRICS = [m for m in [{METRIC}]]\n", "", "is computed"),
    (f"from helpers import *\n_N = 1\n_METRICS = [{METRIC}]\n", "", "star import"),
])
def test_anything_else_is_refused_with_the_clear_error(before, after, says):
    metas, problems = read_metas(source(before, after))
    assert metas is None
    assert [p.code for p in problems] == ["METAS_NOT_LITERAL"]
    assert says in problems[0].message, problems[0].message


def test_a_chain_of_constants_cannot_blow_up():
    chain = "_C0 = [1, 1]\n" + "".join(f"_C{i} = [_C{i - 1}, _C{i - 1}]\n" for i in range(1, 40))
    metas, problems = read_metas(chain + "_N = 1\n_METRICS = [_C39]\n" + METAS)
    assert metas is None and [p.code for p in problems] == ["METAS_NOT_LITERAL"]
    assert "too large" in problems[0].message
