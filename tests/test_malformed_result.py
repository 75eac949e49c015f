"""A result document whose shape is wrong ("cases": null, a case id that is a list) is a rejection.

The document is printed by the package's benchmark (a new kernel's own, so the submitter's) and
relayed by the runner: the daemon must decide on it, not fail on every retry of the report.
"""
from __future__ import annotations

import pytest

from kz_daemon.accept.saga import case_summary
from kz_daemon.ops.runtime import init_state_dir
from kz_daemon.ops.service import Zoo
from tests.helpers.daemon import AXPY_ID, EXAMPLES, axpy_result, drop_queued_axpy


@pytest.fixture
def zoo(tmp_path):
    z = Zoo(init_state_dir(tmp_path / "kz", seed_from=EXAMPLES))
    z.start()
    yield z
    z.stop()


@pytest.mark.parametrize("cases", [None, 7, "n4k", {"test_case_id": "n4k"}])
def test_case_summary_of_cases_that_are_not_a_list_is_empty(cases):
    assert case_summary({"cases": cases}, []) == []


@pytest.mark.parametrize("mangle", ["null cases", "list id", "dict id", "null metrics", "list overall",
                                    "list metric name"])
def test_a_malformed_result_is_rejected_and_the_report_answers(zoo, mangle):
    uuid = drop_queued_axpy(zoo, AXPY_ID, "mangled")
    claim = zoo.claim("r", "cpu", 5)
    result = axpy_result(AXPY_ID, 1.0)
    first = result["cases"][0]
    if mangle == "null cases":
        result["cases"] = None
    elif mangle == "list id":
        first["test_case_id"] = [first["test_case_id"]]
    elif mangle == "dict id":
        first["test_case_id"] = {"id": first["test_case_id"]}
    elif mangle == "null metrics":
        first["metrics"] = None
    elif mangle == "list overall":
        result["overall"] = [True]
    else:
        first["metrics"][0]["name"] = ["latency_us"]
    view = zoo.report_result(uuid, "r", claim.lease_id, result, b"", {}, None)
    assert view.status == "rejected", view
    assert view.reasons and view.reasons[0]["stage"] == "result"
