"""Checks outside the harness process: the sealed build outputs and the harness result channel."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from test_job import PREFIX, pack_fixture

from kz_runner.worker import contain, job, result_channel as channel, seal as integrity


def run(name: str, tmp_path: Path, **settings) -> job.JobOutcome:
    defaults = dict(runner_id="test-runner", kernel_id=f"{PREFIX}/{name}", kill_grace_s=1.0)
    defaults.update(settings)
    return job.execute_job(pack_fixture(name, tmp_path), tmp_path / "jobs", job.JobSettings(**defaults))


def run_channel(mode: str, tmp_path: Path, **settings) -> job.JobOutcome:
    return run("channel", tmp_path, extra_env={"CHANNEL_MODE": mode}, **settings)


# -- the sealed build outputs --------------------------------------------------------------


def test_a_source_area_that_overwrites_the_expected_outputs_is_an_integrity_error(tmp_path):
    # Without a sandbox (the development switch) the step may make the sealed files writable
    # again; the hash check is what catches it. In a sandbox the writes fail (test_runner_containment).
    out = run("tamper_expected", tmp_path, containment=contain.UNCONFINED)
    assert b"TAMPER-DONE" in out.logs
    assert out.failure_code == job.INTEGRITY_ERROR and out.result is None
    assert "changed: expected/tiny_out.json" in out.failure_message
    assert "build_test_env.py produced" in out.failure_message


def test_the_same_package_passes_its_own_comparison_when_nothing_checks_the_files(tmp_path):
    """The control experiment: the tampering fixture really does fool its own benchmark."""
    from kz_runner.worker.procs import run_step

    pkg = tmp_path / "pkg"
    pkg.mkdir()
    import tarfile

    with tarfile.open(pack_fixture("tamper_expected", tmp_path)) as tf:
        tf.extractall(pkg, filter="data")
    root = pkg / PREFIX / "tamper_expected"
    work = tmp_path / "work"
    env = {"PATH": os.environ["PATH"]}
    for script in (job.BUILD_SCRIPT, job.BENCHMARK_SCRIPT):
        res = run_step([job.JobSettings().python, script, str(work)], cwd=root, env=env, timeout_s=60,
                       stdout_cap=1 << 20, stderr_cap=1 << 20)
        assert res.ok, res.stderr
    assert json.loads(res.stdout)["overall"]["accept"] is True


def test_build_outputs_are_read_only_during_the_benchmark_and_timed(tmp_path):
    out = run("ok", tmp_path, keep_workdir=True)
    try:
        assert out.failure is None, out.logs[-2000:]
        work = out.workdir / "work"
        for path in [work / "inputs", work / "inputs" / "tiny_x.npy", work / "build_manifest.json"]:
            assert path.stat().st_mode & 0o222 == 0, path
        facts = out.env["integrity"]
        assert facts["files"] == 3 and facts["bytes"] > 0
        assert facts["hash_s"] >= 0 and facts["verify_s"] >= 0 and facts["workers"] >= 1
    finally:
        job._rmtree(out.workdir)


def test_compare_names_changed_removed_and_added_files_but_allows_new_top_level_files(tmp_path):
    root = tmp_path / "w"
    (root / "inputs").mkdir(parents=True)
    (root / "expected").mkdir()
    (root / "inputs" / "a.npy").write_bytes(b"a" * 3_000_000)
    (root / "expected" / "b.npy").write_bytes(b"b")
    (root / "build_manifest.json").write_text("{}")
    before = integrity.snapshot(root)
    assert before.bytes == 3_000_003 and before.files == 3
    integrity.seal(root)
    assert integrity.compare(before, integrity.snapshot(root)) == []
    for d in (root / "inputs", root / "expected"):
        d.chmod(0o755)
    (root / "inputs" / "a.npy").chmod(0o644)
    with open(root / "inputs" / "a.npy", "r+b") as fh:
        fh.seek(2_999_999)
        fh.write(b"X")
    (root / "expected" / "b.npy").unlink()
    (root / "expected" / "c.npy").write_bytes(b"c")
    (root / "scratch.txt").write_text("a benchmark may write next to the build's files")
    os.symlink("/etc/passwd", root / "inputs" / "link")
    assert integrity.compare(before, integrity.snapshot(root)) == [
        "removed: expected/b.npy", "changed: inputs/a.npy", "added: expected/c.npy", "added: inputs/link"]


def test_a_fifo_among_the_outputs_is_fingerprinted_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    snap = integrity.snapshot(tmp_path)
    assert snap.entries["pipe"].startswith("other:")


# -- the result channel -----------------------------------------------------------------------


def test_a_result_on_the_channel_is_the_result_and_the_seed_is_fresh_per_job(tmp_path):
    first = run_channel("result", tmp_path)
    second = run_channel("result", tmp_path)
    for out in (first, second):
        assert out.failure is None, out.logs[-2000:]
        assert out.env["result_channel"] == "harness"
        assert out.result["overall"]["accept"] is True
    seeds = [int(re.search(rb"TRIAL-SEED=(\d+)", o.logs).group(1)) for o in (first, second)]
    assert seeds[0] != seeds[1] and all(0 <= s < 2 ** 63 for s in seeds)
    # the build step gets neither pipe
    assert b"BUILD-SAW KZ_CONTROL_FD=None KZ_RESULT_FD=None" in first.logs


def test_without_a_channel_document_stdout_is_the_result(tmp_path):
    out = run_channel("stdout", tmp_path)
    assert out.failure is None and out.result["overall"]["accept"] is True
    assert out.env["result_channel"] == "stdout"


def test_an_integrity_document_is_the_failure_with_the_library_code(tmp_path):
    out = run_channel("integrity", tmp_path)
    assert out.failure_code == "TIMED_MISMATCH" and out.result is None
    assert out.failure_message == "timed output differs (case tiny)"
    assert b"max_abs_diff" in out.logs
    assert out.env["result_channel"] == "harness"


def test_stdout_disagreeing_with_the_channel_is_an_integrity_error(tmp_path):
    out = run_channel("disagree", tmp_path)
    assert out.failure_code == job.INTEGRITY_ERROR and out.result is None
    assert out.failure_message == "stdout and the harness's result channel disagree"


def test_junk_on_the_channel_is_an_integrity_error(tmp_path):
    out = run_channel("junk", tmp_path)
    assert out.failure_code == job.INTEGRITY_ERROR and "result channel" in out.failure_message


def test_big_outputs_on_every_channel_at_once_do_not_deadlock(tmp_path):
    out = run_channel("big", tmp_path, benchmark_timeout_s=60, stdout_cap=4 * 1024 * 1024, log_cap=256 * 1024)
    assert out.failure is None, (out.failure, out.logs[-2000:])
    assert out.env["result_channel"] == "harness"
    assert len(out.result["cases"][0]["accept_reason"]) > 512 * 1024
    assert out.log_tails["benchmark"].count("E") <= 8192


@pytest.mark.parametrize("doc, code", [
    ({"kind": "integrity", "code": "NOT_A_CODE", "message": "m"}, "INTEGRITY_ERROR"),
    ({"kind": "integrity", "code": "THREAD_LEAK", "message": "a thread\nsurvived", "case": None}, "THREAD_LEAK"),
    ({"kind": "result", "result": None}, "INTEGRITY_ERROR"),
])
def test_judge_on_odd_channel_documents(doc, code):
    verdict = channel.judge(b"", json.dumps(doc).encode())
    assert verdict.code == code and verdict.result is None and verdict.channel == "harness"
    assert "\n" not in verdict.message


def test_every_library_code_passes_through_unchanged():
    for code in channel.LIBRARY_CODES:
        verdict = channel.judge(b"", json.dumps({"kind": "integrity", "code": code, "message": "m"}).encode())
        assert verdict.code == code
