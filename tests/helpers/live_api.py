"""The HTTP API as its test modules drive it: a module-wide LiveServer, clients per principal, hand-played runner steps.

``live_server(name)`` makes the module-scoped ``live`` fixture (import the result as
``live``); ``anon``, ``r1`` and ``r2`` are per-test clients on it (anonymous, runner r1,
runner r2). ``api_error`` asserts the one error envelope every route answers with.
"""
from __future__ import annotations

import pytest

from tests.helpers.http_server import CPU_AXPY, LiveServer, package_tarball

AXPY_CASES = ("n4k", "n64k", "n1m")


def result_doc(kernel_id: str, latency: float = 10.0, *, accept: bool = True, correctness: str = "passed",
               case_accept: bool | None = None, cases=AXPY_CASES) -> dict:
    """A benchmark_output document for the Axpy example."""
    return {
        "schema_version": "1.0.0", "kernel_id": kernel_id, "ran_at": "2026-11-30T00:00:00Z",
        "runner_id": "r1", "arch": "cpu",
        "overall": {"accept": accept, "accept_reason": "test", "build_ok": True},
        "cases": [{"test_case_id": c, "correctness": correctness,
                   "accept": accept if case_accept is None else case_accept,
                   "accept_reason": "test", "error": None,
                   "metrics": [{"name": "latency_us", "value": latency + i},
                               {"name": "gbps", "value": 1.0 + i}]}
                  for i, c in enumerate(cases)],
    }


def live_server(name: str):
    """The module-scoped ``live`` fixture: one LiveServer (state under a temp folder named ``name``) per test module."""
    @pytest.fixture(scope="module", name="live")
    def live(tmp_path_factory):
        server = LiveServer.start(tmp_path_factory.mktemp(name), settings={"submit_burst": 1000})
        yield server
        server.stop()
    return live


@pytest.fixture()
def anon(live):
    """A client without a token."""
    with live.client() as c:
        yield c


@pytest.fixture()
def r1(live):
    """A client holding runner r1's token."""
    with live.client("runner:r1") as c:
        yield c


@pytest.fixture()
def r2(live):
    """A client holding runner r2's token."""
    with live.client("runner:r2") as c:
        yield c


def api_error(resp, status: int, code: str) -> dict:
    """Assert ``resp`` is the error envelope with ``status`` and ``code``; its ``error`` object."""
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details"}
    assert body["error"]["code"] == code, body
    assert body["error"]["message"]
    return body["error"]


def queue_submission(live, anon, kernel_id=CPU_AXPY, source=CPU_AXPY) -> str:
    """Submit the ``source`` example as ``kernel_id``; the queued submission's uuid."""
    resp = live.submit(anon, kernel_id, package_tarball(kernel_id, source))
    assert resp.status_code == 202, resp.text
    body = resp.json()
    assert body["status"] in ("queued", "running")  # a waiting runner may claim it before the 202
    assert body["status_url"] == f"/api/submissions/{body['uuid']}/status"
    return body["uuid"]


def claim_job(client, uuid: str, wait: float = 5) -> dict:
    """Claim the next cpu job as ``client`` (a runner) and assert it is ``uuid``; the claim."""
    resp = client.post("/api/runner/claim", json={"arch": "cpu", "wait": wait, "host": "test"})
    assert resp.status_code == 200, resp.text
    claim = resp.json()
    assert claim["uuid"] == uuid
    return claim
