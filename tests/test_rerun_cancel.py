"""Cancelling a rerun: in the reducer, over HTTP against a real zoo, with ``kz rerun cancel|list``, across a restart.

A queued rerun that an admin cancels ends ``cancelled`` and no runner ever claims it; a
running one goes ``cancelling``: its runner may renew its lease and report, the report is
taken but its figures are discarded and the rerun ends ``cancelled`` (as it does when that
lease is released). Only an admin may cancel; the state is the log's, so a restarted zoo
shows the same.
"""
from __future__ import annotations

import base64
import json
import subprocess
import sys

import pytest

from kz_daemon.config.settings import Config
from kz_daemon.ops.service import Zoo
from kz_daemon.queue import reruns
from kz_events import events as ev
from kz_events.reducer import InvalidTransition, next_rerun
from kz_events.state import State, Submission
from tests.helpers.daemon import ROOT
from tests.helpers.http_server import CPU_AXPY, LiveServer, package_tarball
from tests.test_operator_board import RUNS, result
from tests.test_rerun import _fold

KID = "cpu/a/b/c/k"


def _state() -> State:
    state = State()
    if hasattr(state, "accepted"):
        state.accepted["rec"] = KID
    else:
        state.submissions["rec"] = Submission("rec", KID, "alice", "http", "t", "accepted", [])
    return state


def _ask(rerun_id: str) -> ev.RerunRequested:
    return ev.RerunRequested(rerun_id=rerun_id, uuid="rec", kernel_id=KID, arch="cpu", runner=None, by="alice")


def _claim(rerun_id: str, lease: str, attempt: int = 1) -> ev.RerunClaimed:
    return ev.RerunClaimed(rerun_id=rerun_id, uuid="rec", runner_id="r1", lease_id=lease, lease_expires_at=9.0,
                           attempt=attempt)


def _cancel(rerun_id: str) -> ev.RerunCancelled:
    return ev.RerunCancelled(rerun_id=rerun_id, uuid="rec", by="root", reason="wrong runner")


def test_the_reducer_cancels_a_queued_rerun_at_once_and_a_running_one_when_its_lease_ends():
    state = _fold(_state(), _ask("q"), _cancel("q"))
    queued = state.reruns["q"]
    assert queued["status"] == "cancelled" and next_rerun(state, "cpu", "r1") is None
    assert queued["reason"]["code"] == "CANCELLED" and queued["reason"]["by"] == "root"
    with pytest.raises(InvalidTransition):  # a cancelled rerun is never claimed
        _fold(state, _claim("q", "l0"))
    with pytest.raises(InvalidTransition):  # nor cancelled twice in the log
        _fold(state, _cancel("q"))

    _fold(state, _ask("run"), _claim("run", "l1"), _cancel("run"))
    assert state.reruns["run"]["status"] == "cancelling" and state.reruns["run"]["lease"] is not None
    _fold(state, ev.RerunLeaseRenewed(rerun_id="run", uuid="rec", runner_id="r1", lease_id="l1",
                                      lease_expires_at=99.0))  # its runner finishes the job
    with pytest.raises(InvalidTransition):  # a cancelling rerun does not fail on a runner's account
        _fold(state, ev.RerunFailed(rerun_id="run", uuid="rec", code="BUILD_FAILED", message="x"))
    _fold(state, ev.RerunReported(rerun_id="run", uuid="rec", runner_id="r1", lease_id="l1", result_sha256="0" * 64,
                                  cases=[{"test_case_id": "n"}], overall={"speedup": 2.0}, env={}, env_changes=[]))
    ran = state.reruns["run"]
    assert ran["status"] == "cancelled" and ran["lease"] is None
    assert ran["result"] == {"runner_id": "r1", "lease_id": "l1", "result_sha256": "0" * 64, "discarded": True}
    assert [h[1] for h in ran["history"]] == ["queued", "running", "cancelling", "cancelled"]

    _fold(state, _ask("gone"), _claim("gone", "l2"), _cancel("gone"),
          ev.RerunReleased(rerun_id="gone", uuid="rec", runner_id="r1", lease_id="l2", reason="x", expired=True))
    assert state.reruns["gone"]["status"] == "cancelled"  # not queued again

    _fold(state, _ask("done"), _claim("done", "l3"),
          ev.RerunReported(rerun_id="done", uuid="rec", runner_id="r1", lease_id="l3", result_sha256="1" * 64,
                           cases=[], overall={}, env={}, env_changes=[]))
    with pytest.raises(InvalidTransition):  # a finished rerun cannot be cancelled
        _fold(state, _cancel("done"))
    assert State.from_json(state.to_json()).reruns == state.reruns


# -- a real zoo over HTTP ------------------------------------------------------------------------

def _kz(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kz_daemon.cli", "rerun", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def _accept(live, anon, *runners) -> str:
    """An accepted record of the Axpy reference, through upload, claim and report (a confirmation run on
    the other runner too, when the zoo asks for one)."""
    resp = live.submit(anon, CPU_AXPY, package_tarball(CPU_AXPY, CPU_AXPY))
    assert resp.status_code == 202, resp.text
    uuid = resp.json()["uuid"]
    for runner in runners:
        claim = runner.post("/api/runner/claim", json={"arch": "cpu", "wait": 10}).json()
        assert claim["uuid"] == uuid
        view = _report(runner, uuid, claim["lease_id"]).json()
        if view["status"] != "queued":  # queued again: the zoo asked for a confirmation run
            break
    assert view["status"] == "accepted", view
    return uuid


def _ask_rerun(admin, uuid: str) -> str:
    resp = admin.post(f"/api/submissions/{uuid}/rerun", json={})
    assert resp.status_code == 202, resp.text
    return resp.json()["rerun_id"]


def _report(runner, job: str, lease_id: str):
    body = {"lease_id": lease_id, "result": result(CPU_AXPY, RUNS[0][1]),
            "logs_b64": base64.b64encode(b"ok").decode(), "env": {}, "failure": None}
    return runner.post(f"/api/submissions/{job}/result", json=body)


def test_cancelling_reruns_through_a_real_zoo_the_cli_and_a_restart(tmp_path):
    live = LiveServer.start(tmp_path, kernels=[CPU_AXPY], runners=("r1", "r2"), settings={"submit_burst": 1000})
    try:
        with live.client() as anon, live.client("runner:r1") as r1, live.client("admin") as admin, \
                live.client("submitter:alice") as alice, live.client("runner:r2") as r2:
            record = _accept(live, anon, r1, r2)

            # cancelled before any runner claims it: never claimed
            early = _ask_rerun(admin, record)
            refused = alice.post(f"/api/reruns/{early}/cancel", json={})
            assert refused.status_code == 403 and refused.json()["error"]["code"] == "FORBIDDEN"
            nobody = anon.post(f"/api/reruns/{early}/cancel", json={})
            assert nobody.status_code == 401 and nobody.json()["error"]["code"] == "UNAUTHORIZED"
            assert reruns.get(live.zoo, early)["status"] == "queued"  # the refusals changed nothing
            cancel = _kz("cancel", early[:8], "--reason", "asked by mistake", "--server", live.url,
                         "--token", live.tokens["admin"])
            assert cancel.returncode == 0, cancel.stderr
            assert f"rerun {early[:8]} of {CPU_AXPY} (record {record[:8]}): cancelled" in cancel.stdout
            assert "CANCELLED: asked by mistake" in cancel.stdout
            claim = r1.post("/api/runner/claim", json={"arch": "cpu", "wait": 0})
            assert claim.status_code == 204, claim.text  # nothing to claim
            again = admin.post(f"/api/reruns/{early}/cancel", json={})
            assert again.status_code == 200 and again.json()["status"] == "cancelled"  # nothing new recorded
            non_admin = _kz("cancel", early, "--server", live.url, "--token", live.tokens["submitter:alice"])
            assert non_admin.returncode == 1 and "FORBIDDEN" in non_admin.stderr

            # cancelled after its runner took it: the runner finishes, its figures are discarded
            late = _ask_rerun(admin, record)
            claim = r1.post("/api/runner/claim", json={"arch": "cpu", "wait": 5}).json()
            assert claim["uuid"] == late
            assert r1.get(f"/api/runner/package/{late}").status_code == 200
            doc = admin.post(f"/api/reruns/{late}/cancel", json={"reason": "wrong host"}).json()
            assert doc["status"] == "cancelling" and not doc["terminal"]
            queued = anon.get("/api/queue").json()["reruns"]  # it still holds its runner
            assert [r["status"] for r in queued if r["rerun_id"] == late] == ["cancelling"]
            renew = r1.post(f"/api/runner/lease/{late}/renew", json={"lease_id": claim["lease_id"]})
            assert renew.status_code == 200, renew.text
            reported = _report(r1, late, claim["lease_id"])
            assert reported.status_code == 200, reported.text
            done = anon.get(f"/api/reruns/{late}").json()
            assert done["status"] == "cancelled" and done["terminal"] and done["discarded"] is True
            assert done["cases"] == [] and done["overall"] is None and done["reason"]["message"] == "wrong host"
            assert _report(r1, late, claim["lease_id"]).status_code == 200  # the same report again: idempotent

            # a rerun that ran to its end cannot be cancelled
            whole = _ask_rerun(admin, record)
            claim = r1.post("/api/runner/claim", json={"arch": "cpu", "wait": 5}).json()
            assert claim["uuid"] == whole and _report(r1, whole, claim["lease_id"]).status_code == 200
            conflict = admin.post(f"/api/reruns/{whole}/cancel", json={})
            assert conflict.status_code == 409 and conflict.json()["error"]["code"] == "CONFLICT"
            unknown = admin.post("/api/reruns/0000dead/cancel", json={})
            assert unknown.status_code == 404

            listed = anon.get("/api/reruns").json()["reruns"]
            assert [r["rerun_id"] for r in listed] == [whole, late, early]  # newest first
            assert [r["status"] for r in listed] == ["done", "cancelled", "cancelled"]
            only = anon.get("/api/reruns", params={"status": "cancelled"}).json()["reruns"]
            assert {r["rerun_id"] for r in only} == {late, early}
            assert anon.get("/api/reruns?status=cancelled&status=done").status_code == 400
            assert anon.get("/api/reruns?status=nope").status_code == 400

        shown = _kz("list", "--server", live.url)
        assert shown.returncode == 0, shown.stderr
        lines = shown.stdout.splitlines()
        assert lines[0].split()[:4] == ["rerun", "record", "kernel", "status"]
        assert lines[1].startswith(whole[:8]) and " done " in lines[1]
        assert lines[2].startswith(late[:8]) and "cancelled (figures discarded)" in lines[2]
        assert lines[3].startswith(early[:8]) and "CANCELLED" in lines[3]
        as_json = _kz("list", "--status", "cancelled", "--json", "--server", live.url)
        assert as_json.returncode == 0 and \
            [r["rerun_id"] for r in json.loads(as_json.stdout)["reruns"]] == [late, early]
        before = {r["rerun_id"]: r for r in reruns.listing(live.zoo)}
    finally:
        live.stop()

    zoo = Zoo(Config.load(live.state_dir))  # the log alone says where each stands
    zoo.start()
    try:
        after = {r["rerun_id"]: r for r in reruns.listing(zoo)}
        assert after == before
        assert after[early]["status"] == "cancelled" and after[late]["discarded"] is True
        assert zoo.claim("r1", "cpu", 0) is None  # the cancelled one stays out of line
    finally:
        zoo.stop()
