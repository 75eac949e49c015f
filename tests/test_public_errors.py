"""Text that cannot be stored is refused where it comes in, and the server's own failures show a fixed message.

A benchmark document holding a lone surrogate (``"\\ud800"``) passed the hard checks; the
commit step crashed and the public status showed the raw ``UnicodeEncodeError``; a saga
that lost its stored package showed the server's file path. Now the hard checks call
such a document BAD_OUTPUT (the runner API runs them), the runner API refuses such text
in its other fields (400), and a rolled-back saga's reason is a fixed text everywhere
the public reads it (status, logs, the submission page) while the exception goes to the
operator's log.
"""
from __future__ import annotations

import json

import pytest

from kz_daemon.core.hints import PUBLIC_MESSAGES
from kz_runner.contract.checks import check_output
from tests.helpers.http_server import CPU_AXPY, LiveServer, package_tarball
from tests.helpers.live_api import api_error, claim_job, result_doc

SUBMITTER = "carol"  # an id no token is bound to: anonymous uploads may use it


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    server = LiveServer.start(tmp_path_factory.mktemp("public"), kernels=[CPU_AXPY],
                              settings={"submit_burst": 1000})
    yield server
    server.stop()


def _claimed(live) -> tuple[str, dict]:
    with live.client() as anon:
        resp = live.submit(anon, CPU_AXPY, package_tarball(CPU_AXPY), submitter=SUBMITTER)
    assert resp.status_code == 202, resp.text
    uuid = resp.json()["uuid"]
    with live.client("runner:r1") as r1:
        return uuid, claim_job(r1, uuid)


def _status(live, uuid: str) -> dict:
    with live.client() as anon:
        resp = anon.get(f"/api/submissions/{uuid}/status")
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_dry_run_calls_a_lone_surrogate_bad_output():
    stdout = json.dumps({"kernel_id": CPU_AXPY, "overall": {"accept": True, "accept_reason": "\ud800"}}).encode()
    verdict = check_output(stdout, kernel_id=CPU_AXPY, case_ids=[])
    assert verdict.codes == ("BAD_OUTPUT",)
    assert "overall.accept_reason" in verdict.reason
    verdict.reason.encode("utf-8")  # the verdict itself can be printed, stored and shown


@pytest.mark.parametrize("how", ["escaped", "raw-bytes", "in-a-key"])
def test_a_result_with_a_lone_surrogate_is_rejected_bad_output_over_the_runner_api(live, how):
    head = live.zoo.git.head()
    uuid, claim = _claimed(live)
    doc = result_doc(CPU_AXPY)
    if how == "in-a-key":
        doc["cases"][0]["metrics"][0]["\udc80"] = 1
    else:
        doc["overall"]["accept_reason"] = "\ud800 fast"
    body = json.dumps({"lease_id": claim["lease_id"], "result": doc})  # ensure_ascii: the \\ud800 escape
    if how == "raw-bytes":  # the surrogate's three UTF-8-style bytes, which json.loads lets through
        data = body.replace("\\ud800", "@@").encode().replace(b"@@", b"\xed\xa0\x80")
    else:
        data = body.encode()
    with live.client("runner:r1") as r1:
        resp = r1.post(f"/api/submissions/{uuid}/result", content=data,
                       headers={"Content-Type": "application/json"})
    assert resp.status_code == 200, resp.text
    status = _status(live, uuid)
    assert status["status"] == "rejected", status
    assert [r["code"] for r in status["reasons"]] == ["BAD_OUTPUT"]
    where = "cases[0].metrics[0]" if how == "in-a-key" else "overall.accept_reason"
    assert where in status["reasons"][0]["message"] and status["reasons"][0]["hint"]
    assert live.zoo.git.head() == head  # nothing was committed
    with live.client() as anon:
        assert anon.get(f"/api/submissions/{uuid}/logs").status_code == 200


@pytest.mark.parametrize("field", ["env", "failure", "log_tails"])
def test_such_text_in_the_reports_other_fields_is_a_bad_request_and_the_lease_holds(live, field):
    uuid, claim = _claimed(live)
    bad = {"env": {"host": "\ud800"}, "failure": {"code": "BENCHMARK_CRASHED", "message": "\ud800"},
           "log_tails": {"build": "ok \udfff"}}[field]
    with live.client("runner:r1") as r1:
        body = {"lease_id": claim["lease_id"], "result": result_doc(CPU_AXPY), field: bad}
        resp = r1.post(f"/api/submissions/{uuid}/result", content=json.dumps(body).encode(),
                       headers={"Content-Type": "application/json"})
        error = api_error(resp, 400, "BAD_REQUEST")
        assert error["details"]["fields"][0].startswith(field)
        good = r1.post(f"/api/submissions/{uuid}/result",
                       json={"lease_id": claim["lease_id"], "result": result_doc(CPU_AXPY)})
    assert good.status_code == 200, good.text
    assert _status(live, uuid)["status"] == "accepted"


def test_a_rolled_back_saga_shows_a_fixed_message_and_the_operator_log_has_the_cause(live, caplog):
    head = live.zoo.git.head()
    uuid, claim = _claimed(live)
    stored = live.state_dir / "pending" / uuid / "package.tar.gz"
    stored.unlink()  # the saga's source commit cannot be built: an internal failure
    with live.client("runner:r1") as r1:
        resp = r1.post(f"/api/submissions/{uuid}/result",
                       json={"lease_id": claim["lease_id"], "result": result_doc(CPU_AXPY)})
    assert resp.status_code == 200, resp.text
    assert live.zoo.git.head() == head
    status = _status(live, uuid)
    assert status["status"] == "failed"
    assert status["reasons"][-1]["code"] == "ROLLED_BACK"
    assert status["reasons"][-1]["message"] == PUBLIC_MESSAGES["ROLLED_BACK"]
    with live.client() as anon:
        logs = anon.get(f"/api/submissions/{uuid}/logs")
        page = anon.get(f"/submissions/{uuid}")
    assert logs.status_code == 200 and page.status_code == 200
    for text in (resp.text, json.dumps(status), logs.text, page.text):
        for leak in (str(live.state_dir), "pending/", "FileNotFoundError", "Errno", "Traceback"):
            assert leak not in text, (leak, text[:2000])
    log = caplog.text  # the operator's log (stderr under kz daemon) has the cause
    assert f"accept saga of {uuid} rolled back: FileNotFoundError" in log and str(stored) in log
