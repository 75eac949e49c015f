"""The history projection's page queries: with or without a cursor, every filter the API's
``GET /api/submissions`` takes is one index range in arrival order (a keyset page), never a
scan of the table nor a sort of everything that matches."""
from __future__ import annotations

import pytest

from kz_events.log.history import History, Query, history_path
from kz_events.read.workload import build_history

KID = "sm_90/Elementwise/Axpy/fp16/k0"


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    events = tmp_path_factory.mktemp("events")
    build_history(events, 300, seed=5)
    with History.open(history_path(events), readonly=True) as opened:
        yield opened


API_FILTERS = [Query(), Query(submitter="submitter-0"), Query(kernel_id=KID), Query(status="accepted"),
               Query(submitter="submitter-0", status="accepted"), Query(kernel_id=KID, status="rejected"),
               Query(submitter="submitter-0", kernel_id=KID), Query(submitter="submitter-0", since="2026-01-02")]


@pytest.mark.parametrize("query", API_FILTERS, ids=lambda q: ",".join(
    f"{k}={v}" for k, v in vars(q).items() if v is not None) or "none")
@pytest.mark.parametrize("before", [None, 10_000], ids=["first page", "next page"])
def test_a_page_is_one_index_range_newest_first(history, query, before):
    plan = history.plan(query, before)
    assert len(plan) == 1 and "TEMP B-TREE" not in plan[0], plan  # no sort: read in arrival order
    if query.submitter or query.kernel_id or query.status:
        assert plan[0].startswith("SEARCH submissions USING INDEX submissions_by_"), plan  # a filter's index
    elif before is None:
        assert plan[0] == "SCAN submissions", plan  # the table in key order, newest first, up to the limit
    if before is not None:
        assert "rowid<?" in plan[0], plan  # the cursor bounds the range, it is not a filter on each row


def test_a_next_page_continues_where_the_first_ended(history):
    query = Query(submitter="submitter-0")
    first = history.select(query, None, 5)
    following = history.select(query, first[-1][0], 5)
    both = [rseq for rseq, _ in first + following]
    assert both == sorted(both, reverse=True) and len(set(both)) == len(both) == 10
    assert [rseq for rseq, _ in history.select(query, None, 10)] == both
