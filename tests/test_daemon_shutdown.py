"""`kz daemon` (with its HTTP API) as a real process: SIGTERM answers the long polls in progress,
stops within a bound with exit 0, and leaves a state directory that audits clean."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading

import httpx

from kz_daemon.config.tokens import TokenStore
from kz_daemon.ops.repo_audit import audit_state_dir
from kz_daemon.ops.runtime import init_state_dir
from tests.helpers.daemon import EXAMPLES, ROOT, wait_for
from tests.helpers.http_server import CPU_AXPY, package_tarball
from tests.helpers.submissions import logged


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigterm_answers_long_polls_and_exits_cleanly(tmp_path):
    state = tmp_path / "kz"
    state.mkdir()
    port = free_port()
    (state / "kz.yaml").write_text(f"http:\n  host: 127.0.0.1\n  port: {port}\n")
    init_state_dir(state, seed_from=EXAMPLES)
    token = TokenStore(state / "auth.yaml").issue("runner", "r1")
    proc = subprocess.Popen([sys.executable, "-m", "kz_daemon.cli", "daemon", "--state-dir", str(state)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    url = f"http://127.0.0.1:{port}"
    answers: dict[str, object] = {}
    try:
        def ready():
            try:
                return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return proc.poll() is not None  # died: the asserts below say so
        wait_for(ready, timeout=60, interval=0.1)
        assert proc.poll() is None, proc.stdout.read()
        with httpx.Client(base_url=url, timeout=60) as anon:
            sub = anon.post("/api/submissions", headers={"X-Submitter-Id": "alice"},
                            data={"kernel_id": CPU_AXPY, "submitter_id": "alice"},
                            files={"package": ("package.tar.gz", package_tarball(CPU_AXPY), "application/gzip")})
            assert sub.status_code == 202, sub.text
            uuid = sub.json()["uuid"]

        def claim():  # a runner of an arch with no work: waits up to 60 s
            with httpx.Client(base_url=url, timeout=90, headers={"Authorization": f"Bearer {token}"}) as r1:
                answers["claim"] = r1.post("/api/runner/claim", json={"arch": "gfx000", "wait": 60}).status_code

        poller = threading.Thread(target=claim)
        poller.start()
        wait_for(lambda: "r1" in httpx.get(f"{url}/api/queue", timeout=5).json()["runners"], timeout=30)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(30)  # a bound: the shutdown drains, it does not wait out the 60 s poll
        poller.join(30)
        output = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 0, output
    assert answers.get("claim") == 204, (answers, output)
    assert "kz: stopped" in output
    # the submission survived the stop, queued, and the state audits clean
    assert [f for f in audit_state_dir(state) if f.severity == "error"] == []

    assert logged(init_state_dir(state).paths.events)[uuid].status == "queued"
