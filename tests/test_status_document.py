"""The status document's fix hints for every code, and the POST answer's documented status."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kz_daemon.core.hints import hint_for, with_hint
from kz_runner.contract import checks
from kz_runner.contract.codes import CODES
from kz_runner.worker import job, result_channel as channel
from tests.helpers.http_server import CPU_AXPY, LiveServer, package_tarball

ROOT = Path(__file__).resolve().parents[1]
#: codes the runner's harness checks and the confirmation run add to the failure codes
LISTED = ("TIMER_TAMPERED", "UNSYNCED_WORK", "THREAD_LEAK", "OUTPUT_TYPE", "STALE_OUTPUT", "TIMED_MISMATCH",
          "WEAK_TRIALS", "HARNESS_ERROR", "INTEGRITY_ERROR", "HARNESS_LOCKED", "IMPLAUSIBLE_RESULT", "RULE_VIOLATION",
          "CONFIRMATION_MISMATCH", "BAD_OUTPUT", "BUILD_FAILED", "RUNNER_FAILURE", "PACKAGE_REJECTED")


def _literal_reason_codes() -> set[str]:
    """Reason codes written as literals where the daemon and the reducer make reasons.

    ``reject(kernel_id, "CODE", ...)`` (intake), ``code="CODE"`` keywords of the events
    (``submission.rejected``, ``job.failed``) and ``{"code": "CODE"}`` reason entries of the fold.
    """
    found: set[str] = set()
    files = sorted((ROOT / "kz_daemon").rglob("*.py")) + [ROOT / "kz_events" / "reducer.py"]
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name == "reject" and len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
                    found.add(node.args[1].value)
                if name == "rejecting" and node.args and isinstance(node.args[0], ast.Constant):  # Verdict's
                    found.add(node.args[0].value)
                if name in ("SubmissionRejected", "JobFailed"):
                    for kw in node.keywords:
                        if kw.arg == "code" and isinstance(kw.value, ast.Constant):
                            found.add(kw.value.value)
            if isinstance(node, ast.Dict) and path.name == "reducer.py":
                for key, value in zip(node.keys, node.values):
                    if isinstance(key, ast.Constant) and key.value == "code" and isinstance(value, ast.Constant) \
                            and isinstance(value.value, str):
                        found.add(value.value)
    return found


def emittable_codes() -> set[str]:
    """Every code a ``reasons[]`` entry can carry."""
    return (set(CODES) | set(checks.CODES) | set(job.FAILURE_CODES) | set(channel.LIBRARY_CODES) | set(LISTED)
            | _literal_reason_codes())


def test_the_walk_finds_the_daemons_own_codes():
    literal = _literal_reason_codes()
    assert {"PACKAGE_FROZEN", "NEW_PACKAGE_NOT_ALLOWED", "ATTEMPTS_EXHAUSTED", "CANCELLED", "ROLLED_BACK"} <= literal


@pytest.mark.parametrize("code", sorted(emittable_codes()))
def test_every_code_the_daemon_can_emit_has_a_hint(code):
    hint = hint_for(code)
    assert hint.strip(), code


def test_contract_codes_get_the_same_hint_as_dry_run():
    for code, info in CODES.items():
        assert hint_for(code) == info.hint
    for code, hint in checks.HINTS.items():
        assert hint_for(code) == hint


def test_a_reason_keeps_its_own_hint_or_its_problems():
    assert with_hint({"code": "BUILD_FAILED", "hint": "mine"})["hint"] == "mine"
    reason = {"code": "DESC_SCHEMA", "details": {"problems": [{"code": "DESC_SCHEMA", "hint": "fix summary"}]}}
    assert with_hint(reason)["hint"] == "fix summary"


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    server = LiveServer.start(tmp_path_factory.mktemp("statusdoc"), kernels=[CPU_AXPY],
                              settings={"submit_burst": 1000})
    yield server
    server.stop()


def test_intake_rejection_reasons_carry_the_contracts_hint(live):
    with live.client() as c:
        resp = live.submit(c, CPU_AXPY, package_tarball(CPU_AXPY, include_bench_result=True))
        assert resp.status_code == 400, resp.text
        details = resp.json()["error"]["details"] if "error" in resp.json() else resp.json()["details"]
        reason = details["reasons"][0]
        assert reason["code"] == "BENCH_RESULT_IN_TARBALL"
        assert reason["hint"] == CODES["BENCH_RESULT_IN_TARBALL"].hint
        doc = c.get(details["status_url"]).json()
        assert doc["reasons"][0]["hint"] == CODES["BENCH_RESULT_IN_TARBALL"].hint


def test_runner_failure_reasons_carry_a_hint_over_http(live):
    with live.client() as c, live.client("runner:r1") as r1:
        uuid = live.submit(c, CPU_AXPY, package_tarball(CPU_AXPY)).json()["uuid"]
        claim = r1.post("/api/runner/claim", json={"arch": "cpu", "wait": 5}).json()
        assert claim["uuid"] == uuid
        answer = r1.post(f"/api/submissions/{uuid}/result",
                         json={"lease_id": claim["lease_id"], "result": None, "logs_b64": "", "env": {},
                               "failure": {"code": "TIMER_TAMPERED", "message": "perf_counter was replaced"}})
        assert answer.status_code == 200, answer.text
        doc = c.get(f"/api/submissions/{uuid}/status").json()
        assert doc["status"] == "rejected"
        assert doc["reasons"][0]["code"] == "TIMER_TAMPERED"
        assert doc["reasons"][0]["hint"] == hint_for("TIMER_TAMPERED")


def test_post_answers_queued_even_when_a_runner_claimed_the_job_first(live, monkeypatch):
    """A runner long-polling for work can take the job before the POST answers: still ``queued``."""
    zoo = live.zoo
    real_wait = zoo.wait_intake

    def runner_wins_the_race(uuid, timeout):
        real_wait(uuid, timeout)
        got = zoo.claim("r2", "cpu", 0)
        assert got is not None and got.uuid == uuid
        return zoo.submission(uuid)

    monkeypatch.setattr(zoo, "wait_intake", runner_wins_the_race)
    with live.client() as c:
        resp = live.submit(c, CPU_AXPY, package_tarball(CPU_AXPY))
        assert resp.status_code == 202, resp.text
        assert resp.json()["status"] == "queued"
        assert c.get(resp.json()["status_url"]).json()["status"] == "running"
    monkeypatch.undo()
    with live.client("submitter:alice") as c:  # alice holds a token: only it cancels her submissions
        c.post(f"/api/submissions/{resp.json()['uuid']}/cancel", json={})


def test_the_runner_reads_every_code_the_bench_library_reports():
    from kz_runner.bench import integrity

    assert tuple(integrity.CODES) == channel.LIBRARY_CODES
