"""The runner wire protocol's routes (kz_daemon/api/runner.py): claim, package, lease, result."""
from __future__ import annotations

import threading
import time

from tests.helpers.http_server import CPU_AXPY, CPU_SOFTMAX
from tests.helpers.live_api import api_error, claim_job, live_server, queue_submission, result_doc

live = live_server("runner_api")


def test_claim_bad_bodies(r1):
    api_error(r1.post("/api/runner/claim", content=b"{not json", headers={"content-type": "application/json"}),
           400, "BAD_REQUEST")
    api_error(r1.post("/api/runner/claim", json={"wait": 0}), 400, "BAD_REQUEST")
    api_error(r1.post("/api/runner/claim", json={"arch": "cpu", "wait": -1}), 400, "BAD_REQUEST")
    api_error(r1.post("/api/runner/claim", json=[1, 2]), 400, "BAD_REQUEST")


def test_claim_returns_204_when_nothing_matches(r1):
    resp = r1.post("/api/runner/claim", json={"arch": "gfx999", "wait": 0.2})
    assert resp.status_code == 204 and resp.content == b""


def test_release_requeues_and_result_invalid_is_422(live, anon, r1, r2):
    uuid = queue_submission(live, anon)
    claim = claim_job(r1, uuid)
    api_error(r1.post(f"/api/runner/lease/{uuid}/release", json={"lease_id": "wrong"}), 409, "LEASE_LOST")
    resp = r1.post(f"/api/runner/lease/{uuid}/release", json={"lease_id": claim["lease_id"], "reason": "test"})
    assert resp.status_code == 200 and resp.json()["released"] is True
    assert anon.get(f"/api/submissions/{uuid}/status").json()["status"] == "queued"
    claim2 = claim_job(r2, uuid)
    assert claim2["lease_id"] != claim["lease_id"]
    # the old lease is dead
    api_error(r1.post(f"/api/runner/lease/{uuid}/renew", json={"lease_id": claim["lease_id"]}), 409, "LEASE_LOST")
    bad = result_doc(CPU_AXPY, accept=False, correctness="failed", case_accept=True)
    resp = r2.post(f"/api/submissions/{uuid}/result",
                   json={"lease_id": claim2["lease_id"], "result": bad, "logs_b64": "", "env": {}, "failure": None})
    api_error(resp, 422, "RESULT_INVALID")
    assert anon.get(f"/api/submissions/{uuid}/status").json()["status"] == "rejected"


def test_claim_long_poll_returns_when_a_job_arrives(live, anon, r2):
    events: list[str] = []
    got: dict = {}

    def claim() -> None:
        resp = r2.post("/api/runner/claim", json={"arch": "cpu", "wait": 30})
        got["status"] = resp.status_code
        got["body"] = resp.json() if resp.status_code == 200 else None
        events.append("claim returned")

    # first drain whatever an earlier test left queued
    while r2.post("/api/runner/claim", json={"arch": "cpu", "wait": 0}).status_code == 200:
        pass
    thread = threading.Thread(target=claim)
    thread.start()
    time.sleep(0.3)
    assert events == []
    events.append("submitted")
    uuid = queue_submission(live, anon, CPU_SOFTMAX, CPU_SOFTMAX)
    thread.join(30)
    assert events == ["submitted", "claim returned"]
    assert got["status"] == 200 and got["body"]["uuid"] == uuid


def test_a_non_holder_cannot_fetch_renew_release_or_report(live, anon, r1, r2):
    """Another runner presenting the holder's lease_id is refused on every lease route."""
    uuid = queue_submission(live, anon)
    claim = claim_job(r1, uuid)
    lease = {"lease_id": claim["lease_id"]}
    api_error(r2.get(claim["package_url"]), 409, "LEASE_LOST")
    api_error(r2.post(f"/api/runner/lease/{uuid}/renew", json=lease), 409, "LEASE_LOST")
    api_error(r2.post(f"/api/runner/lease/{uuid}/release", json=lease), 409, "LEASE_LOST")
    report = dict(lease, result=result_doc(CPU_AXPY), logs_b64="", env={}, failure=None)
    api_error(r2.post(f"/api/submissions/{uuid}/result", json=report), 409, "LEASE_LOST")
    # the holder's lease survived all of it
    assert r1.post(f"/api/runner/lease/{uuid}/renew", json=lease).status_code == 200
    assert anon.get(f"/api/submissions/{uuid}/status").json()["status"] == "running"
    failure = dict(lease, result=None, logs_b64="", env={}, failure={"code": "BUILD_TIMEOUT", "message": "x"})
    assert r1.post(f"/api/submissions/{uuid}/result", json=failure).json()["status"] == "rejected"


def test_renew_after_the_job_ended_is_lease_lost(live, anon, r1):
    uuid = queue_submission(live, anon)
    claim = claim_job(r1, uuid)
    failure = {"lease_id": claim["lease_id"], "result": None, "logs_b64": "", "env": {},
               "failure": {"code": "BUILD_TIMEOUT", "message": "ran past 1 s"}}
    assert r1.post(f"/api/submissions/{uuid}/result", json=failure).json()["status"] == "rejected"
    api_error(r1.post(f"/api/runner/lease/{uuid}/renew", json={"lease_id": claim["lease_id"]}), 409, "LEASE_LOST")
    api_error(r1.get(claim["package_url"]), 409, "LEASE_LOST")


def test_unknown_submission_on_the_lease_routes(r1):
    api_error(r1.post("/api/runner/lease/no-such-uuid/renew", json={"lease_id": "x"}), 404, "NOT_FOUND")
