"""``kz dry-run``: passes on the CPU examples, fails naming the step on broken packages."""
from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from kz_runner.tools.dryrun import compare_builds, dry_run, render_text

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
CPU_EXAMPLES = sorted(p.parent.parent for p in (EXAMPLES / "cpu").glob("*/*/*/*/.kernel_package/desc.yaml"))
GPU_EXAMPLES = sorted(p.parent.parent for p in EXAMPLES.glob("*/*/*/*/*/.kernel_package/desc.yaml")
                      if p.parts[len(EXAMPLES.parts)] != "cpu")
KID = "cpu/Test/Tiny/fp32/pkg"


def kz(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kz_daemon", *args], capture_output=True, text=True, cwd=ROOT)


@pytest.mark.parametrize("pkg", CPU_EXAMPLES, ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_every_cpu_example_passes(pkg):
    result = dry_run(pkg, build_timeout_s=60, bench_timeout_s=120)
    assert result.ok, render_text(result)
    assert [s.name for s in result.steps] == ["validate", "build-1", "build-2", "idempotency", "benchmark",
                                              "output", "checks", "floor", "verdict"]
    reported = [c["test_case_id"] for c in result.verdict.document["cases"]]
    assert [r["test_case_id"] for r in result.rows] == reported and len(reported) >= 2
    assert all(r["correctness"] == "passed" and r["accept"] and r["value"] > 0 for r in result.rows)


def test_cli_text_and_json():
    pkg = str(CPU_EXAMPLES[0].relative_to(ROOT))
    done = kz("dry-run", pkg)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verdict: PASS" in done.stdout and "latency_us=" in done.stdout
    done = kz("dry-run", "--json", pkg)
    assert done.returncode == 0
    doc = json.loads(done.stdout)
    assert doc["ok"] and doc["failed_step"] is None and doc["result"]["overall"]["accept"]
    assert doc["kernel_id"] == "cpu/Elementwise/Axpy/fp32/numpy_ref"


def test_cli_usage_errors(tmp_path):
    assert kz("dry-run", str(tmp_path / "nope")).returncode == 2
    (tmp_path / "x.zip").write_bytes(b"PK")
    assert kz("dry-run", str(tmp_path / "x.zip")).returncode == 2
    assert kz("dry-run", "--bench-timeout", "0", str(CPU_EXAMPLES[0])).returncode == 2


# --- a tiny package whose scripts each test breaks in one way ---------------------------------

BUILD = '''
import sys
from pathlib import Path
import numpy as np

def build_env(workdir):
    from kz_runner.bench import write_build_manifest
    workdir = Path(workdir)
    (workdir / "inputs").mkdir(parents=True, exist_ok=True)
    (workdir / "expected").mkdir(parents=True, exist_ok=True)
    x = np.arange(8, dtype=np.float32)  # NOISE
    np.save(workdir / "inputs" / "c1_x.npy", x)
    np.save(workdir / "expected" / "c1_out.npy", 2 * x)
    write_build_manifest(workdir, seed=1, test_cases={"c1": {}})

if __name__ == "__main__":
    build_env(Path(sys.argv[1]))  # BUILD_EXIT
'''

BENCH = '''
import sys
from kz_runner import bench

KERNEL_ZOO_TEST_CASE_METAS = [
    {"test_case_id": "c1", "params": {}, "primary_metric": "latency_us",
     "metrics": [{"name": "latency_us", "unit": "us", "direction": "lower_better"}],
     "tolerance": {"correctness_atol": 1e-6, "correctness_rtol": 1e-6}},
]
# PRELUDE

def body(c):
    x = c.input("x")
    c.check(x * 2, c.expected("out"))  # CHECK
    c.metric("latency_us", c.time(lambda: x * 2).median_us)

if __name__ == "__main__":
    h = bench.Harness.from_argv(sys.argv, __file__, KERNEL_ZOO_TEST_CASE_METAS, regression_tolerance=0.5,
                                device="cpu", min_reps=5, budget_s=0.05)
    raise SystemExit(h.run(body))
'''

DESC = '''schema_version: "1.0.0"
name: Tiny test package
category: {arch: cpu, op_class: Test, sub_class: Tiny, quant: fp32}
summary: "doubles a vector"
description: "## Math definition\\nout = 2 x"
io_signature:
  - {name: x, kind: in, dtype: fp32, shape: [8]}
  - {name: out, kind: out, dtype: fp32, shape: [8]}
quantization: {scheme: none}
reference_sources: [src/impl.py]
status: normal
'''

CARD = f'''schema_version: "1.0.0"
kernel_id: {KID}
cases:
  - test_case_id: c1
    metrics_best: {{latency_us: {{value: 0, submitter: seed, commit_sha: "0000000", recorded_at: "2026-01-01T00:00:00Z"}}}}
    metrics_current: {{}}
    correctness_current: unknown
'''


def make_package(tmp_path: Path, build: str = BUILD, benchmark: str = BENCH) -> Path:
    pkg = tmp_path / "repo" / KID
    (pkg / ".kernel_package").mkdir(parents=True)
    (pkg / "src").mkdir()
    (pkg / "src" / "impl.py").write_text("def double(x):\n    return 2 * x\n")
    (pkg / ".kernel_package" / "desc.yaml").write_text(DESC)
    (pkg / ".kernel_package" / "bench_result.yaml").write_text(CARD)
    (pkg / ".kernel_package" / "build_test_env.py").write_text(build)
    (pkg / ".kernel_package" / "benchmark.py").write_text(benchmark)
    return pkg


def failed(result):
    step = next(s for s in result.steps if not s.ok)
    return step


def test_tiny_package_passes(tmp_path):
    result = dry_run(make_package(tmp_path), build_timeout_s=30, bench_timeout_s=30)
    assert result.ok, render_text(result)


def test_invalid_package_fails_at_validate(tmp_path):
    pkg = make_package(tmp_path)
    (pkg / ".kernel_package" / "desc.yaml").unlink()
    result = dry_run(pkg)
    assert result.failed_step == "validate" and len(result.steps) == 1
    assert any(p.code == "FILE_MISSING" for p in result.steps[0].problems)


def test_non_idempotent_build_fails_naming_the_file(tmp_path):
    build = BUILD.replace("x = np.arange(8, dtype=np.float32)  # NOISE",
                          "import os\n    x = np.frombuffer(os.urandom(32), dtype=np.float32)")
    result = dry_run(make_package(tmp_path, build=build))
    step = failed(result)
    assert step.name == "idempotency"
    assert "differs between the two builds" in step.detail and "c1_" in step.detail


def test_build_crash_fails_at_build_1(tmp_path):
    build = BUILD.replace("build_env(Path(sys.argv[1]))  # BUILD_EXIT", "raise SystemExit('no compiler')")
    step = failed(dry_run(make_package(tmp_path, build=build)))
    assert step.name == "build-1" and "exit status 1" in step.detail and "no compiler" in step.stderr_tail


def test_benchmark_printing_junk_fails_at_output(tmp_path):
    bench = BENCH.replace("# PRELUDE", 'print("loading kernels...")')
    result = dry_run(make_package(tmp_path, benchmark=bench))
    step = failed(result)
    assert step.name == "output" and step.problems[0].code == "BAD_OUTPUT"
    assert "loading kernels..." in step.detail
    assert "verdict: FAIL at step output" in render_text(result)


def test_benchmark_crash_fails_at_benchmark(tmp_path):
    bench = BENCH.replace("# PRELUDE", "raise ImportError('cupy missing')")
    step = failed(dry_run(make_package(tmp_path, benchmark=bench)))
    assert step.name == "benchmark" and "exit status 1" in step.detail and "cupy missing" in step.stderr_tail


def test_benchmark_timeout_kills_and_names_the_step(tmp_path):
    bench = BENCH.replace("# PRELUDE", "import time, subprocess, sys as _s\n"
                          "subprocess.Popen([_s.executable, '-c', 'import time; time.sleep(60)'])\n"
                          "time.sleep(60)")
    result = dry_run(make_package(tmp_path, benchmark=bench), bench_timeout_s=1.5)
    step = failed(result)
    assert step.name == "benchmark" and "timed out after 1.5 s" in step.detail
    assert step.seconds < 30


def test_wrong_kernel_id_fails_at_checks(tmp_path):
    bench = BENCH.replace("regression_tolerance=0.5,", "regression_tolerance=0.5, kernel_id='cpu/Test/Tiny/fp32/other',")
    step = failed(dry_run(make_package(tmp_path, benchmark=bench)))
    assert step.name == "checks" and step.problems[0].code == "RESULT_KERNEL_ID"


def test_failed_correctness_fails_at_verdict(tmp_path):
    bench = BENCH.replace('c.check(x * 2, c.expected("out"))  # CHECK', 'c.check(x * 3, c.expected("out"))')
    result = dry_run(make_package(tmp_path, benchmark=bench))
    step = failed(result)
    assert step.name == "verdict" and result.rows[0]["correctness"] == "failed"


def test_a_library_finding_is_printed_whole_with_its_remedy(tmp_path):
    """WEAK_TRIALS's advice comes at the end of a long message: the verdict line keeps it."""
    bench = BENCH.replace("# PRELUDE", "import numpy as np").replace(
        'c.metric("latency_us", c.time(lambda: x * 2).median_us)',
        'c.metric("latency_us", c.time(np.sort, (k,), expected=np.sort(k), reference=np.sort).median_us)').replace(
        'x = c.input("x")', 'x = c.input("x")\n    k = (x * 7).astype(np.int64)')  # integers: only moved
    result = dry_run(make_package(tmp_path, benchmark=bench))
    step = failed(result)
    assert step.name == "verdict" and "WEAK_TRIALS" in step.detail
    verdict = render_text(result).splitlines()[-1]
    assert verdict.startswith("verdict: FAIL at step verdict") and "give vary= that changes the result" in verdict


def test_a_figure_beyond_the_physics_floor_fails_at_the_floor_step(tmp_path):
    """The server's floor, applied locally: 64 bytes cannot move in a femtosecond on any CPU."""
    bench = BENCH.replace('c.metric("latency_us", c.time(lambda: x * 2).median_us)',
                          'c.time(lambda: x * 2)\n    c.metric("latency_us", 1e-9)')
    result = dry_run(make_package(tmp_path, benchmark=bench))
    step = failed(result)
    assert step.name == "floor" and step.problems[0].code == "IMPLAUSIBLE_RESULT", render_text(result)
    assert "below the physics floor" in step.detail and "c1" in step.detail
    assert "verdict: FAIL at step floor" in render_text(result)


def test_a_reject_rule_fails_validate_and_a_hold_rule_is_a_warning(tmp_path):
    pkg = make_package(tmp_path)
    (pkg / "src" / "impl.py").write_text("import threading\n\n\ndef double(x):\n    return 2 * x\n")
    held = dry_run(pkg)
    assert held.ok, render_text(held)  # the server would hold it for an admin: the dry run says so
    rule_warnings = [p for p in held.warnings if p.code != "HARNESS_NOT_JUDGED"]  # this harness imports src/
    assert [(p.code, p.file, p.field) for p in rule_warnings] == [("concurrency", "src/impl.py", "1")]
    verdict = render_text(held).splitlines()[-1]
    assert verdict.startswith("verdict: PASS") and "held for an admin's review on the server: concurrency src/impl.py:1" \
        in verdict
    assert [p["code"] for p in held.to_json()["held"]] == ["concurrency"]
    (pkg / "src" / "impl.py").write_text("import sys\n\n\ndef double(x):\n    sys._getframe(1)\n    return 2 * x\n")
    refused = dry_run(pkg)
    step = failed(refused)
    assert step.name == "validate" and [p.code for p in step.problems] == ["introspection"], render_text(refused)


def test_guide_tarball_is_unpacked_and_seeded(tmp_path):
    pkg = make_package(tmp_path)
    (pkg / ".kernel_package" / "bench_result.yaml").unlink()  # the guide: move it away before packing
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:  # the guide's §5.3 snippet
        tf.add(pkg, arcname=KID)
    tarball = tmp_path / "package.tar.gz"
    tarball.write_bytes(buf.getvalue())
    result = dry_run(tarball)
    assert result.ok, render_text(result)
    assert result.steps[1].name == "unpack" and "seed bench_result.yaml added" in result.steps[1].detail


def test_keep_leaves_the_workdirs(tmp_path):
    result = dry_run(make_package(tmp_path), keep=True)
    try:
        kept = Path(result.workdirs[0])
        assert (kept / "work1" / "build_manifest.json").is_file()
        assert (kept / "work2" / "inputs" / "c1_x.npy").is_file()
    finally:
        shutil.rmtree(result.workdirs[0])


def test_compare_builds_reports_missing_outputs(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    same, detail = compare_builds(tmp_path / "a", tmp_path / "b")
    assert not same and "did not write inputs, expected, build_manifest.json" in detail


@pytest.mark.gpu
@pytest.mark.parametrize("pkg", GPU_EXAMPLES, ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_gpu_examples_pass(pkg):
    result = dry_run(pkg)
    assert result.ok, render_text(result)


# --- --server: judge against the server's current scorecard ----------------------------------

@pytest.fixture(scope="module")
def zoo_server(tmp_path_factory):
    """A real zoo on 127.0.0.1 whose Axpy scorecard records a best (1 us) no CPU run reaches.

    (Faster figures than the physics floor are refused when reported: IMPLAUSIBLE_RESULT.)
    """
    from tests.helpers.daemon import accept_axpy
    from tests.helpers.http_server import CPU_AXPY, LiveServer

    server = LiveServer.start(tmp_path_factory.mktemp("dryrun-server"), kernels=[CPU_AXPY])
    accept_axpy(server.zoo, CPU_AXPY, "fast", latency=1.0)
    yield server
    server.stop()


def test_server_scorecard_decides_the_verdict(zoo_server, tmp_path):
    kid = "cpu/Elementwise/Axpy/fp32/numpy_ref"
    pkg = tmp_path / "checkout" / kid
    shutil.copytree(EXAMPLES / kid, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    own_card = (pkg / ".kernel_package" / "bench_result.yaml").read_bytes()
    local = kz("dry-run", "--json", str(pkg))
    assert local.returncode == 0, local.stdout  # against its own scorecard it passes
    assert json.loads(local.stdout)["judged_against"] is None
    done = kz("dry-run", "--json", "--server", zoo_server.url, str(pkg))
    doc = json.loads(done.stdout)
    assert done.returncode == 1 and doc["failed_step"] == "verdict"  # 10x slower than the server's best
    assert doc["judged_against"] == f"{zoo_server.url}'s current scorecard for {kid}"
    assert not doc["result"]["overall"]["accept"]
    assert (pkg / ".kernel_package" / "bench_result.yaml").read_bytes() == own_card  # ran a copy
    done = kz("dry-run", "--server", zoo_server.url, str(pkg))
    assert f"judged against {zoo_server.url}'s current scorecard for {kid}" in done.stdout


def test_server_without_the_kernel_judges_against_the_seed_and_says_so(zoo_server, tmp_path):
    from tests.helpers.http_server import package_tarball

    kid = "cpu/Elementwise/Axpy/fp32/brand_new"
    tarball = tmp_path / "package.tar.gz"
    tarball.write_bytes(package_tarball(kid, "cpu/Elementwise/Axpy/fp32/numpy_ref"))
    done = kz("dry-run", "--json", "--server", zoo_server.url, "--kernel-id", kid, str(tarball))
    doc = json.loads(done.stdout)
    assert done.returncode == 0, done.stdout
    assert doc["judged_against"].startswith(f"the seed scorecard: {zoo_server.url} has no kernel {kid} (404)")
    assert doc["kernel_id"] == kid


def test_server_that_cannot_be_read_is_a_usage_error():
    done = kz("dry-run", "--server", "http://127.0.0.1:9", str(CPU_EXAMPLES[0]))
    assert done.returncode == 2 and "cannot read the scorecard from http://127.0.0.1:9" in done.stderr


def test_a_kernel_answer_without_bench_result_is_rebuilt_from_the_index_cases():
    from kz_runner.tools.dryrun import scorecard_from_kernel_doc

    best = {"value": 2.5, "submitter": "alice", "commit_sha": "a" * 40, "recorded_at": "2026-01-01T00:00:00Z"}
    doc = {"kernel_id": KID, "bench_result": None,
           "cases": [{"test_case_id": "c1", "primary_metric": "latency_us", "best": best, "current": None,
                      "correctness_current": "passed"}]}
    card, missing = scorecard_from_kernel_doc(doc, KID)
    assert card["cases"] == [{"test_case_id": "c1", "metrics_best": {"latency_us": best}, "metrics_current": {},
                              "correctness_current": "passed"}]
    assert "primary metrics only" in missing
    full = {"kernel_id": KID, "cases": []}
    assert scorecard_from_kernel_doc({"bench_result": full}, KID) == (full, "")
    assert scorecard_from_kernel_doc({"cases": []}, KID)[0] is None
