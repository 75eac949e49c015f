"""`kz up` as a real subprocess on a free port: seeded repo, tokens, a real local runner,
the guide's flow end to end, sd_notify, clean SIGTERM, and a restart that reuses the state."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import uuid as uuidlib
from pathlib import Path

import httpx
import pytest

from kz_daemon.upkeep.sdnotify import socket_address
from tests.helpers.http_server import CPU_AXPY, package_tarball
from tests.helpers.system import pin_confirmation
from tests.test_submit import GUIDE_CURL

REPO = Path(__file__).resolve().parents[1]


class Up:
    """A running `kz up` child with its stdout collected by a reader thread."""

    def __init__(self, state_dir: Path, *extra: str, notify: str | None = None,
                 env_extra: dict[str, str] | None = None) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KZ_", "NOTIFY_SOCKET", "WATCHDOG"))}
        env["PYTHONUNBUFFERED"] = "1"
        env.update(env_extra or {})
        if notify:
            env["NOTIFY_SOCKET"] = notify
            env["WATCHDOG_USEC"] = "400000"  # ping every 0.2 s from the event loop
        Path(state_dir).mkdir(parents=True, exist_ok=True)
        pin_confirmation(state_dir)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kz_daemon", "up", "--state-dir", str(state_dir), "--port", "0", *extra],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.url = ""
        threading.Thread(target=self._read, daemon=True).start()
        if not self.ready.wait(90) or not self.url:
            self.proc.kill()
            raise AssertionError("kz up did not print its URL:\n" + "".join(self.lines))

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            match = re.match(r"kz up: serving (http://\S+)", line)
            if match:
                self.url = match.group(1)
                self.ready.set()
        self.ready.set()  # the process ended (without a URL, __init__ reports its output)

    def output(self) -> str:
        return "".join(self.lines)

    def children(self) -> list[int]:
        path = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        return [int(p) for p in path.read_text().split()] if path.exists() else []

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)


def _alive(pid: int) -> bool:
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat_line.split(") ")[-1][:1] not in ("Z", "X")


@pytest.fixture()
def notify_socket():
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    name = f"@kz-up-test-{uuidlib.uuid4().hex}"
    sock.bind(socket_address(name))
    sock.settimeout(1)
    yield sock, name
    sock.close()


class NotifyListener(threading.Thread):
    """Reads the notify socket all the time, as systemd does."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(daemon=True)
        self.sock = sock
        self.got: list[bytes] = []
        self.changed = threading.Condition()

    def run(self) -> None:
        while True:
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            with self.changed:
                self.got.append(data)
                self.changed.notify_all()

    def wait_for(self, needle: bytes, timeout: float = 30) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: any(needle in m for m in self.got), timeout)


@pytest.mark.slow
def test_up_serves_runs_a_submission_and_stops_cleanly(tmp_path, notify_socket):
    sock, name = notify_socket
    listener = NotifyListener(sock)
    listener.start()
    state = tmp_path / "kz-data"
    up = Up(state, notify=name)
    try:
        assert listener.wait_for(b"READY=1")
        assert listener.wait_for(b"WATCHDOG=1")
        out = up.output()
        assert "kz submit" in out and '-F "package=@package.tar.gz;type=application/gzip"' in out
        assert f"{state}/tokens" in out and "kz runner --arch cpu" in out
        for token in ("runner.token", "admin.token"):
            assert stat.S_IMODE((state / "tokens" / token).stat().st_mode) == 0o600
        assert (state / "repo" / CPU_AXPY / ".kernel_package" / "desc.yaml").exists()
        runner_pids = up.children()
        assert runner_pids, "kz up started no runner child"
        with httpx.Client(base_url=up.url, timeout=60) as client:
            assert client.get("/readyz").status_code == 200
            (tmp_path / "package.tar.gz").write_bytes(package_tarball(CPU_AXPY))
            if shutil.which("curl"):  # the guide's §7 line, word for word but for the server
                done = subprocess.run(["bash", "-c", GUIDE_CURL.format(url=up.url)], cwd=tmp_path,
                                      capture_output=True, text=True, timeout=60,
                                      env=dict(os.environ, KERNEL_ID=CPU_AXPY))
                assert done.returncode == 0, done.stderr
                sub = json.loads(done.stdout)["uuid"]
            else:
                resp = client.post("/api/submissions", headers={"X-Submitter-Id": "alice"},
                                   data={"kernel_id": CPU_AXPY, "submitter_id": "alice"},
                                   files={"package": ("package.tar.gz",
                                                      (tmp_path / "package.tar.gz").read_bytes(),
                                                      "application/gzip")})
                assert resp.status_code == 202, resp.text
                sub = resp.json()["uuid"]
            doc = client.get(f"/api/submissions/{sub}/status", params={"wait": 60}).json()
            while not doc["terminal"]:
                doc = client.get(f"/api/submissions/{sub}/status", params={"wait": 60}).json()
            assert doc["status"] == "accepted", doc
            sha = doc["commit_sha"]
            page = client.get(f"/kernels/{CPU_AXPY}").text
            assert sha[:10] in page and "alice" in page
            queue = client.get("/api/queue").json()
            assert queue["runners"], "the local runner never showed up"
        assert up.stop() == 0
        assert "kz: stopped" in up.output()
        assert listener.wait_for(b"STOPPING=1")
        assert not any(_alive(pid) for pid in runner_pids)
    finally:
        if up.proc.poll() is None:
            up.proc.kill()

    # again, on the same state: reused (same tokens, the accepted commit still there)
    runner_token = (state / "tokens" / "runner.token").read_text()
    again = Up(state, "--no-runner")
    try:
        assert "runner        none (--no-runner)" in again.output()
        assert (state / "tokens" / "runner.token").read_text() == runner_token
        with httpx.Client(base_url=again.url, timeout=30) as client:
            assert client.get(f"/api/submissions/{sub}/status").json()["commit_sha"] == sha
            kernel = client.get(f"/api/kernels/{CPU_AXPY}").json()
            assert kernel["bench_result"]["cases"][0]["metrics_current"]["latency_us"]["commit_sha"] == sha
        assert again.children() == []
        assert again.stop() == 0
    finally:
        if again.proc.poll() is None:
            again.proc.kill()


def test_up_refuses_a_busy_port(tmp_path):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    try:
        done = subprocess.run([sys.executable, "-m", "kz_daemon", "up", "--state-dir", str(tmp_path / "s"),
                               "--port", str(port), "--no-runner"], cwd=REPO, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 2 and "pick another --port" in done.stderr
    finally:
        busy.close()


def test_runner_child_does_not_outlive_a_killed_kz_up(tmp_path):
    up = Up(tmp_path / "kz-data")
    children = up.children()
    assert children
    up.proc.kill()
    up.proc.wait(30)
    deadline = threading.Event()
    for _ in range(300):  # the child gets SIGTERM from the kernel (PR_SET_PDEATHSIG) and stops
        if not any(_alive(pid) for pid in children):
            break
        deadline.wait(0.1)
    assert not any(_alive(pid) for pid in children)


@pytest.mark.slow
def test_sigterm_mid_job_releases_the_lease(tmp_path):
    """Ctrl-C while the local runner works: the runner gives the job back before kz up exits."""
    def slow(files: dict) -> None:
        # the source area only (the harness files of an existing kernel are locked): benchmark.py
        # imports src/axpy.py, which now takes two minutes to import
        future = b"from __future__ import annotations\n"
        assert future in files["src/axpy.py"]
        files["src/axpy.py"] = files["src/axpy.py"].replace(future, future + b"import time\n\ntime.sleep(120)\n", 1)

    state = tmp_path / "kz-data"
    up = Up(state)
    try:
        with httpx.Client(base_url=up.url, timeout=60) as client:
            resp = client.post("/api/submissions", headers={"X-Submitter-Id": "alice"},
                               data={"kernel_id": CPU_AXPY, "submitter_id": "alice"},
                               files={"package": ("package.tar.gz", package_tarball(CPU_AXPY, mutate=slow),
                                                  "application/gzip")})
            assert resp.status_code == 202, resp.text
            sub = resp.json()["uuid"]
            doc = client.get(f"/api/submissions/{sub}/status").json()
            while doc["status"] != "running":
                doc = client.get(f"/api/submissions/{sub}/status", params={"wait": 30}).json()
        assert up.stop() == 0
    finally:
        if up.proc.poll() is None:
            up.proc.kill()
    again = Up(state, "--no-runner")
    try:
        with httpx.Client(base_url=again.url, timeout=30) as client:
            doc = client.get(f"/api/submissions/{sub}/status").json()
        assert doc["status"] == "queued" and doc["attempts"] == 1, doc
        assert again.stop() == 0
    finally:
        if again.proc.poll() is None:
            again.proc.kill()
