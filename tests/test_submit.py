"""`kz submit` as a real subprocess, and the guide's §7 curl line with the real curl binary.

A thread plays the runner over HTTP (claim, package, result) so each verdict is chosen
by the test; tests/test_up.py covers a real `kz runner` process.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from tests.helpers.http_server import CPU_AXPY, EXAMPLES, LiveServer, package_tarball
from tests.helpers.submissions import every
from tests.test_http_api import result_doc

REPO = Path(__file__).resolve().parents[1]
GUIDE_CURL = """curl -X POST {url}/api/submissions \\
  -H "X-Submitter-Id: alice" \\
  -F "kernel_id=$KERNEL_ID" \\
  -F "submitter_id=alice" \\
  -F "package=@package.tar.gz;type=application/gzip"
"""


class PlayRunner(threading.Thread):
    """Claims cpu jobs and reports ``verdicts.pop(0)`` (True accept / False reject) for each."""

    def __init__(self, live: LiveServer) -> None:
        super().__init__(daemon=True)
        self.live = live
        self.verdicts: list[bool] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with self.live.client("runner:r1") as r1:
            while not self.stop.is_set():
                resp = r1.post("/api/runner/claim", json={"arch": "cpu", "wait": 1})
                if resp.status_code != 200:
                    continue
                claim = resp.json()
                r1.get(claim["package_url"])
                accept = self.verdicts.pop(0) if self.verdicts else True
                doc = result_doc(claim["kernel_id"], 12.0, accept=accept, case_accept=accept)
                r1.post(f"/api/submissions/{claim['uuid']}/result",
                        json={"lease_id": claim["lease_id"], "result": doc, "logs_b64": "", "env": {},
                              "failure": None})


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    # alice holds no token here: the guide's anonymous curl line and `kz submit` submit as her
    server = LiveServer.start(tmp_path_factory.mktemp("submit"), kernels=[CPU_AXPY],
                              settings={"submit_burst": 1000}, submitters=())
    runner = PlayRunner(server)
    runner.start()
    server.runner = runner
    yield server
    runner.stop.set()
    runner.join(10)
    server.stop()


def _package_dir(tmp_path: Path) -> Path:
    dest = tmp_path / "work" / CPU_AXPY
    shutil.copytree(EXAMPLES / CPU_AXPY, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def _kz(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("KZ_TOKEN", "KZ_SERVER", "KZ_SUBMITTER")}
    return subprocess.run([sys.executable, "-m", "kz_daemon", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=env)


def test_submit_dir_accepted_prints_table_and_commit(live, tmp_path):
    pkg = _package_dir(tmp_path)
    done = _kz("submit", str(pkg), "--server", live.url, "--submitter", "alice")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"accepted: {CPU_AXPY}")
    assert "n4k" in done.stdout and "latency_us" in done.stdout
    commit = [line for line in done.stdout.splitlines() if line.startswith("commit: ")][0].split()[1]
    assert len(commit) == 40
    assert "queued" in done.stderr or "running" in done.stderr  # the progress display


def test_submit_json_rejected_exits_1(live, tmp_path):
    live.runner.verdicts.append(False)
    pkg = _package_dir(tmp_path)
    done = _kz("submit", str(pkg), "--server", live.url, "--submitter", "bob", "--json")
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    assert doc["status"] == "rejected" and doc["reasons"]


def test_submit_invalid_package_is_refused_locally(live, tmp_path):
    pkg = _package_dir(tmp_path)
    desc_path = pkg / ".kernel_package" / "desc.yaml"
    desc = yaml.safe_load(desc_path.read_text())
    desc["acceptance"] = {"regression_tolerance": 0.05}
    desc_path.write_text(yaml.safe_dump(desc))
    before = len(every(live.zoo.store))
    done = _kz("submit", str(pkg), "--server", live.url, "--json")
    assert done.returncode == 1
    doc = json.loads(done.stdout)
    assert doc["stage"] == "local" and doc["problems"]
    assert len(every(live.zoo.store)) == before  # nothing reached the server


def test_submit_tarball_no_wait(live, tmp_path):
    tarball = tmp_path / "package.tar.gz"
    tarball.write_bytes(package_tarball(CPU_AXPY))
    done = _kz("submit", str(tarball), "--server", live.url, "--submitter", "carol", "--no-wait")
    assert done.returncode == 0, done.stderr
    uuid = done.stdout.strip()
    assert live.zoo.submission(uuid).submitter_id == "carol"


def test_submit_errors_exit_2(tmp_path, live):
    pkg = _package_dir(tmp_path)
    done = _kz("submit", str(pkg), "--server", "http://127.0.0.1:9", "--timeout", "5")
    assert done.returncode == 2 and "kz submit" in done.stderr
    done = _kz("submit", str(tmp_path / "missing"), "--server", live.url)
    assert done.returncode == 2
    done = _kz("submit", str(pkg), "--server", live.url, "--submitter", "not valid!")
    assert done.returncode == 2 and "not a valid submitter id" in done.stderr
    # the server answers a refused upload cleanly (no broken pipe): bad header, body drained
    with live.client() as anon:
        resp = live.submit(anon, CPU_AXPY, b"x" * 200_000, submitter="not valid!")
        assert resp.status_code == 400 and resp.json()["error"]["code"] == "VALIDATION_ERROR"


@pytest.mark.skipif(shutil.which("curl") is None and not os.environ.get("CI"), reason="curl is not installed")
def test_guide_curl_line_unchanged(live, tmp_path):
    (tmp_path / "package.tar.gz").write_bytes(package_tarball(CPU_AXPY))
    script = GUIDE_CURL.format(url=live.url)
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, KERNEL_ID=CPU_AXPY))
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert body["status"] in ("queued", "running", "accepted") and body["submitter_id"] == "alice"
    with live.client() as anon:
        final = anon.get(f"/api/submissions/{body['uuid']}/status", params={"wait": 30}).json()
        while not final["terminal"]:
            final = anon.get(f"/api/submissions/{body['uuid']}/status", params={"wait": 30}).json()
    assert final["status"] == "accepted" and len(final["commit_sha"]) == 40
