"""Supervised steps: real child processes, killed as a whole group, output capped."""
from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from kz_runner.worker.procs import run_step

ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is gone for our purposes.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _wait_gone(pid: int, within_s: float = 10.0) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


SPAWN_GRANDCHILD = """
import subprocess, sys, time
g = subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(1)"])
open(sys.argv[1], "w").write(str(g.pid))
print("spawned", flush=True)
while True:
    time.sleep(1)
"""


def test_timeout_kills_the_whole_group_including_a_grandchild(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    argv = [sys.executable, "-c", SPAWN_GRANDCHILD, str(pidfile)]
    res = run_step(argv, cwd=tmp_path, env=ENV, timeout_s=2.0, stdout_cap=1024, stderr_cap=1024, kill_grace_s=1.0)
    assert res.timed_out and not res.ok
    assert res.stdout == b"spawned\n"
    grandchild = int(pidfile.read_text())
    assert _wait_gone(grandchild), "the grandchild outlived the step"


def test_leftover_group_members_are_killed_when_the_leader_exits(tmp_path):
    pidfile = tmp_path / "bg.pid"
    code = (
        "import subprocess, sys\n"
        "g = subprocess.Popen([sys.executable, '-c', 'import time\\nwhile True: time.sleep(1)'],"
        " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        f"open({str(pidfile)!r}, 'w').write(str(g.pid))\n"
    )
    res = run_step(_py(code), cwd=tmp_path, env=ENV, timeout_s=30, stdout_cap=1024, stderr_cap=1024)
    assert res.ok
    assert _wait_gone(int(pidfile.read_text()))


def test_sigterm_ignoring_child_gets_sigkill_after_the_grace(tmp_path):
    code = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\ntime.sleep(60)"
    res = run_step(_py(code), cwd=tmp_path, env=ENV, timeout_s=1.5, stdout_cap=64, stderr_cap=64, kill_grace_s=0.5)
    assert res.timed_out
    assert res.returncode == -9


def test_output_is_capped_and_the_rest_counted_while_the_child_keeps_running(tmp_path):
    code = "import sys\nsys.stdout.write('x' * 300000)\nsys.stderr.write('e' * 200000)\nprint('done', file=sys.stderr)"
    res = run_step(_py(code), cwd=tmp_path, env=ENV, timeout_s=60, stdout_cap=1000, stderr_cap=500)
    assert res.ok
    assert res.stdout == b"x" * 1000 and res.stdout_dropped == 299000
    assert len(res.stderr) == 500 and res.stderr_dropped == 200005 - 500


def test_cancel_event_stops_the_step(tmp_path):
    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()
    res = run_step(_py("import time\ntime.sleep(60)"), cwd=tmp_path, env=ENV, timeout_s=60,
                   stdout_cap=64, stderr_cap=64, kill_grace_s=1.0, cancel=cancel)
    assert res.cancelled and not res.timed_out
    assert res.returncode is not None and res.returncode < 0


def test_cwd_env_and_exit_status_are_those_given(tmp_path):
    code = "import os, sys\nprint(os.getcwd()); print(sorted(os.environ)); sys.exit(3)"
    res = run_step(_py(code), cwd=tmp_path, env={**ENV, "ONLY_THIS": "1"}, timeout_s=60,
                   stdout_cap=4096, stderr_cap=64)
    assert res.returncode == 3 and not res.ok
    lines = res.stdout.decode().splitlines()
    assert Path(lines[0]) == tmp_path
    assert "ONLY_THIS" in lines[1] and "HOME" not in lines[1]


def test_a_command_that_cannot_start_is_a_value(tmp_path):
    res = run_step([str(tmp_path / "missing")], cwd=tmp_path, env=ENV, timeout_s=5, stdout_cap=64, stderr_cap=64)
    assert res.returncode is None and res.start_error
