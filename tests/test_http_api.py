"""The HTTP API against the real daemon under uvicorn on loopback: every endpoint and error code.

The test plays the runner by hand (claim, package, result) so lease ownership and
every answer can be asserted exactly; tests/test_up.py runs a real runner process.
"""
from __future__ import annotations

import base64
import io
import json
import tarfile
import threading
import time

from tests.helpers.events import hold_log_appends
from tests.helpers.http_server import CPU_AXPY, CPU_SOFTMAX, package_tarball
from tests.helpers.live_api import AXPY_CASES, api_error, claim_job, live_server, queue_submission, result_doc

live = live_server("api")


# -- read side ---------------------------------------------------------------------------------

def test_health_ready_index_openapi(anon):
    assert anon.get("/healthz").json()["status"] == "ok"
    ready = anon.get("/readyz").json()
    assert ready["status"] == "ready" and all(c["ok"] for c in ready["checks"].values())
    index = anon.get("/index.json").json()
    assert {k["kernel_id"] for k in index["kernels"]} == {CPU_AXPY, CPU_SOFTMAX}
    spec = anon.get("/openapi.json").json()
    assert spec["openapi"].startswith("3.1")
    assert "/api/kernels/{kernel_id}" in spec["paths"]


def test_list_kernels_filters_and_pagination(anon):
    body = anon.get("/api/kernels").json()
    assert body["total"] == 2 and body["per_page"] == 100 and body["page"] == 1
    assert [k["kernel_id"] for k in body["kernels"]] == sorted([CPU_AXPY, CPU_SOFTMAX])
    assert anon.get("/api/kernels", params={"op_class": "Reduction"}).json()["total"] == 1
    assert anon.get("/api/kernels", params={"arch": "sm_90"}).json()["total"] == 0
    assert anon.get("/api/kernels", params={"q": "softmax"}).json()["kernels"][0]["kernel_id"] == CPU_SOFTMAX
    assert anon.get("/api/kernels", params={"status": "normal", "quant": "fp32"}).json()["total"] == 2
    page2 = anon.get("/api/kernels", params={"per_page": 1, "page": 2}).json()
    assert page2["pages"] == 2 and len(page2["kernels"]) == 1 and page2["kernels"][0]["kernel_id"] == CPU_SOFTMAX
    api_error(anon.get("/api/kernels", params={"per_page": 0}), 400, "BAD_REQUEST")
    api_error(anon.get("/api/kernels", params={"page": "x"}), 400, "BAD_REQUEST")


def test_get_kernel_with_slashes(anon):
    body = anon.get(f"/api/kernels/{CPU_AXPY}").json()
    assert body["kernel_id"] == CPU_AXPY
    assert body["desc"]["category"]["op_class"] == "Elementwise"
    assert body["bench_result"]["kernel_id"] == CPU_AXPY
    err = api_error(anon.get("/api/kernels/cpu/nope/x"), 404, "NOT_FOUND")
    assert err["details"]["kernel_id"] == "cpu/nope/x"


def test_unknown_path_and_method_use_the_error_body(anon):
    api_error(anon.get("/api/nothing-here"), 404, "NOT_FOUND")
    api_error(anon.delete("/api/kernels"), 405, "METHOD_NOT_ALLOWED")
    api_error(anon.get("/api/submissions/00000000-0000-0000-0000-000000000000/status"), 404, "NOT_FOUND")


def test_metrics_prometheus_text(anon):
    resp = anon.get("/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    text = resp.text
    assert "kz_queue_pending" in text
    assert "kz_http_requests_total" in text
    for line in text.splitlines():
        assert line.startswith("#") or " " in line


# -- submissions -------------------------------------------------------------------------------

def test_submission_errors(live, anon):
    data = package_tarball(CPU_AXPY)
    # not multipart
    api_error(anon.post("/api/submissions", json={"kernel_id": CPU_AXPY}), 400, "BAD_REQUEST")
    # package missing
    resp = anon.post("/api/submissions", headers={"X-Submitter-Id": "carol"},
                     data={"kernel_id": CPU_AXPY, "submitter_id": "carol"},
                     files={"other": ("x.txt", b"x", "text/plain")})
    assert api_error(resp, 400, "VALIDATION_ERROR")["details"]["field"] == "package"
    # kernel_id missing / malformed
    resp = anon.post("/api/submissions", headers={"X-Submitter-Id": "carol"},
                     files={"package": ("p.tar.gz", data, "application/gzip")})
    api_error(resp, 400, "VALIDATION_ERROR")
    api_error(live.submit(anon, "cpu/../etc", data), 400, "VALIDATION_ERROR")
    # no submitter at all
    resp = anon.post("/api/submissions", data={"kernel_id": CPU_AXPY},
                     files={"package": ("p.tar.gz", data, "application/gzip")})
    api_error(resp, 400, "VALIDATION_ERROR")
    # header and field disagree
    resp = anon.post("/api/submissions", headers={"X-Submitter-Id": "carol"},
                     data={"kernel_id": CPU_AXPY, "submitter_id": "mallory"},
                     files={"package": ("p.tar.gz", data, "application/gzip")})
    api_error(resp, 403, "FORBIDDEN")
    # bad submitter id
    api_error(live.submit(anon, CPU_AXPY, data, submitter="a b"), 400, "VALIDATION_ERROR")


def test_a_bad_form_kernel_id_answers_with_the_code_intake_gives_it(live, anon):
    parent = CPU_AXPY.rsplit("/", 1)[0]
    cases = [
        (f"{CPU_AXPY} x", {"KERNEL_ID_INVALID"}),
        (CPU_AXPY + "\n", {"KERNEL_ID_INVALID"}),
        (f"{parent}/{'k' * 101}", {"KERNEL_ID_INVALID"}),
        (f"{parent}/{'k' * 256}", {"KERNEL_ID_INVALID"}),
        ("/".join(["k" * 90] * 3), {"KERNEL_ID_INVALID"}),
        (f"{parent}/.git.", {"GIT_PATH_REFUSED"}),
        (f"{parent}/.GIT/x y", {"GIT_PATH_REFUSED", "KERNEL_ID_INVALID"}),
    ]
    data = package_tarball(CPU_AXPY)
    for kernel_id, codes in cases:
        err = api_error(live.submit(anon, kernel_id, data), 400, "VALIDATION_ERROR")
        problems = err["details"]["problems"]
        assert {p["code"] for p in problems} == codes, (kernel_id, problems)
        assert all(p["field"] == "kernel_id" and p["message"] and p["hint"] for p in problems), problems
        assert err["details"]["field"] == "kernel_id" and "uuid" not in err["details"]  # refused before intake
        assert "is invalid" in err["message"] and problems[0]["hint"] in err["message"], err["message"]


def test_intake_rejects_a_tarball_with_the_scorecard(live, anon):
    data = package_tarball(CPU_AXPY, include_bench_result=True)
    err = api_error(live.submit(anon, CPU_AXPY, data), 400, "VALIDATION_ERROR")
    assert err["details"]["status"] == "rejected"
    uuid = err["details"]["uuid"]
    codes = json.dumps(err["details"]["reasons"])
    assert "BENCH_RESULT" in codes
    assert "BENCH_RESULT_IN_TARBALL" in {p["code"] for p in err["details"]["problems"]}
    status = anon.get(f"/api/submissions/{uuid}/status").json()
    assert status["status"] == "rejected" and status["terminal"] is True


# -- runner endpoints and the whole cycle ------------------------------------------------------

def test_concurrent_renewals_are_all_durable_and_share_fsyncs(live, anon, r1, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    uuid = queue_submission(live, anon, "cpu/Elementwise/Axpy/fp32/renew_many")
    claim = claim_job(r1, uuid)
    store = live.zoo.store
    requests = 24
    # hold the first commit until every renewal waits for its fsync
    batches = hold_log_appends(monkeypatch, lambda: len(store._futures) >= requests, timeout=10)
    before = store.state.seq

    def renew(_):
        with live.client("runner:r1") as client:
            return client.post(f"/api/runner/lease/{uuid}/renew", json={"lease_id": claim["lease_id"]})

    with ThreadPoolExecutor(requests) as pool:
        answers = list(pool.map(renew, range(requests)))
    assert [a.status_code for a in answers] == [200] * requests
    assert store.seq - before == requests == sum(batches)
    assert len(batches) <= 2  # the decisions did not queue behind each other's fsync
    monkeypatch.undo()
    resp = r1.post(f"/api/runner/lease/{uuid}/release", json={"lease_id": claim["lease_id"]})
    assert resp.status_code == 200
    cancelled = _cancel_as_alice(live, uuid)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"


def test_full_cycle_accepts_and_reports_sha_src(live, anon, r1, r2):
    uuid = queue_submission(live, anon)
    claim = claim_job(r1, uuid)
    assert claim["package_url"] == f"/api/runner/package/{uuid}"
    assert claim["lease_expires_at"].endswith("Z") and claim["timeouts"]["build_s"] > 0
    # only the lease holder gets the package
    assert r2.get(claim["package_url"]).status_code in (403, 409)
    pkg = r1.get(claim["package_url"])
    assert pkg.status_code == 200 and pkg.headers["content-type"] == "application/gzip"
    with tarfile.open(fileobj=io.BytesIO(pkg.content)) as tf:
        assert f"{CPU_AXPY}/.kernel_package/bench_result.yaml" in tf.getnames()
    # renew: holder only; wrong lease id → LEASE_LOST
    renewed = r1.post(f"/api/runner/lease/{uuid}/renew", json={"lease_id": claim["lease_id"]})
    assert renewed.status_code == 200 and renewed.json()["lease_expires_at"].endswith("Z")
    assert r2.post(f"/api/runner/lease/{uuid}/renew", json={"lease_id": claim["lease_id"]}).status_code in (403, 409)
    api_error(r1.post(f"/api/runner/lease/{uuid}/renew", json={"lease_id": "not-mine"}), 409, "LEASE_LOST")
    api_error(r1.post(f"/api/runner/lease/{uuid}/renew", json={}), 400, "BAD_REQUEST")
    # result: another runner is refused, bad base64 is a 400
    doc = {"lease_id": claim["lease_id"], "result": result_doc(CPU_AXPY, 5.0),
           "logs_b64": base64.b64encode(b"build ok\n").decode(), "env": {"runner": "test"}, "failure": None}
    assert r2.post(f"/api/submissions/{uuid}/result", json=doc).status_code in (403, 409)
    api_error(r1.post(f"/api/submissions/{uuid}/result", json=dict(doc, logs_b64="!!!")), 400, "BAD_REQUEST")
    api_error(r1.post(f"/api/submissions/{uuid}/result", json=dict(doc, result=None, failure=None)),
           400, "BAD_REQUEST")
    resp = r1.post(f"/api/submissions/{uuid}/result", json=doc)
    assert resp.status_code == 200, resp.text
    view = resp.json()
    assert view["status"] == "accepted" and len(view["commit_sha"]) == 40
    status = anon.get(f"/api/submissions/{uuid}/status").json()
    assert status["commit_sha"] == view["commit_sha"]
    assert [c["test_case_id"] for c in status["cases"]] == list(AXPY_CASES)
    assert status["cases"][0]["primary_metric"] == "latency_us" and status["cases"][0]["value"] == 5.0
    # the same report again (a runner retrying after a lost answer) changes nothing
    again = r1.post(f"/api/submissions/{uuid}/result", json=doc)
    assert again.status_code in (200, 409)
    if again.status_code == 200:
        assert again.json()["status"] == "accepted" and again.json()["commit_sha"] == view["commit_sha"]
    # a report under another lease is refused
    api_error(r1.post(f"/api/submissions/{uuid}/result", json=dict(doc, lease_id="not-the-lease")), 409, "LEASE_LOST")
    # the kernel's scorecard now carries SHA_src
    kernel = anon.get(f"/api/kernels/{CPU_AXPY}").json()
    best = kernel["bench_result"]["cases"][0]["metrics_best"]["latency_us"]
    assert best["commit_sha"] == view["commit_sha"] and best["submitter"] == "alice"
    # /metrics now counts the accept and its latency
    text = anon.get("/metrics").text
    count = [line for line in text.splitlines() if line.startswith("kz_accept_latency_seconds_count ")]
    assert count and int(count[0].split()[1]) >= 1
    assert 'kz_accept_latency_seconds_bucket{le="+Inf"}' in text
    accepted = [line for line in text.splitlines() if line.startswith("kz_submissions_accepted_total ")]
    assert accepted and int(accepted[0].split()[1]) >= 1


def test_failure_report_rejects_with_reason(live, anon, r1):
    uuid = queue_submission(live, anon)
    claim = claim_job(r1, uuid)
    resp = r1.post(f"/api/submissions/{uuid}/result",
                   json={"lease_id": claim["lease_id"], "result": None, "logs_b64": "",
                         "env": {}, "failure": {"code": "BUILD_TIMEOUT", "message": "took too long"}})
    assert resp.status_code == 200
    body = resp.json()
    assert body["status"] == "rejected" and body["reasons"][0]["code"] == "BUILD_TIMEOUT"


def _cancel_as_alice(live, uuid):
    with live.client("submitter:alice") as alice:
        return alice.post(f"/api/submissions/{uuid}/cancel", json={})


def test_cancel(live, anon):
    uuid = queue_submission(live, anon, "cpu/Elementwise/Axpy/fp32/cancel_me", CPU_AXPY)
    api_error(anon.post(f"/api/submissions/{uuid}/cancel", headers={"X-Submitter-Id": "bob"}, json={}),
           403, "FORBIDDEN")
    # alice holds a submitter token here: her id alone, in a header, no longer cancels
    api_error(anon.post(f"/api/submissions/{uuid}/cancel", headers={"X-Submitter-Id": "alice"}, json={}),
           403, "FORBIDDEN")
    resp = _cancel_as_alice(live, uuid)
    assert resp.status_code == 200 and resp.json()["status"] == "cancelled"


def test_queue_view_lists_runners(anon, r1):
    r1.post("/api/runner/claim", json={"arch": "cpu", "wait": 0, "host": "box"})
    view = anon.get("/api/queue").json()
    assert "r1" in view["runners"] and view["runners"]["r1"]["arch"] == "cpu"
    assert isinstance(view["pending"], list)


# -- long polls ----------------------------------------------------------------------------------

def test_status_long_poll_returns_at_timeout_unchanged_and_early_on_change(live, anon, r1):
    uuid = queue_submission(live, anon, "cpu/Elementwise/Axpy/fp32/poll", CPU_AXPY)
    # nothing happens: the poll comes back with the same status
    assert anon.get(f"/api/submissions/{uuid}/status", params={"wait": 0.5}).json()["status"] == "queued"
    events: list[str] = []
    got: dict = {}

    def poll() -> None:
        got.update(anon.get(f"/api/submissions/{uuid}/status", params={"wait": 30}).json())
        events.append("poll returned")

    thread = threading.Thread(target=poll)
    thread.start()
    time.sleep(0.3)
    assert events == []  # still waiting: nothing changed yet
    events.append("claimed")
    claim_job(r1, uuid)
    thread.join(30)
    assert events == ["claimed", "poll returned"]
    assert got["status"] == "running"
    api_error(anon.get(f"/api/submissions/{uuid}/status", params={"wait": "x"}), 400, "BAD_REQUEST")
    api_error(anon.get(f"/api/submissions/{uuid}/status", params={"wait": 10_000}), 400, "BAD_REQUEST")


def test_unexpected_errors_are_a_generic_500():
    """The shim's error mapping on a real Starlette app: no exception text leaves the server."""
    import asyncio

    import httpx
    from starlette.applications import Starlette
    from starlette.routing import Route

    from kz_daemon.api.error_responses import EXCEPTION_HANDLERS

    async def boom(request):
        raise RuntimeError("secret: /etc/kz/token=abc")

    app = Starlette(routes=[Route("/boom", boom)], exception_handlers=EXCEPTION_HANDLERS)

    async def call():
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.get("/boom")

    resp = asyncio.run(call())
    assert resp.status_code == 500
    assert resp.json() == {"error": {"code": "INTERNAL", "details": {},
                                     "message": "internal server error; the operator's log has the details"}}
    assert "secret" not in resp.text and "Traceback" not in resp.text
