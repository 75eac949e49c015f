"""Job execution with real child processes on the misbehaving packages in tests/fixtures/runner/."""
from __future__ import annotations

import os
import re
import tarfile
import time
from pathlib import Path

import pytest

from kz_runner.contract import checks
from kz_runner.worker import job

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "runner"
PREFIX = "cpu/Test/Runner/fp32"


def pack_fixture(name: str, dest_dir: Path, *, with_scorecard: bool = True) -> Path:
    """A runner-style tarball of fixture ``name`` (top-level dir = kernel_id)."""
    kernel_id = f"{PREFIX}/{name}"
    out = dest_dir / f"{name}.tar.gz"
    with tarfile.open(out, "w:gz") as tf:
        for path in sorted((FIXTURES / kernel_id).rglob("*")):
            rel = path.relative_to(FIXTURES / kernel_id)
            if "__pycache__" in rel.parts or (not with_scorecard and rel.name == "bench_result.yaml"):
                continue
            tf.add(path, arcname=f"{kernel_id}/{rel.as_posix()}", recursive=False)
    return out


def run(name: str, tmp_path: Path, **settings) -> job.JobOutcome:
    tarball = pack_fixture(name, tmp_path)
    defaults = dict(runner_id="test-runner", kernel_id=f"{PREFIX}/{name}", kill_grace_s=1.0)
    defaults.update(settings)
    return job.execute_job(tarball, tmp_path / "jobs", job.JobSettings(**defaults))


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_a_good_package_yields_its_document_and_leaves_no_workdir(tmp_path):
    out = run("ok", tmp_path)
    assert out.failure is None and out.failure_code is None
    assert out.result["kernel_id"] == f"{PREFIX}/ok" and out.result["overall"]["accept"] is True
    assert out.result["runner_id"] == "test-runner"
    verdict = checks.check_result(out.result, kernel_id=f"{PREFIX}/ok", case_ids=["tiny"])
    assert verdict.accepted, verdict.problems
    assert set(out.timings) >= {"unpack_s", "build_s", "benchmark_s", "total_s"}
    assert out.kernel_id == f"{PREFIX}/ok" and out.workdir is None
    assert list((tmp_path / "jobs").iterdir()) == []
    assert b"build_test_env.py exited with status 0" in out.logs


def test_build_failure_is_a_synthesized_build_ok_false_document(tmp_path):
    out = run("build_fails", tmp_path)
    assert out.failure_code == job.BUILD_FAILED
    assert "status 3" in out.failure_message
    doc = out.result
    assert doc["overall"] == {"accept": False, "build_ok": False, "accept_reason": doc["overall"]["accept_reason"]}
    assert [c["test_case_id"] for c in doc["cases"]] == ["tiny"]
    assert all(c["correctness"] == "skipped" and c["accept"] is False and c["error"] for c in doc["cases"])
    assert b"BUILD-BROKEN" in out.logs
    # Schema-valid and carrying the METAS case set: the server's verdict is BUILD_FAILED, nothing else.
    verdict = checks.check_result(doc, kernel_id=f"{PREFIX}/build_fails", case_ids=["tiny"])
    assert verdict.codes == ("BUILD_FAILED",)


def test_build_timeout(tmp_path):
    out = run("build_hangs", tmp_path, build_timeout_s=1.5)
    assert out.failure_code == job.BUILD_TIMEOUT and out.result is None
    assert b"build hangs" in out.logs and b"timed out" in out.logs


def host_processes(tag: str) -> list[int]:
    """Live processes of the host whose command line holds ``tag`` (a step's own pids are those of
    its sandbox's pid namespace, so a leftover is found by what it runs)."""
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            if tag.encode() in Path(f"/proc/{name}/cmdline").read_bytes() and _alive(int(name)):
                found.append(int(name))
        except OSError:
            pass
    return found


def leftovers(logs: bytes, key: bytes, timeout: float = 10) -> list[int]:
    """Host pids still running the process a step announced as ``key=<tag>`` in its logs."""
    match = re.search(key + rb"=(kz-leftover-[0-9a-f]+)", logs)
    assert match, logs[-2000:]
    tag = match.group(1).decode()
    deadline = time.monotonic() + timeout
    while host_processes(tag) and time.monotonic() < deadline:
        time.sleep(0.05)
    return host_processes(tag)


def test_benchmark_timeout_kills_the_grandchild_too(tmp_path):
    out = run("bench_hangs_grandchild", tmp_path, benchmark_timeout_s=3.0)
    assert out.failure_code == job.BENCHMARK_TIMEOUT and out.result is None
    assert leftovers(out.logs, b"GRANDCHILD_TAG") == [], "the benchmark's grandchild survived the timeout"


def test_crashing_benchmark(tmp_path):
    out = run("bench_crashes", tmp_path)
    assert out.failure_code == job.BENCHMARK_CRASHED and out.result is None
    assert "status 1" in out.failure_message
    assert b"CRASH-MARKER" in out.logs and b'"schema_version"' in out.logs  # partial stdout kept for the record


def test_junk_on_stdout_is_bad_output_with_the_offending_text_in_the_logs(tmp_path):
    out = run("bench_junk", tmp_path)
    assert out.failure_code == job.BAD_OUTPUT and out.result is None
    assert b"JUNK-MARKER" in out.logs
    assert "JUNK-MARKER" in out.failure_message or "JSON" in out.failure_message


def test_nan_in_the_result_is_bad_output(tmp_path):
    out = run("bench_nan", tmp_path)
    assert out.failure_code == job.BAD_OUTPUT and "NaN" in out.failure_message


def test_stdout_over_the_cap_is_bad_output(tmp_path):
    out = run("stdout_flood", tmp_path, stdout_cap=64 * 1024, log_cap=256 * 1024)
    assert out.failure_code == job.BAD_OUTPUT and "cap" in out.failure_message
    assert len(out.logs) <= 256 * 1024


def test_logs_are_capped_with_a_marker_and_the_run_still_counts(tmp_path):
    out = run("stderr_flood", tmp_path, log_cap=100 * 1024)
    assert out.failure is None and out.result["overall"]["accept"] is True
    assert len(out.logs) <= 100 * 1024
    assert b"truncated" in out.logs


def test_token_never_reaches_the_package(tmp_path, monkeypatch):
    secret = "kzr-SECRET-" + os.urandom(8).hex()
    monkeypatch.setenv("KZ_RUNNER_TOKEN", secret)
    monkeypatch.setenv("KZ_SERVER", "http://127.0.0.1:1")
    monkeypatch.setenv("CUPY_SNEAKY", secret)  # a pass-through prefix carrying the secret is dropped too
    out = run("token_thief", tmp_path, secrets=(secret,))
    assert out.failure is None, out.logs[-3000:]
    assert out.result["overall"]["accept"] is True, out.result["overall"]
    assert secret.encode() not in out.logs
    assert b"THIEF-VERDICT: no credentials found" in out.logs
    assert secret not in repr(job.JobSettings(secrets=(secret,)))


def test_child_env_is_an_allow_list(tmp_path):
    base = {"PATH": "/opt/bin:/usr/bin", "LD_LIBRARY_PATH": "/opt/cuda/lib64", "KZ_RUNNER_TOKEN": "t",
            "AWS_SECRET_ACCESS_KEY": "a", "CREDENTIALS_DIRECTORY": "/run/credentials/x", "HOME": "/root",
            "CUDA_VISIBLE_DEVICES": "0,1", "CUPY_CACHE_DIR": "/var/cache/cupy", "http_proxy": "http://p"}
    env = job.child_env(job.JobSettings(gpu="1", runner_id="r7", arch="sm_90"), tmp_path, base)
    assert env["PATH"] == "/opt/bin:/usr/bin" and env["LD_LIBRARY_PATH"] == "/opt/cuda/lib64"
    assert env["CUPY_CACHE_DIR"] == "/var/cache/cupy"
    assert env["CUDA_VISIBLE_DEVICES"] == env["HIP_VISIBLE_DEVICES"] == "1"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["KZ_RUNNER_ID"] == "r7" and env["KZ_ARCH"] == "sm_90"
    assert env["HOME"] == str(tmp_path / "home") and env["TMPDIR"] == str(tmp_path / "tmp")
    for gone in ("KZ_RUNNER_TOKEN", "AWS_SECRET_ACCESS_KEY", "CREDENTIALS_DIRECTORY", "http_proxy"):
        assert gone not in env
    no_gpu = job.child_env(job.JobSettings(gpu=None), tmp_path, base)
    assert no_gpu["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_the_gpu_selection_reaches_the_steps(tmp_path):
    out = run("token_thief", tmp_path, gpu="3")
    assert b"CUDA_VISIBLE_DEVICES=3" in out.logs and b"HIP_VISIBLE_DEVICES=3" in out.logs


def test_unsafe_or_foreign_tarball_is_unpack_failed(tmp_path):
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tf:
        info = tarfile.TarInfo(f"{PREFIX}/ok/.kernel_package/../../../../../../../etc/passwd")
        tf.addfile(info)
    out = job.execute_job(evil, tmp_path / "jobs", job.JobSettings(kernel_id=f"{PREFIX}/ok"))
    assert out.failure_code == job.UNPACK_FAILED and out.result is None
    wrong = pack_fixture("ok", tmp_path)
    out = job.execute_job(wrong, tmp_path / "jobs", job.JobSettings(kernel_id=f"{PREFIX}/other"))
    assert out.failure_code == job.UNPACK_FAILED and "other" in out.failure_message


def test_cancel_stops_the_running_step(tmp_path):
    import threading

    cancel = threading.Event()
    threading.Timer(1.0, cancel.set).start()
    out = job.execute_job(pack_fixture("bench_hangs_grandchild", tmp_path), tmp_path / "jobs",
                          job.JobSettings(kernel_id=f"{PREFIX}/bench_hangs_grandchild", kill_grace_s=1.0),
                          cancel=cancel)
    assert out.cancelled and out.failure_code == job.CANCELLED


def test_keep_workdir_and_a_read_only_tree_is_still_removed(tmp_path):
    out = run("ok", tmp_path, keep_workdir=True)
    assert out.workdir is not None and (out.workdir / "work" / "build_manifest.json").is_file()
    (out.workdir / "work" / "inputs").chmod(0o500)
    job._rmtree(out.workdir)
    assert not out.workdir.exists()


def test_runner_failure_codes_are_the_wire_codes():
    assert set(job.FAILURE_CODES) - {job.CANCELLED, *job.RUNNER_REFUSALS} == {
        "UNPACK_FAILED", "BUILD_FAILED", "BUILD_TIMEOUT", "BENCHMARK_TIMEOUT", "BENCHMARK_CRASHED", "MEMORY_LIMIT",
        "BAD_OUTPUT", "INTEGRITY_ERROR"}
    # the host's refusals are never reported, but their meaning and fix are in the one code table
    from kz_runner.contract.codes import CODES

    assert set(job.RUNNER_REFUSALS) == {"SANDBOX_UNAVAILABLE", "HARNESS_LIBRARY_CHANGED"} <= set(CODES)


@pytest.mark.gpu
def test_on_a_gpu_host_the_steps_see_exactly_the_runner_gpu(tmp_path):
    """In its sandbox, as the job user: CuPy finds the runner's GPU, one device, and runs a kernel."""
    from kz_runner.contract.arch import detect_arch

    code = ("import cupy, os\nfrom cupy.cuda import runtime\n"
            "x = cupy.arange(1 << 20, dtype=cupy.float32); assert float((x * 2).sum()) == float(x.sum() * 2)\n"
            "print(runtime.getDeviceCount(), os.getuid(), sorted(os.listdir('/dev')))")
    settings = job.JobSettings(gpu="0", arch=detect_arch("0").arch)
    for sub in ("work", "home", "tmp"):
        (tmp_path / sub).mkdir()
    job._hand_over(settings, tmp_path)
    env = job.child_env(settings, tmp_path)
    res = job.run_sandboxed([settings.python, "-c", code], settings, cwd=tmp_path / "home", env=env, timeout_s=300,
                            writable=[tmp_path / "home", tmp_path / "tmp"])
    assert res.ok, res.stderr.decode(errors="replace")
    count, uid, devices = res.stdout.decode().split(" ", 2)
    assert count == "1" and uid == str(settings.containment.uid)
    assert "'nvidia1'" not in devices and ("'nvidia0'" in devices or "'kfd'" in devices), devices
