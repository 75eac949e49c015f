"""The server-side hard checks (kz_runner.contract.checks): one test per rule, plus output parsing."""
from __future__ import annotations

import copy
import json

import pytest

from kz_runner.contract import checks

KID = "cpu/Elementwise/Axpy/fp32/numpy_ref"
IDS = ["a", "b"]


def good() -> dict:
    case = {"test_case_id": "a", "correctness": "passed", "accept": True,
            "metrics": [{"name": "latency_us", "value": 1.5}], "error": None,
            "correctness_detail": {"max_abs_err": 0.0}}
    return {"schema_version": "1.0.0", "kernel_id": KID, "ran_at": "2026-11-30T00:00:00Z", "runner_id": "local",
            "arch": "cpu", "overall": {"accept": True, "accept_reason": "ok", "build_ok": True},
            "cases": [case, dict(case, test_case_id="b")]}


def verdict(doc):
    return checks.check_result(doc, kernel_id=KID, case_ids=IDS)


def test_a_good_result_is_accepted():
    v = verdict(good())
    assert v.accepted and v.problems == () and v.http_status == 200 and v.reason == "ok"


def test_package_reject_is_not_a_problem():
    doc = good()
    doc["overall"].update(accept=False, accept_reason="latency regressed 9%")
    doc["cases"][0]["accept"] = False
    v = verdict(doc)
    assert not v.accepted and v.problems == () and v.package_accept is False
    assert "latency regressed 9%" in v.reason


def test_schema_violation():
    doc = good()
    del doc["overall"]["build_ok"]
    doc["surprise"] = 1
    v = verdict(doc)
    assert not v.accepted and set(v.codes) == {"RESULT_SCHEMA"}
    assert any("surprise" in p.message for p in v.problems)


def test_ran_at_must_be_rfc3339():
    doc = good()
    doc["ran_at"] = "yesterday"
    assert "RESULT_SCHEMA" in verdict(doc).codes


def test_kernel_id_must_match():
    doc = good()
    doc["kernel_id"] = "cpu/Elementwise/Axpy/fp32/other"
    v = verdict(doc)
    assert v.codes == ("RESULT_KERNEL_ID",) and not v.accepted


@pytest.mark.parametrize("ids, words", [
    (["a"], "missing ['b']"),
    (["a", "b", "c"], "not in METAS ['c']"),
    (["a", "b", "b"], "more than once ['b']"),
])
def test_case_set_must_equal_metas(ids, words):
    doc = good()
    doc["cases"] = [dict(doc["cases"][0], test_case_id=i) for i in ids]
    v = verdict(doc)
    assert v.codes == ("RESULT_CASES",) and words in v.problems[0].message


def test_accept_requires_every_case_passed():
    doc = good()
    doc["cases"][1].update(correctness="skipped", accept=False)
    v = verdict(doc)
    assert v.codes == ("ACCEPT_NOT_ALL_PASSED",) and "b=skipped" in v.problems[0].message


def test_build_not_ok_is_a_reject_with_its_reason():
    doc = good()
    doc["overall"] = {"accept": False, "accept_reason": "build_test_env.py exited 1", "build_ok": False}
    v = verdict(doc)
    assert v.codes == ("BUILD_FAILED",) and not v.accepted
    assert "build_test_env.py exited 1" in v.reason


def test_failed_case_with_accept_true_is_422():
    doc = good()
    doc["overall"]["accept"] = False
    doc["cases"][0]["correctness"] = "failed"
    v = verdict(doc)
    assert v.codes == ("RESULT_INVALID",) and v.invalid and v.http_status == 422
    assert v.problems[0].field == "cases[0].accept"


def test_nan_anywhere_is_refused_even_in_a_parsed_dict():
    doc = good()
    doc["cases"][0]["correctness_detail"]["max_rel_err"] = float("nan")
    doc["cases"][1]["metrics"][0]["value"] = float("inf")
    v = verdict(doc)
    assert "RESULT_NONFINITE" in v.codes and not v.accepted
    message = next(p.message for p in v.problems if p.code == "RESULT_NONFINITE")
    assert "cases[0].correctness_detail.max_rel_err" in message and "cases[1].metrics[0].value" in message


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_nonfinite_literals_in_stdout_are_refused(literal):
    text = json.dumps(good()).replace('"value": 1.5', f'"value": {literal}', 1)
    v = checks.check_output(text.encode(), kernel_id=KID, case_ids=IDS)
    assert "RESULT_NONFINITE" in v.codes and not v.accepted


def test_several_rules_at_once_are_all_reported():
    doc = good()
    doc["kernel_id"] = "cpu/Other/Op/fp32/other"  # well formed, not this kernel
    doc["cases"][0]["correctness"] = "failed"
    assert set(verdict(doc).codes) == {"RESULT_KERNEL_ID", "ACCEPT_NOT_ALL_PASSED", "RESULT_INVALID"}


@pytest.mark.parametrize("thing", [None, [], "text", 3, {"cases": "nope"}, {"overall": [], "cases": [1, None]}])
def test_never_raises_for_garbage(thing):
    v = verdict(copy.deepcopy(thing))
    assert not v.accepted and v.problems


def test_parse_accepts_one_document_with_whitespace():
    doc, problems = checks.parse_output(b"\n  " + json.dumps(good()).encode() + b"\n\n")
    assert problems == () and doc["kernel_id"] == KID


@pytest.mark.parametrize("data, words", [
    (b"", "empty"),
    (b"  \n", "only whitespace"),
    (b"loading model...\n{}", 'first line: "loading model..."'),
    (b'{"a": 1}\n{"b": 2}\n', "a second JSON document"),
    (b'{"a": 1}\ndone in 3 s\n', 'extra text after the first JSON document, at line 2: "done in 3 s"'),
    (b"\xff\xfe{}", "not UTF-8"),
])
def test_parse_names_what_it_found(data, words):
    doc, problems = checks.parse_output(data)
    assert doc is None and len(problems) == 1
    assert problems[0].code == "BAD_OUTPUT" and words in problems[0].message
    v = checks.check_output(data, kernel_id=KID, case_ids=IDS)
    assert v.codes == ("BAD_OUTPUT",) and not v.accepted


def test_every_code_has_a_hint_and_a_row_in_the_module_table():
    for code in checks.CODES:
        assert checks.HINTS[code]
        assert code in checks.__doc__
