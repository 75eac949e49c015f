"""GET /api/submissions over real HTTP: filters, cursor pages, strict parameters; status documents from the log."""
from __future__ import annotations

import base64
import json
import random
from pathlib import Path

import jsonschema
import pytest

from kz_events import events as E
from tests.helpers.http_server import CPU_AXPY
from tests.helpers.live_api import api_error, claim_job, live_server, queue_submission, result_doc

live = live_server("listing")
SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "schemas" / "api_submission_list.json").read_text())
KERNELS = ("cpu/Hist/A/fp32/one", "cpu/Hist/B/fp32/two")


def _uuid(rng: random.Random) -> str:
    h = f"{rng.getrandbits(128):032x}"
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-a{h[17:20]}-{h[20:]}"


@pytest.fixture(scope="module")
def history(live):
    """Forty finished submissions written to the daemon's log (the history the API must page through)."""
    rng = random.Random(11)
    made = []
    for i in range(40):
        uuid, kid, who = _uuid(rng), KERNELS[i % 2], ("alice", "bob", "carol")[i % 3]
        events = [E.SubmissionReceived(uuid, kid, who, "http", "p.tar.gz", 10, "a" * 64, None)]
        if i % 4 == 0:
            events.append(E.SubmissionRejected(uuid, "intake", "DESC_SCHEMA", "desc.yaml: bad", {}))
        else:
            events += [E.SubmissionValidated(uuid, kid, "cpu", False, []), E.JobQueued(uuid, kid, "cpu"),
                       E.JobCancelled(uuid, who, "superseded")]
        seqs = live.zoo.store.emit(*events)
        made.append({"uuid": uuid, "kernel_id": kid, "submitter_id": who, "seq": seqs[0],
                     "status": "rejected" if i % 4 == 0 else "cancelled"})
    live.zoo.store.flush_history()
    return made[::-1]  # newest first


def _page(client, **params):
    resp = client.get("/api/submissions", params=params)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    jsonschema.validate(body, SCHEMA)
    return body


def _walk(client, **params):
    """Every row the cursor pages give, in order, and how many pages."""
    rows, pages, cursor = [], 0, None
    while True:
        body = _page(client, **params, **({"cursor": cursor} if cursor else {}))
        rows += body["submissions"]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            return rows, pages


def test_the_newest_come_first_and_the_cursor_walks_every_page(live, anon, history):
    rows, pages = _walk(anon, submitter="bob", limit=3)
    expected = [h["uuid"] for h in history if h["submitter_id"] == "bob"]
    assert [r["uuid"] for r in rows] == expected and pages == -(-len(expected) // 3)
    first = rows[0]
    assert first["status_url"] == f"/api/submissions/{first['uuid']}/status" and first["terminal"] is True
    assert first["reason"]["code"] in ("CANCELLED", "DESC_SCHEMA") and first["updated_at"] >= first["received_at"]


def test_filters_combine(live, anon, history):
    rows, _ = _walk(anon, kernel_id=KERNELS[0], status="rejected", limit=200)
    assert [r["uuid"] for r in rows] == [h["uuid"] for h in history
                                         if h["kernel_id"] == KERNELS[0] and h["status"] == "rejected"]
    assert _page(anon, submitter="nobody")["submissions"] == []
    cutoff = _page(anon, submitter="carol", limit=200)["submissions"][4]["received_at"]
    since = _page(anon, submitter="carol", since=cutoff, limit=200)["submissions"]
    assert len(since) == 5 and all(r["received_at"] >= cutoff for r in since)
    later = cutoff.replace("Z", "+00:00")  # any zone is taken
    assert _page(anon, submitter="carol", since=later, limit=200)["submissions"] == since


def test_live_submissions_are_listed_with_the_finished_ones(live, anon, history):
    uuid = queue_submission(live, anon)
    body = _page(anon, submitter="alice", limit=5)
    assert body["submissions"][0]["uuid"] == uuid and body["submissions"][0]["terminal"] is False
    assert [r["uuid"] for r in body["submissions"][1:]] == \
        [h["uuid"] for h in history if h["submitter_id"] == "alice"][:4]
    queued = _page(anon, status="queued", kernel_id=CPU_AXPY)["submissions"]
    assert uuid in [r["uuid"] for r in queued]
    live.zoo.cancel(uuid, "alice")


@pytest.mark.parametrize("params, parameter", [
    ([("limit", "0")], "limit"), ([("limit", "201")], "limit"), ([("limit", "ten")], "limit"),
    ([("status", "done")], "status"), ([("since", "yesterday")], "since"),
    ([("since", "2026-01-01T00:00:00")], "since"), ([("cursor", "not-a-cursor")], "cursor"),
    ([("cursor", base64.urlsafe_b64encode(b"x:1").decode())], "cursor"),
    ([("submitter", "a"), ("submitter", "b")], "submitter"), ([("status", "queued"), ("status", "queued")], "status"),
    ([("user", "alice")], "user"), ([("page", "2")], "page"), ([("submitter", "")], "submitter"),
])
def test_bad_or_repeated_or_unknown_parameters_are_400_naming_it(live, anon, params, parameter):
    error = api_error(anon.get("/api/submissions", params=params), 400, "BAD_REQUEST")
    assert error["details"]["parameter"] == parameter


def test_the_status_document_of_a_finished_run_comes_from_the_log_not_the_stored_result(live, anon, r1):
    uuid = queue_submission(live, anon)
    claim = claim_job(r1, uuid)
    result = result_doc(CPU_AXPY, 7.0)
    result["cases"][0]["metrics"][0]["spread"] = {"n": 41, "lo": 6.5, "hi": 7.5}  # as kz_runner.bench reports it
    resp = r1.post(f"/api/submissions/{uuid}/result",
                   json={"lease_id": claim["lease_id"], "result": result, "logs_b64": "",
                         "env": {}, "failure": None})
    assert resp.status_code == 200 and resp.json()["status"] == "accepted", resp.text
    live.zoo.store.flush_history()
    (live.zoo.pending.run_folder(uuid) / "result.json").unlink()  # not read again
    doc = anon.get(f"/api/submissions/{uuid}/status").json()
    assert doc["status"] == "accepted" and doc["terminal"]
    assert doc["cases"][0] == {"test_case_id": "n4k", "correctness": "passed", "accept": True,
                               "primary_metric": "latency_us", "value": 7.0, "unit": "us",
                               "direction": "lower_better", "n": 41, "lo": 6.5, "hi": 7.5}
    assert doc["cases"][1]["n"] is None and doc["cases"][1]["value"] == 8.0  # no spread reported
    assert uuid not in live.zoo.store.state.submissions and live.zoo.store.history.has(uuid)
    listed = _page(anon, status="accepted", kernel_id=CPU_AXPY)["submissions"]
    assert listed[0]["uuid"] == uuid and listed[0]["commit_sha"] == doc["commit_sha"]
