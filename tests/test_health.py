"""What /healthz and /readyz report, and how the operator hears about a stalled accept saga."""
from __future__ import annotations

import sys

from kz_daemon.accept import saga as accept
from kz_daemon.ops.recovery import StallLog
from kz_daemon.upkeep.supervise import Supervisor
from tests.helpers.daemon import wait_for
from tests.helpers.http_server import CPU_AXPY, LiveServer
from tests.test_recovery import accept_halted_at, config, recovering  # noqa: F401 (config is a fixture)


def test_ready_lists_every_check_and_a_crash_looping_runner_makes_it_503(tmp_path):
    server = LiveServer.start(tmp_path, kernels=[CPU_AXPY])
    sup = Supervisor([sys.executable, "-c", "raise SystemExit(7)"],
                     first_backoff_s=0.05, max_backoff_s=0.1, crash_limit=3)
    try:
        with server.client() as http:
            ready = http.get("/readyz")
            assert ready.status_code == 200
            assert set(ready.json()["checks"]) == {"daemon", "store", "disk"}
            assert ready.json()["checks"]["store"]["seq"] == server.zoo.store.health()["seq"]
            server.app.state.runner_supervisor = sup.start()
            wait_for(lambda: sup.crash_looping())
            ready = http.get("/readyz")
            assert ready.status_code == 503 and ready.json()["error"]["code"] == "UNAVAILABLE"
            details = ready.json()["error"]["details"]
            assert any(r.startswith("runner:") for r in details["reasons"])
            assert details["checks"]["runner"]["last_exit"] == 7
            assert http.get("/healthz").status_code == 200  # a dying runner does not make the daemon dead
    finally:
        sup.stop(5)
        server.stop()


def test_a_draining_server_is_not_ready(tmp_path):
    server = LiveServer.start(tmp_path, kernels=[CPU_AXPY])
    try:
        with server.client() as http:
            server.app.state.draining.set()
            ready = http.get("/readyz")
            assert ready.status_code == 503
            assert ready.json()["error"]["details"]["checks"]["daemon"]["ok"] is False
    finally:
        server.stop()


def test_stall_log_says_the_first_failure_then_once_a_minute_with_a_count():
    lines: list[str] = []
    now = [0.0]
    stalls = StallLog(lines.append, every_s=60.0, clock=lambda: now[0])
    for _ in range(30):  # the reaper's one-second retries for half a minute
        stalls.failed("u1", "accept saga of u1 stopped half-way")
        now[0] += 1.0
    assert lines == ["accept saga of u1 stopped half-way"]
    now[0] = 61.0
    assert stalls.failed("u1", "accept saga of u1 stopped half-way")
    assert lines[-1] == "accept saga of u1 stopped half-way (failed 30 times in the last 61 s)"
    stalls.finished("u1")
    assert lines[-1] == "accept saga of u1 finished after it had stalled"
    assert stalls.failed("u1", "again")  # a new stall is told at once


def test_a_stalled_saga_retried_every_second_logs_once(config, monkeypatch, caplog):  # noqa: F811
    sub_uuid, _base = accept_halted_at(config, monkeypatch, "after_source_event")
    (config.paths.runs / sub_uuid / "result.json").unlink()  # the scorecard cannot be written without it
    caplog.clear()
    with recovering(config) as (zoo, _report, _seq):  # recovery's own try is the first failure
        for _ in range(20):
            assert accept.finish_saga(zoo, sub_uuid) == "pending"
        lines = [r for r in caplog.records if f"accept saga of {sub_uuid} stopped half-way" in r.getMessage()]
    assert len(lines) == 1, caplog.text
    assert lines[0].levelname == "WARNING" and lines[0].name == "kz_daemon.ops.service"
