"""Result reports are idempotent by (uuid, lease_id): a runner's retry after a lost answer is
answered with the current view; a different result under the same lease is a CONFLICT; other
runners and other leases still get LEASE_LOST. Service level and through the real HTTP app."""
from __future__ import annotations

import base64
import copy
import hashlib

import pytest

from kz_daemon.core.errors import ZooError
from kz_daemon.ops.runtime import init_state_dir
from kz_daemon.ops.service import Zoo
from tests.helpers.daemon import EXAMPLES, axpy_result, drop_queued_axpy
from tests.helpers.http_server import CPU_AXPY, LiveServer, package_tarball

NEW = "cpu/Elementwise/Axpy/fp32/retry_impl"


@pytest.fixture
def zoo(tmp_path):
    state = tmp_path / "kz"
    state.mkdir()
    (state / "kz.yaml").write_text("queue:\n  lease_seconds: 600\n  reaper_interval_s: 3600\n")
    z = Zoo(init_state_dir(state, seed_from=EXAMPLES))
    z.start()
    yield z
    z.stop()


def queued(zoo, name, kernel_id=NEW):
    return drop_queued_axpy(zoo, kernel_id, name)


def test_repeat_of_an_accepted_report_answers_the_view_and_writes_nothing(zoo):
    sub_uuid = queued(zoo, "a")
    c = zoo.claim("r1", "cpu", 0)
    result = axpy_result(NEW)
    first = zoo.report_result(sub_uuid, "r1", c.lease_id, result, b"first logs", {"n": 1}, None)
    assert first.status == "accepted" and first.commit_sha
    head, seq = zoo.git.head(), zoo.store.seq
    stored = (zoo.config.paths.runs / sub_uuid / "result.json").read_bytes()
    # the retry: same runner, same lease, same result (a copy, as a new request would parse it)
    again = zoo.report_result(sub_uuid, "r1", c.lease_id, copy.deepcopy(result), b"retry logs", {"n": 2}, None)
    assert again.status == "accepted"
    assert (again.commit_sha, again.sha_br) == (first.commit_sha, first.sha_br)
    assert zoo.git.head() == head and zoo.store.seq == seq  # no commit, no event
    assert (zoo.config.paths.runs / sub_uuid / "logs.txt").read_bytes() == b"first logs"
    assert (zoo.config.paths.runs / sub_uuid / "result.json").read_bytes() == stored


def test_repeat_of_a_rejected_report_answers_the_rejection(zoo):
    sub_uuid = queued(zoo, "r")
    c = zoo.claim("r1", "cpu", 0)
    result = axpy_result(NEW, accept=False)
    first = zoo.report_result(sub_uuid, "r1", c.lease_id, result, b"", {}, None)
    assert first.status == "rejected" and first.reasons[0]["code"] == "PACKAGE_REJECTED"
    again = zoo.report_result(sub_uuid, "r1", c.lease_id, result, b"", {}, None)
    assert again.status == "rejected" and again.reasons == first.reasons


def test_repeat_of_a_result_invalid_report_is_not_an_error(zoo):
    sub_uuid = queued(zoo, "i")
    c = zoo.claim("r1", "cpu", 0)
    bad = axpy_result(NEW, accept=False, correctness="failed", case_accept=True)
    with pytest.raises(ZooError) as info:
        zoo.report_result(sub_uuid, "r1", c.lease_id, bad, b"", {}, None)
    assert info.value.code == "RESULT_INVALID"
    again = zoo.report_result(sub_uuid, "r1", c.lease_id, bad, b"", {}, None)
    assert again.status == "rejected"


def test_a_failure_report_repeats_too(zoo):
    sub_uuid = queued(zoo, "f")
    c = zoo.claim("r1", "cpu", 0)
    failure = {"code": "BENCHMARK_CRASHED", "message": "exit 1"}
    assert zoo.report_result(sub_uuid, "r1", c.lease_id, None, b"", {}, failure).status == "rejected"
    assert zoo.report_result(sub_uuid, "r1", c.lease_id, None, b"", {}, failure).status == "rejected"


def test_a_different_result_under_the_same_lease_is_a_conflict(zoo):
    sub_uuid = queued(zoo, "c")
    c = zoo.claim("r1", "cpu", 0)
    result = axpy_result(NEW, latency=1.0)
    first = zoo.report_result(sub_uuid, "r1", c.lease_id, result, b"", {}, None)
    seq = zoo.store.seq
    with pytest.raises(ZooError) as info:
        zoo.report_result(sub_uuid, "r1", c.lease_id, axpy_result(NEW, latency=2.0), b"other", {}, None)
    err = info.value
    assert err.code == "CONFLICT" and err.http_status == 409
    assert "different result" in err.message
    recorded = hashlib.sha256((zoo.config.paths.runs / sub_uuid / "result.json").read_bytes()).hexdigest()
    assert err.details["result_sha256"] == recorded
    assert zoo.store.seq == seq and zoo.submission(sub_uuid).commit_sha == first.commit_sha


def test_other_runners_and_leases_still_lose(zoo):
    sub_uuid = queued(zoo, "o")
    c = zoo.claim("r1", "cpu", 0)
    result = axpy_result(NEW)
    assert zoo.report_result(sub_uuid, "r1", c.lease_id, result, b"", {}, None).status == "accepted"
    for runner, lease in (("r2", c.lease_id), ("r1", "not-the-lease"), ("r1", None)):
        with pytest.raises(ZooError) as info:
            zoo.report_result(sub_uuid, runner, lease, result, b"", {}, None)
        assert info.value.code == "LEASE_LOST", (runner, lease)


def test_a_released_lease_is_not_a_repeat(zoo):
    sub_uuid = queued(zoo, "l")
    old = zoo.claim("r1", "cpu", 0)
    zoo.release(sub_uuid, "r1", old.lease_id, "test")
    new = zoo.claim("r1", "cpu", 0)
    result = axpy_result(NEW)
    assert zoo.report_result(sub_uuid, "r1", new.lease_id, result, b"", {}, None).status == "accepted"
    with pytest.raises(ZooError) as info:  # the same runner, but the lease it lost
        zoo.report_result(sub_uuid, "r1", old.lease_id, result, b"", {}, None)
    assert info.value.code == "LEASE_LOST"


# -- through the real HTTP app under uvicorn -------------------------------------------------

@pytest.fixture
def live(tmp_path):
    server = LiveServer.start(tmp_path, kernels=[CPU_AXPY], settings={"submit_burst": 1000})
    yield server
    server.stop()


def test_http_retry_of_a_result_report(live):
    with live.client("submitter:alice") as anon, live.client("runner:r1") as r1, live.client("runner:r2") as r2:
        resp = live.submit(anon, CPU_AXPY, package_tarball(CPU_AXPY))
        assert resp.status_code == 202, resp.text
        uuid = resp.json()["uuid"]
        claim = r1.post("/api/runner/claim", json={"arch": "cpu", "wait": 10, "host": "t"})
        assert claim.status_code == 200 and claim.json()["uuid"] == uuid, claim.text
        doc = {"lease_id": claim.json()["lease_id"], "result": axpy_result(CPU_AXPY, 5.0),
               "logs_b64": base64.b64encode(b"ok\n").decode(), "env": {"runner": "test"}, "failure": None}
        first = r1.post(f"/api/submissions/{uuid}/result", json=doc)
        assert first.status_code == 200, first.text
        assert first.json()["status"] == "accepted"
        head = live.zoo.git.head()
        # the runner lost the answer and sends the same report again
        again = r1.post(f"/api/submissions/{uuid}/result", json=doc)
        assert again.status_code == 200, again.text
        assert again.json()["status"] == "accepted"
        assert again.json()["commit_sha"] == first.json()["commit_sha"]
        assert live.zoo.git.head() == head
        # another runner, or another lease: LEASE_LOST as before
        stranger = r2.post(f"/api/submissions/{uuid}/result", json=doc)
        assert stranger.status_code in (403, 409) and stranger.json()["error"]["code"] in ("LEASE_LOST", "FORBIDDEN")
        lost = r1.post(f"/api/submissions/{uuid}/result", json=dict(doc, lease_id="unknown"))
        assert lost.status_code == 409 and lost.json()["error"]["code"] == "LEASE_LOST"
        # the same lease with another result: CONFLICT, saying why
        other = r1.post(f"/api/submissions/{uuid}/result", json=dict(doc, result=axpy_result(CPU_AXPY, 6.0)))
        assert other.status_code == 409, other.text
        error = other.json()["error"]
        assert error["code"] == "CONFLICT" and "different result" in error["message"]
        assert live.zoo.git.head() == head
