"""No silent waits: a job no live runner serves says so; the queue shows runners and waiting jobs per arch."""
from __future__ import annotations

import time

import pytest

from kz_daemon.commands.up import arch_warning, example_arches
from tests.helpers.http_server import CPU_AXPY, EXAMPLES, LiveServer, package_tarball


@pytest.fixture()
def live(tmp_path):
    server = LiveServer.start(tmp_path, kernels=[CPU_AXPY], settings={"submit_burst": 1000})
    yield server
    server.stop()


def test_a_job_for_an_arch_no_runner_serves_carries_a_warning(live):
    with live.client() as c, live.client("runner:r1") as r1:
        # a runner of another arch asks for work: it does not serve cpu
        assert r1.post("/api/runner/claim", json={"arch": "gfx942", "wait": 0}).status_code == 204
        posted = live.submit(c, CPU_AXPY, package_tarball(CPU_AXPY))
        assert posted.status_code == 202, posted.text
        assert posted.json()["queue_warning"]["code"] == "NO_RUNNER_FOR_ARCH"
        uuid = posted.json()["uuid"]
        doc = c.get(f"/api/submissions/{uuid}/status").json()
        assert doc["status"] == "queued"
        assert doc["queue_warning"]["code"] == "NO_RUNNER_FOR_ARCH" and "cpu" in doc["queue_warning"]["message"]
        queue = c.get("/api/queue").json()
        assert queue["arches"]["cpu"] == {"runners": 0, "runners_seen": 0, "waiting": 1}
        assert queue["arches"]["gfx942"] == {"runners": 1, "runners_seen": 1, "waiting": 0}


def test_a_live_runner_of_the_arch_clears_the_warning_and_a_silent_one_brings_it_back(live, monkeypatch):
    with live.client() as c, live.client("runner:r1") as r1:
        first = live.submit(c, CPU_AXPY, package_tarball(CPU_AXPY)).json()["uuid"]
        second = live.submit(c, CPU_AXPY, package_tarball(CPU_AXPY)).json()["uuid"]
        claim = r1.post("/api/runner/claim", json={"arch": "cpu", "wait": 5}).json()
        assert claim["uuid"] == first
        doc = c.get(f"/api/submissions/{second}/status").json()
        assert doc["status"] == "queued" and "queue_warning" not in doc
        assert c.get("/api/queue").json()["arches"]["cpu"] == {"runners": 1, "runners_seen": 1, "waiting": 1}
        # the runner has not been heard of for more than two lease periods
        later = time.time() + 2 * live.zoo.config.queue.lease_seconds + 60
        monkeypatch.setattr(live.zoo, "clock", lambda: later)
        doc = c.get(f"/api/submissions/{second}/status").json()
        assert doc["queue_warning"]["code"] == "NO_RUNNER_FOR_ARCH"
        assert c.get("/api/queue").json()["arches"]["cpu"]["runners"] == 0


def test_up_warns_when_the_local_runner_serves_none_of_the_examples():
    arches = example_arches(EXAMPLES)
    assert "cpu" in arches
    assert arch_warning("cpu", arches) is None
    warning = arch_warning("gfx942", arches)
    assert warning and "gfx942" in warning and "cpu" in warning
    assert arch_warning(None, arches) is None
