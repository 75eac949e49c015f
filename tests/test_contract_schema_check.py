"""The optional fast schema engine (jsonschema_rs) agrees with jsonschema on tricky values."""
from __future__ import annotations

import copy

import pytest

from kz_runner.contract.schema_check import _fast_validator, is_rfc3339, schema_problems, validator
from kz_runner.contract.yamlio import load_yaml
from tests.helpers.contract_fixtures import NEWCOMER

DESC = load_yaml((NEWCOMER / ".kernel_package" / "desc.yaml").read_bytes())
BENCH = load_yaml((NEWCOMER / ".kernel_package" / "bench_result.yaml").read_bytes())

REFS = ["src/a.py", "../x", "src/../../x", ".kernel_package/desc.yaml", "/etc/passwd", "a\\b", "c:/x",
        "src/a b.py", "./src/a.py", "src/..hidden", "\u00e9t\u00e9.py"]
KERNEL_IDS = ["a/b", "a/../b", "./a", "a/.", "a//b", "/a", "a/", "a b/c", "gfx928/Attention/MHA/fp16/x",
              "..a/b", "a/.b"]
TIMES = ["2026-08-02T00:00:00Z", "2026-08-02T00:00:00", "2026-08-02 00:00:00Z", "2026-02-30T00:00:00Z",
         "2026-08-02T00:00:00.123+05:30", "2026-08-02t00:00:00z", "2026-8-2T0:0:0Z", "x"]
SHAS = ["0000000", "abcdef1", "ABCDEF1", "000000", "0" * 40, "0" * 41, "__PENDING_COMMIT__"]


def variants():
    for ref in REFS:
        doc = copy.deepcopy(DESC)
        doc["reference_sources"] = [ref]
        yield "desc", doc
    for summary in ["x" * 300, "x" * 301, ""]:
        doc = copy.deepcopy(DESC)
        doc["summary"] = summary
        yield "desc", doc
    for kernel_id in KERNEL_IDS:
        doc = copy.deepcopy(BENCH)
        doc["kernel_id"] = kernel_id
        yield "bench_result", doc
    for when in TIMES:
        doc = copy.deepcopy(BENCH)
        doc["cases"][0]["metrics_best"]["tflops"]["recorded_at"] = when
        yield "bench_result", doc
    for sha in SHAS:
        doc = copy.deepcopy(BENCH)
        doc["cases"][0]["metrics_best"]["tflops"]["commit_sha"] = sha
        yield "bench_result", doc


@pytest.mark.parametrize("schema,doc", list(variants()))
def test_fast_engine_agrees_with_jsonschema(schema, doc):
    fast = _fast_validator(schema)
    if fast is None:
        pytest.skip("jsonschema_rs is not installed: only jsonschema is used")
    assert fast.is_valid(doc) == validator(schema).is_valid(doc)


def test_problems_do_not_depend_on_the_engine():
    doc = copy.deepcopy(BENCH)
    doc["cases"][0]["metrics_best"]["tflops"]["recorded_at"] = "2026-02-30T00:00:00Z"
    (found,) = schema_problems(doc, "bench_result", "BENCH_RESULT_SCHEMA", "bench_result.yaml")
    assert found.field == "cases[0].metrics_best.tflops.recorded_at"


def test_rfc3339():
    assert is_rfc3339("2026-08-02T00:00:00Z") and is_rfc3339("2026-08-02T00:00:00.5-01:00")
    assert not is_rfc3339("2026-08-02T00:00:00") and not is_rfc3339("2026-02-30T00:00:00Z")
    assert is_rfc3339(5)  # formats constrain strings only
