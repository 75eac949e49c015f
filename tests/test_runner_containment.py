"""Containment of a job's steps, for real: network namespace, unprivileged user, limits.

These tests need root (the runner drops to the job user only as root) and an
interpreter the job user can run: the fixture packages use the standard library
only, so the system's /usr/bin/python3 serves when the project's own interpreter
lives where uid 65534 cannot reach. Each test skips with the reason when the OS
refuses.
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest

from kz_runner.worker import contain
from kz_runner.worker import job
from test_job import PREFIX, pack_fixture

SYSTEM_PYTHON = "/usr/bin/python3"
NAME = "contained"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="containment with a user drop needs a root runner")


@pytest.fixture
def root_dir():
    """A work root the job user can pass through (pytest's own tmp dirs are 0700)."""
    path = Path(tempfile.mkdtemp(prefix="kz-contain-"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _job_python() -> str:
    for candidate in (job.JobSettings().python, SYSTEM_PYTHON):
        spec = contain.spec(contain.Containment(), timeout_s=60, report_fd=None, user=True)
        done = subprocess.run(contain.wrap([candidate, "-c", "pass"], spec), capture_output=True, cwd="/")
        if done.returncode == 0:
            return candidate
    pytest.skip(f"uid {contain.NOBODY} can run neither {job.JobSettings().python} nor {SYSTEM_PYTHON}")


def run(root: Path, tmp_path: Path, probes: dict[str, str], **containment) -> job.JobOutcome:
    settings = job.JobSettings(runner_id="test-runner", kernel_id=f"{PREFIX}/{NAME}", kill_grace_s=1.0,
                               python=_job_python(), extra_env=probes,
                               containment=contain.Containment(**containment))
    out = job.execute_job(pack_fixture(NAME, tmp_path), root / "jobs", settings)
    assert list((root / "jobs").iterdir()) == [], "the job directory was not removed"
    return out


def applied(out: job.JobOutcome) -> dict[str, dict]:
    return {m["measure"]: m for m in out.env["containment"]}


def need(out: job.JobOutcome, measure: str) -> None:
    entry = applied(out).get(measure)
    if entry is None or not entry["applied"]:
        pytest.skip(f"{measure} not applied here: {entry and entry.get('reason')}")


def probe(out: job.JobOutcome, key: str) -> str:
    match = re.search(rb"PROBE-" + key.encode() + rb"=([^\n]*)", out.logs)
    assert match, out.logs[-3000:]
    return match.group(1).decode()


def test_the_build_cannot_reach_a_listener_on_the_hosts_loopback(root_dir, tmp_path):
    accepted = []
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.2)
        stop = threading.Event()

        def accept() -> None:
            while not stop.is_set():
                try:
                    accepted.append(server.accept()[0])
                except OSError:
                    pass

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        try:
            out = run(root_dir, tmp_path, {"PROBE_CONNECT_PORT": str(server.getsockname()[1])})
        finally:
            stop.set()
            thread.join(5)
    need(out, "network namespace")
    assert probe(out, "CONNECT").startswith("refused") and accepted == []
    assert out.failure is None and out.result["overall"]["accept"] is True


def test_the_steps_run_as_the_job_user_and_cannot_read_the_runners_files(root_dir, tmp_path):
    from kz_daemon.config.tokens import ensure_local_tokens

    tokens = ensure_local_tokens(root_dir / "state")  # what `kz up` writes for its runner
    token_file = tokens["runner"]
    st = token_file.stat()
    assert st.st_mode & 0o777 == 0o600 and st.st_uid == os.geteuid()
    (root_dir / "state").chmod(0o755)
    (root_dir / "state" / "tokens").chmod(0o755)  # even reachable, the file itself stays closed
    out = run(root_dir, tmp_path, {"PROBE_SECRET_FILE": str(token_file)})
    need(out, "unprivileged user")
    assert probe(out, "UID") == f"{contain.NOBODY} PROBE-GID={contain.NOBODY}"
    assert probe(out, "SECRET").startswith("denied")
    assert token_file.read_text().strip() not in out.logs.decode(errors="replace")
    assert applied(out)["RLIMIT_NPROC"]["applied"] is True
    assert out.failure is None and out.result["overall"]["accept"] is True


def test_a_process_bomb_is_stopped_and_the_result_still_flows(root_dir, tmp_path):
    out = run(root_dir, tmp_path, {"PROBE_FORKS": "200"}, nproc=40)
    need(out, "unprivileged user")
    verdict = probe(out, "FORKS")
    assert verdict.startswith("stopped at"), verdict
    assert int(verdict.split()[2]) < 40
    assert out.failure is None and out.result["overall"]["accept"] is True


def test_a_file_size_bomb_is_stopped_and_the_result_still_flows(root_dir, tmp_path):
    out = run(root_dir, tmp_path, {"PROBE_WRITE_BYTES": str(8 * 1024 * 1024)}, fsize_bytes=1024 * 1024)
    need(out, "RLIMIT_FSIZE")
    assert probe(out, "WRITE").startswith("stopped") and "too large" in probe(out, "WRITE")
    assert out.failure is None and out.result["overall"]["accept"] is True


def test_sealed_outputs_belong_to_the_runner_so_tampering_fails(root_dir, tmp_path):
    settings = job.JobSettings(runner_id="test-runner", kernel_id=f"{PREFIX}/tamper_expected", kill_grace_s=1.0,
                               python=_job_python(), containment=contain.Containment())
    out = job.execute_job(pack_fixture("tamper_expected", tmp_path), root_dir / "jobs", settings)
    need(out, "unprivileged user")
    assert b"TAMPER-FAILED" in out.logs
    # nothing changed, so the package's own comparison judged the real expectation: wrong output
    assert out.failure is None and out.result["cases"][0]["correctness"] == "failed"


def test_the_steps_import_only_the_staged_harness_library(root_dir, tmp_path):
    out = run(root_dir, tmp_path, {})
    env_line = [m for m in out.env["containment"] if m["measure"] == "staged harness library"]
    assert env_line and env_line[0]["applied"]
    # the steps' PYTHONPATH names the job's lib/ only
    settings = job.JobSettings()
    env = job.child_env(settings, root_dir / "job-x")
    assert env["PYTHONPATH"] == str(root_dir / "job-x" / "lib")


def test_an_unreachable_interpreter_falls_back_with_the_reason_recorded(root_dir, tmp_path):
    hidden = tmp_path / "hidden"  # pytest's tmp dirs are 0700: uid 65534 cannot get in
    hidden.mkdir()
    python = hidden / "python3"
    python.symlink_to(Path(job.JobSettings().python).resolve())
    settings = job.JobSettings(runner_id="test-runner", kernel_id=f"{PREFIX}/{NAME}", kill_grace_s=1.0,
                               python=str(python), containment=contain.Containment())
    out = job.execute_job(pack_fixture(NAME, tmp_path), root_dir / "jobs", settings)
    entry = applied(out)["unprivileged user"]
    assert entry["applied"] is False and f"uid {contain.NOBODY} cannot run" in entry["reason"]
    assert probe(out, "UID").startswith("0 ")
    assert out.failure is None and out.result["overall"]["accept"] is True
