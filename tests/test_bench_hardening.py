"""kz_runner.bench against cheating packages: each library-layer cheat is stopped with its code.

Every cheat's real harness runs as the runner runs it (``python benchmark.py workdir``
after ``build_test_env.py``), once with the runner's control/result pipes and once
without them (stdout only). The honest examples must pass both ways.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from kz_runner import bench
from kz_runner.bench import integrity, trials
from kz_runner.bench.timing import UNSYNCED_FLOOR_US, _GpuClock
from kz_runner.contract.validate import validate_package_dir
from tests.helpers.cheats import _CHEATS as CHEAT_TABLE, AXPY, EXAMPLES, GPU_AXPY, SOFTMAX, Cheat, cheat_packages

ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KZ_")}
    env["PYTHONPATH"] = str(ROOT)
    return env


def run_benchmark(pkg: Path, workdir: Path, *, seed: int | None = 12345, control: bytes | None = None,
                  timeout: float = 300) -> tuple[subprocess.CompletedProcess, bytes | None]:
    """Run the package's harness; with ``seed`` (or raw ``control``) through the runner's two pipes."""
    cmd = [sys.executable, str(pkg / ".kernel_package" / "benchmark.py"), str(workdir)]
    env = _env()
    if seed is None and control is None:
        done = subprocess.run(cmd, capture_output=True, env=env, timeout=timeout, cwd=workdir.parent)
        return done, None
    c_read, c_write = os.pipe()
    r_read, r_write = os.pipe()
    os.write(c_write, control if control is not None else json.dumps({"trial_seed": seed}).encode() + b"\n")
    os.close(c_write)
    env.update(KZ_CONTROL_FD=str(c_read), KZ_RESULT_FD=str(r_write))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=workdir.parent,
                            pass_fds=(c_read, r_write))
    os.close(c_read)
    os.close(r_write)
    with os.fdopen(r_read, "rb") as result:
        out, err = proc.communicate(timeout=timeout)
        channel_data = result.read()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), channel_data


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """One built workdir per example (copied before each run, since a cheat may change it)."""
    out = {}
    for kernel_id in (AXPY, SOFTMAX):
        work = tmp_path_factory.mktemp("built") / "work"
        work.mkdir()
        subprocess.run([sys.executable, str(EXAMPLES / kernel_id / ".kernel_package" / "build_test_env.py"),
                        str(work)], check=True, env=_env(), capture_output=True)
        out[kernel_id] = work
    return out


@pytest.fixture(scope="module")
def cheats(tmp_path_factory) -> dict[str, Cheat]:
    return {c.name: c for c in cheat_packages(tmp_path_factory.mktemp("cheats"))}


def _example_of(cheat: Cheat) -> str:
    return AXPY if "/Axpy/" in cheat.path.as_posix() else SOFTMAX


def _fresh_workdir(built: dict[str, Path], kernel_id: str, tmp_path: Path) -> Path:
    work = tmp_path / "work"
    shutil.copytree(built[kernel_id], work)
    return work


def _library_names() -> list[str]:
    return [name for name, _p, _e, _f, code, layer, _s in CHEAT_TABLE if layer == "library" and code]


@pytest.mark.parametrize("name", _library_names())
@pytest.mark.parametrize("pipes", [True, False], ids=["pipes", "stdout"])
def test_library_cheat_is_stopped_with_its_code(name, pipes, cheats, built, tmp_path):
    cheat = cheats[name]
    work = _fresh_workdir(built, _example_of(cheat), tmp_path)
    done, channel_data = run_benchmark(cheat.path, work, seed=987654321 if pipes else None)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    doc = json.loads(done.stdout)  # stdout still carries exactly one benchmark output
    assert doc["overall"]["accept"] is False
    # a forged clock is TIMER_TAMPERED; on a host so loaded that the worker's wait for a CPU explains the
    # missing time, the judge voids the timing (MACHINE_BUSY) instead: never a pass either way
    allowed = {cheat.expected_code} | ({"MACHINE_BUSY"} if cheat.expected_code == "TIMER_TAMPERED" else set())
    assert doc["overall"]["accept_reason"].split(":")[0] in allowed, doc["overall"]["accept_reason"]
    assert not any(c["accept"] for c in doc["cases"])
    if pipes:
        sent = json.loads(channel_data)
        assert sent["kind"] == "integrity" and sent["code"] in allowed, sent
        assert sent["case"] in {c["test_case_id"] for c in doc["cases"]}
        assert isinstance(sent["evidence"], dict) and "\n" not in sent["message"]
    else:
        assert channel_data is None


@pytest.mark.parametrize("kernel_id", [AXPY, SOFTMAX])
def test_honest_example_passes_with_the_runners_pipes(kernel_id, built, tmp_path):
    work = _fresh_workdir(built, kernel_id, tmp_path)
    done, channel_data = run_benchmark(EXAMPLES / kernel_id, work, seed=2**63 - 1)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    sent = json.loads(channel_data)
    assert sent["kind"] == "result" and sent["result"]["overall"]["accept"] is True, sent
    stdout_doc = json.loads(done.stdout)
    assert stdout_doc["overall"] == sent["result"]["overall"] and stdout_doc["cases"] == sent["result"]["cases"]
    timings = [json.loads(line.split(b"timing ", 1)[1]) for line in done.stderr.splitlines() if b"] timing {" in line]
    # timed by the judge: batches of calls in a worker process, a sample of them compared
    assert len(timings) == 3 and all(t["checked_calls"] >= 1 and t["judge"]["batches"] >= 8 for t in timings)


def test_honest_examples_pass_under_many_seeds(built, tmp_path):
    """No false reject from the trial inputs or the check schedule: several seeds, both examples."""
    for i, seed in enumerate((0, 1, 7, 2**40 + 3)):
        for kernel_id in (AXPY, SOFTMAX):
            work = tmp_path / f"w{i}_{kernel_id.split('/')[2]}"
            shutil.copytree(built[kernel_id], work)
            done, channel_data = run_benchmark(EXAMPLES / kernel_id, work, seed=seed)
            sent = json.loads(channel_data)
            assert sent["kind"] == "result" and sent["result"]["overall"]["accept"], (seed, kernel_id, sent)


def _run_accepted_cache_cheat(cheats, built, tmp_path, name: str, seed: int) -> bytes:
    """Run a softmax cache cheat (correct on every call, so accepted); returns its stderr."""
    cheat = cheats[name]
    assert cheat.layer == "library" and cheat.expected_code is None
    work = _fresh_workdir(built, SOFTMAX, tmp_path)
    done, channel_data = run_benchmark(cheat.path, work, seed=seed)
    sent = json.loads(channel_data)
    assert sent["kind"] == "result" and sent["result"]["overall"]["accept"] is True, sent
    return done.stderr


def _rows_reused(stderr: bytes) -> tuple[int, int]:
    """(rows reused, rows seen) as a row-cache cheat printed them at exit."""
    found = re.search(rb"row cache: (\d+) of (\d+) rows reused", stderr)
    assert found and int(found[2]) > 1000, stderr.decode()[-2000:]
    return int(found[1]), int(found[2])


def test_a_cache_keyed_on_the_inputs_content_never_hits(cheats, built, tmp_path):
    """Every call gets inputs no earlier call had, so even a cache keyed on all of their bytes is useless."""
    stderr = _run_accepted_cache_cheat(cheats, built, tmp_path, "cache_by_content", seed=24680)
    assert b"content cache: 0 hits" in stderr, stderr.decode()[-2000:]


def test_no_row_of_the_first_calls_inputs_is_found_in_place_again(cheats, built, tmp_path):
    """A fresh content that left a block where it was handed a row cache about a quarter of the rows."""
    stderr = _run_accepted_cache_cheat(cheats, built, tmp_path, "reuse_unmoved_rows", seed=13579)
    assert _rows_reused(stderr)[0] == 0


def test_no_row_an_earlier_call_had_is_found_again_anywhere(cheats, built, tmp_path):
    """Moved blocks carry windows of the base rows whose shifts repeat across calls: a cache keyed on
    each row's bytes reused 31-40 % of the rows until every float element got its own factor per call."""
    stderr = _run_accepted_cache_cheat(cheats, built, tmp_path, "reuse_seen_rows", seed=13579)
    assert _rows_reused(stderr)[0] == 0


def test_overwriting_expected_files_fails_where_the_kernel_runs_apart_from_them(cheats, built, tmp_path):
    """The kernel runs in the judge's worker, whose argv and view hold no workdir: it cannot reach the
    inputs or expected outputs to rewrite them (the runner's seal of the built files stays the check
    for a harness run unverified), and its zeros fail the case's correctness check."""
    cheat = cheats["overwrite_expected"]
    assert cheat.layer == "runner" and cheat.expected_code == "INTEGRITY_ERROR"
    work = _fresh_workdir(built, AXPY, tmp_path)
    manifest = json.loads((work / "build_manifest.json").read_text())
    done, _channel = run_benchmark(cheat.path, work)
    changed = [p for p, sha in manifest["files"].items()
               if hashlib.sha256((work / p).read_bytes()).hexdigest() != sha]
    assert changed == []
    doc = json.loads(done.stdout)
    assert not doc["overall"]["accept"] and all(c["correctness"] == "failed" for c in doc["cases"])


def test_a_fake_stdout_document_cannot_replace_the_channels_result(cheats, built, tmp_path):
    cheat = cheats["fake_stdout"]
    work = _fresh_workdir(built, AXPY, tmp_path)
    done, channel_data = run_benchmark(cheat.path, work)
    sent = json.loads(channel_data)
    assert sent["kind"] == "result"
    latencies = [m["value"] for c in sent["result"]["cases"] for m in c["metrics"] if m["name"] == "latency_us"]
    assert latencies and min(latencies) > 0.001  # the genuine measurement, not the fake's
    stdout_docs = [line for line in done.stdout.splitlines() if line.strip()]
    assert len(stdout_docs) == 1  # the kernel's worker writes its stdout to the benchmark's stderr
    fakes = done.stderr.count(b'"accept_reason": "fake"')
    assert fakes >= 2 and fakes % 2 == 0  # each worker's import-time and exit-time fakes, all on stderr


def test_a_replaced_harness_still_validates_so_only_the_harness_lock_stops_it(cheats):
    cheat = cheats["harness_replacing"]
    assert cheat.layer == "daemon"
    original = (EXAMPLES / AXPY / ".kernel_package" / "benchmark.py").read_bytes()
    assert (cheat.path / ".kernel_package" / "benchmark.py").read_bytes() != original
    assert validate_package_dir(cheat.path).valid


def test_a_kernel_that_reaches_for_the_harness_state_finds_none_and_the_rules_still_reject_it(cheats, built,
                                                                                           tmp_path):
    """In the judge's worker the stack holds no harness object to reach (the judge's process never runs the
    kernel), so the walk finds nothing and the kernel computes; the static rule still rejects the attempt."""
    cheat = cheats["harness_reach"]
    assert cheat.layer == "rules"
    work = _fresh_workdir(built, SOFTMAX, tmp_path)
    done, channel_data = run_benchmark(cheat.path, work, seed=4242)
    sent = json.loads(channel_data)
    assert sent["kind"] == "result" and sent["result"]["overall"]["accept"] is True, sent  # honest outputs
    report = validate_package_dir(cheat.path, rules=True)  # what kz validate and intake apply
    problems = [p for p in report.problems if p.code == "introspection"]
    assert not report.valid and problems and all(p.severity == "error" for p in problems), report.problems
    lines = (cheat.path / "src" / "softmax.py").read_text().splitlines()
    reaching = {str(n) for n, line in enumerate(lines, 1)
                if any(name in line for name in ("_getframe", "f_back", "f_locals"))}
    assert {p.field for p in problems if p.file == "src/softmax.py"} == reaching, problems


def test_every_cheat_names_a_layer_and_a_package(cheats):
    assert {c.layer for c in cheats.values()} == {"library", "gpu", "runner", "daemon", "rules"}
    for c in cheats.values():
        assert (c.path / ".kernel_package" / "benchmark.py").is_file() and c.pattern
        assert c.expected_code is None or c.expected_code in integrity.CODES + ("INTEGRITY_ERROR", "RULE_VIOLATION")


def test_a_malformed_control_message_is_a_harness_error(built, tmp_path):
    work = _fresh_workdir(built, SOFTMAX, tmp_path)
    done, channel_data = run_benchmark(EXAMPLES / SOFTMAX, work, control=b'{"trial_seed": -4}')
    sent = json.loads(channel_data)
    assert sent["kind"] == "integrity" and sent["code"] == "HARNESS_ERROR" and "trial_seed" in sent["message"]
    assert json.loads(done.stdout)["overall"]["accept_reason"].startswith("HARNESS_ERROR")


def test_the_pipes_are_consumed_and_hidden_at_import(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(
        "import os, json\n"
        "from kz_runner.bench import channel\n"
        "fd = int(os.environ.get('SAVED_RESULT_FD'))\n"
        "print(json.dumps({'seed': channel.trial_seed(), 'env': sorted(k for k in os.environ if k.startswith('KZ_')),\n"
        "                  'inheritable': os.get_inheritable(fd)}))\n")
    c_read, c_write = os.pipe()
    r_read, r_write = os.pipe()
    os.write(c_write, b'{"trial_seed": 424242}\n')
    os.close(c_write)
    env = dict(_env(), KZ_CONTROL_FD=str(c_read), KZ_RESULT_FD=str(r_write), SAVED_RESULT_FD=str(r_write))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, env=env, pass_fds=(c_read, r_write))
    os.close(c_read)
    os.close(r_write)
    os.close(r_read)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"seed": 424242, "env": [], "inheritable": False}


# -- the pieces, in process ---------------------------------------------------------------


def test_output_buffers_are_poisoned_before_every_call():
    seen = []

    def fn(x, out):
        seen.append(bool(np.isnan(out).all()))
        np.multiply(x, 2, out=out)

    x = np.arange(8, dtype=np.float32)
    run = trials.Trials(np, (x,), expected=x * 2, reference=lambda x: x * 2, out=np.empty_like(x), count=3,
                        rng=random.Random(1), atol=0, rtol=0)
    run.guard = integrity.Guard(lambda f: None)
    run.first_call(fn)
    bench.time_fn(fn, probe=run, device="cpu", min_reps=20, max_reps=40, budget_s=1.0)
    assert seen and all(seen)
    assert run.checked_calls >= 1


def _calls(run, n, start=0):
    """Prepare ``n`` calls as a clock would; the content each was given and its seed."""
    got = []
    for idx in range(start, start + n):
        args = run.before(idx, run.sets[idx % run.count])
        got.append(([a.copy() if isinstance(a, np.ndarray) else a for a in args], run.prepared(idx)[0]))
    return got


def test_every_call_gets_fresh_inputs_whose_expectation_the_reference_computes():
    x = np.arange(1, 1001, dtype=np.float64)
    run = trials.Trials(np, (3.0, x), expected=None, reference=lambda a, x: a * x, out=None, count=4,
                        rng=random.Random(5), atol=0, rtol=0)
    calls = _calls(run, 200)
    contents = [args[1] for args, _seed in calls]
    assert len({c.tobytes() for c in contents}) == 200  # no content repeats, not even across the 4 buffers
    assert all(not np.array_equal(c, x) and args[0] == 3.0 for c, (args, _s) in zip(contents, calls))
    for args, seed in calls[:20]:
        assert np.array_equal(run.expected_for(seed), 3.0 * args[1])
    assert run.expected_for(None) is run.expected0 and np.array_equal(run.expected0, 3.0 * x)


def test_float_inputs_are_moved_and_scaled_towards_zero_and_integers_only_moved():
    x = np.linspace(-4, 4, 999).reshape(27, 37)
    factors = trials.Factors()
    for seed in range(50):
        xs, where = np.empty_like(x), np.empty(x.shape, dtype=np.int64)
        trials.permute_into(np, xs, x, random.Random(seed), factors)
        trials.permute_into(np, where, np.arange(x.size).reshape(x.shape), random.Random(seed), factors)
        assert sorted(where.ravel().tolist()) == list(range(x.size))  # integers: the same ones, moved
        nonzero = x.ravel()[where.ravel()] != 0
        scale = xs.ravel()[nonzero] / x.ravel()[where.ravel()][nonzero]  # each float: the one moved there, scaled
        assert np.all((scale >= 0.875) & (scale < 1)), scale
        assert np.std(scale) > 0.03  # spread over the range, not one factor for all


def _host_source(p, n, a, b):
    """_SOURCE_CODE's arithmetic, transcribed: output element p takes source element s (R Q P)."""
    return b + p if p < n - b else a + (p - (n - b)) if p < n - a else p - (n - a)


def test_the_gpu_kernels_index_formula_is_the_host_permutation():
    for n in (1, 2, 3, 4, 5, 17, 100):
        for seed in range(100):
            src = np.arange(n)
            dst = np.empty_like(src)
            trials.permute_into(np, dst, src, random.Random(seed))
            a, b = trials.block_cuts(random.Random(seed), n)
            assert dst.tolist() == [_host_source(p, n, a, b) for p in range(n)], (n, seed)
    assert "s = b + p" in trials._SOURCE_CODE


def test_the_gpu_kernels_factor_is_the_host_factor():
    def hash32(p):  # _FACTOR_CODE's arithmetic, transcribed with Python integers
        h = (p ^ (p >> 32)) & 0xFFFFFFFF
        h ^= h >> 16
        h = (h * 0x7FEB352D) & 0xFFFFFFFF
        h ^= h >> 15
        h = (h * 0x846CA68B) & 0xFFFFFFFF
        return h ^ (h >> 16)

    def factor(p, key):
        bits = ((hash32(p) >> (32 - trials.FACTOR_BITS)) | trials.FACTOR_HIGH) ^ key
        return float(np.array(bits, dtype=np.uint32).view(np.float32))

    for key in (0, 1, 0x1FFFFF, 123457):
        got = trials.Factors().draw(300, key)
        assert got.tolist() == [factor(p, key) for p in range(300)]
    far = [2**32 - 1, 2**32, 2**32 + 5, 3 * 2**33 + 17]  # indices of arrays over 4 Gi elements fold
    assert trials._hash32(np.array(far, dtype=np.uint64)).tolist() == [hash32(p) for p in far]
    assert "0x7feb352dU" in trials._FACTOR_CODE and "__uint_as_float" in trials._FACTOR_CODE


@pytest.mark.parametrize("n", [1, 2, 3, 4, 17])
def test_the_block_permutation_keeps_the_values_of_tiny_arrays(n):
    src = np.arange(n, dtype=np.int32) + 10
    dst = np.empty_like(src)
    seen = set()
    for seed in range(40):
        trials.permute_into(np, dst, src, random.Random(seed))
        assert sorted(dst.tolist()) == sorted(src.tolist())
        seen.add(tuple(dst.tolist()))
        assert n < 2 or not np.array_equal(dst, src)
    # R Q P with a + b != n: one arrangement for n = 3 (whose only cuts leave Q in place),
    # C(n-1, 2) less the pairs adding up to n otherwise
    assert len(seen) == {1: 1, 2: 1, 3: 1}[n] if n <= 3 else len(seen) >= {4: 2, 17: 30}[n]


@pytest.mark.parametrize("shape", [(1000,), (64, 128), (7, 5), (3, 4, 6), (2, 16, 64, 8)])
def test_no_row_of_the_base_inputs_reappears_anywhere_in_a_fresh_content(shape):
    """Every block moves, by a shift that is not a whole number of rows (last dimension)."""
    src = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    dst = np.empty_like(src)
    row = shape[-1]
    base_rows = {tuple(r) for r in src.reshape(-1, row).tolist()}
    for seed in range(60):
        trials.permute_into(np, dst, src, random.Random(seed))
        assert not np.any(dst == src), (shape, seed)  # no element where it was
        assert not base_rows & {tuple(r) for r in dst.reshape(-1, row).tolist()}, (shape, seed)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int64"])
def test_preparing_a_call_on_the_cpu_allocates_nothing(dtype):
    """The factors' table is made with the Trials; a call's refill only xors and multiplies into buffers."""
    n = 1 << 20
    x = (np.random.default_rng(0).standard_normal(n) * 100).astype(dtype)
    run = trials.Trials(np, (x, x[: n // 2].copy()), expected=None, reference=lambda x, y: x[: n // 2] + y,
                        out=np.empty(n // 2, dtype), count=2, rng=random.Random(3), atol=0, rtol=0)
    _calls(run, 2)  # the first refill of each buffer
    tracemalloc.start()
    try:
        for idx in range(2, 6):
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            run.before(idx, run.sets[idx % run.count])
            run.prepared(idx)
            peak = tracemalloc.get_traced_memory()[1] - before
            assert peak < x.nbytes // 8, f"preparing a call allocated {peak} bytes"  # casting buffers only
    finally:
        tracemalloc.stop()


def test_comparing_a_timed_output_on_the_cpu_allocates_nothing_but_the_reference():
    # Freed float64 temporaries between timed calls move the C heap's top, and the next timed
    # call then pays page faults for its own allocations: the harness would be measured.
    n = 1 << 20
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    expectations = {}

    def reference(x):  # computed before the check, so that only the comparison is traced below
        return expectations[x[:16].tobytes()]

    run = trials.Trials(np, (x,), expected=x * 2, reference=reference, out=np.empty_like(x), count=3,
                        rng=random.Random(3), atol=1e-6, rtol=1e-6)
    (args1, seed1), (args2, seed2) = _calls(run, 2)
    for args in (args1, args2):
        expectations[args[0][:16].tobytes()] = args[0] * 2
    right, other = args1[0] * 2, args2[0] * 2
    wrong = np.full_like(x, np.nan)  # the poison
    tracemalloc.start()
    try:
        for out, earlier in ((right, ()), (wrong, ()), (other, (seed2,))):
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            run.check_values(out, seed1, earlier)
            peak = tracemalloc.get_traced_memory()[1] - before
            # ufunc casting buffers (~64 KiB each) remain; one float64 copy of the output is 8 MiB
            assert peak < x.nbytes // 8, f"comparing allocated {peak} bytes"
    finally:
        tracemalloc.stop()
    assert run.check_values(right, seed1) is None
    assert run.check_values(wrong, seed1).code == "STALE_OUTPUT"
    found = run.check_values(other, seed1, (seed2,))
    assert found.code == "STALE_OUTPUT" and found.evidence["matches"] == "earlier call"
    assert run.check_values(right + 1, seed1, (seed2,)).code == "TIMED_MISMATCH"  # wrong, and no one's result


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "uint8", "bool"])
def test_the_scratch_comparison_counts_what_the_plain_one_counts(dtype):
    rng = np.random.default_rng(7)
    if dtype == "bool":
        expected = rng.integers(0, 2, 64).astype(bool)
        got = expected.copy()
        got[::5] = ~got[::5]
    elif dtype.startswith(("int", "uint")):
        expected = rng.integers(0, 100, 64).astype(dtype)
        got = expected.copy()
        got[::7] += 3
    else:
        expected = rng.standard_normal(64).astype(dtype)
        expected[:4] = [np.inf, -np.inf, np.inf, 0.0]
        got = expected + np.asarray(1e-7, dtype=dtype)
        got[:4] = [np.inf, np.inf, np.nan, np.nan]  # an equal inf, a wrong inf, NaNs
        got[10:20] += 1
    scratch = trials.Scratch(expected.shape)
    for atol, rtol in ((0, 0), (1e-6, 1e-6), (2.0, 0.0)):
        plain = trials.mismatches(np, got, expected, atol, rtol)
        assert trials.mismatches(np, got, expected, atol, rtol, scratch) == plain
    assert trials.poisoned(np, got, scratch) == trials.poisoned(np, got)


def test_the_trial_schedule_follows_the_seed():
    def picks(seed):
        run = trials.Trials(np, (np.arange(10.0),), expected=None, reference=lambda x: x, out=None, count=4,
                            rng=random.Random(seed), atol=0, rtol=0)
        run.start_timing(0)
        contents = [args[0].tolist() for args, _s in _calls(run, 8)]
        return [run.selected(i) for i in range(64)], contents

    assert picks(11) == picks(11) and picks(11) != picks(12)


def _clock(event_ms, wall_s, calls, overhead_call_s=20e-6):
    clock = _GpuClock.__new__(_GpuClock)
    clock.event_ms, clock.wall_s, clock.calls, clock.segments = event_ms, wall_s, calls, 1
    clock.overhead_call_s, clock.overhead_segment_s = overhead_call_s, 0.0
    return clock


def test_unsynced_rule_spares_honest_calls_and_catches_escaped_work():
    # 1000 honest 84 us calls with 20 us of flush around each: events and device time agree.
    assert _clock(84.0, 1000 * 104e-6, 1000).unsynced() is None
    # A 3 us kernel whose overhead estimate is 5 us off: below the per-call floor, spared.
    assert _clock(3.0, 1000 * 28e-6, 1000).unsynced() is None
    # Work on another stream: events see 1.5 us, the device was busy 84 us per call.
    finding = _clock(1.5, 1000 * 104e-6, 1000).unsynced()
    assert finding is not None and finding.code == "UNSYNCED_WORK" and finding.evidence["calls"] == 1000
    assert UNSYNCED_FLOOR_US > 5


def test_a_replaced_clock_is_reported(monkeypatch):
    reported = []
    guard = integrity.Guard(reported.append, "c1")
    guard.check_timer()  # nothing replaced yet
    monkeypatch.setattr("time.perf_counter_ns", lambda: 0)
    with pytest.raises(integrity.IntegrityFailure):
        guard.check_timer()
    assert reported[0].code == "TIMER_TAMPERED" and "time.perf_counter_ns" in reported[0].evidence["replaced"]


def test_a_patched_library_function_is_reported(monkeypatch):
    monkeypatch.setattr("kz_runner.bench.trials.mismatches", lambda *a: 0)
    assert "kz_runner.bench.trials.mismatches" in bench.pristine.tampered()


def test_a_thread_left_running_is_a_leak():
    # in a fresh interpreter: threads other tests leave behind in this process (pools, servers
    # winding down) would be counted too
    code = """
import threading
from kz_runner.bench import integrity
census = integrity.ThreadCensus()
assert census.leak() is None
stop = threading.Event()
t = threading.Thread(target=stop.wait, name="leaky")
t.start()
try:
    finding = census.leak()
    assert finding is not None and finding.code == "THREAD_LEAK" and "leaky" in finding.message, finding
finally:
    stop.set()
    t.join()
assert census.leak() is None
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


# -- on a GPU (run on the H200; skipped with the reason elsewhere) --------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["gpu_side_stream", "gpu_do_nothing", "gpu_half_work", "gpu_lazy"])
def test_gpu_cheat_is_stopped_with_its_code(name, tmp_path):
    cheat = {c.name: c for c in cheat_packages(tmp_path / "cheats")}[name]
    work = tmp_path / "work"
    work.mkdir()
    subprocess.run([sys.executable, str(cheat.path / ".kernel_package" / "build_test_env.py"), str(work)],
                   check=True, env=_env())
    done, channel_data = run_benchmark(cheat.path, work, seed=31337, timeout=600)
    sent = json.loads(channel_data)
    assert sent["kind"] == "integrity" and sent["code"] == cheat.expected_code, (sent, done.stderr.decode()[-2000:])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int32", "bool"])
def test_the_gpu_block_permutation_kernel_matches_the_host_one(dtype):
    """The same moves and, for floats, the same factors and products, bit for bit."""
    cp = bench.pristine.cupy
    factors = trials.Factors()
    for n in (1, 2, 3, 5, 64, 4099, 1 << 20):
        src = ((np.arange(n) % 97) * 0.37 - 11).astype(dtype) if dtype != "bool" else np.arange(n) % 3 == 0
        for seed in range(25 if n < 4100 else 3):
            host = np.empty_like(src)
            trials.permute_into(np, host, src, random.Random(seed), factors)
            dev = cp.empty(n, dtype=src.dtype)
            trials.permute_into(cp, dev, cp.asarray(src), random.Random(seed))
            assert np.array_equal(cp.asnumpy(dev), host), (dtype, n, seed)


@pytest.mark.gpu
def test_gpu_honest_example_passes_with_the_runners_pipes(tmp_path):
    pkg = EXAMPLES / GPU_AXPY
    work = tmp_path / "work"
    work.mkdir()
    subprocess.run([sys.executable, str(pkg / ".kernel_package" / "build_test_env.py"), str(work)], check=True,
                   env=_env())
    done, channel_data = run_benchmark(pkg, work, seed=99, timeout=600)
    sent = json.loads(channel_data)
    assert sent["kind"] == "result" and all(c["correctness"] == "passed" for c in sent["result"]["cases"]), sent


def test_an_os_thread_still_exiting_after_its_join_is_not_a_leak(monkeypatch):
    # join() returns before the kernel drops the task: /proc/self/task may list it a moment longer
    census = integrity.ThreadCensus()
    extra = {"calls": 0}
    real = integrity._os_tasks

    def lingering():
        extra["calls"] += 1
        tasks = real()
        return tasks | {999_999_999} if extra["calls"] <= 2 else tasks

    monkeypatch.setattr(integrity, "_os_tasks", lingering)
    assert census.leak() is None and extra["calls"] > 2

    monkeypatch.setattr(integrity, "_os_tasks", lambda: real() | {999_999_998})  # one that stays
    finding = census.leak()
    assert finding is not None and finding.code == "THREAD_LEAK" and "OS thread" in finding.message


WRONG_AND_BUSY = """
import os

import numpy as np

# Three spinning processes share the worker's one CPU: its main thread waits for that CPU between calls, so
# every judged batch is busy (MACHINE_BUSY, a void timing). Its output is wrong from the first call.
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
for _ in range(3):
    if os.fork() == 0:
        while True:
            pass


def softmax_rows(x):
    return np.zeros_like(x)
"""


def test_a_wrong_kernel_that_makes_its_timing_void_still_fails_its_case(built, tmp_path):
    # The case's correctness check is the verdict: a void timing (the worker loading its own CPU) must not
    # turn it into MACHINE_BUSY, which the runner gives back to the queue (ATTEMPTS_EXHAUSTED, never rejected).
    pkg = tmp_path / "pkg"
    shutil.copytree(EXAMPLES / SOFTMAX, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (pkg / "src" / "softmax.py").write_text(WRONG_AND_BUSY)
    work = _fresh_workdir(built, SOFTMAX, tmp_path)
    done, channel_data = run_benchmark(pkg, work, seed=24680)
    err = done.stderr.decode()
    assert done.returncode == 0, err[-3000:]
    doc = json.loads(done.stdout)
    assert doc["overall"]["accept"] is False, doc["overall"]
    assert "correctness FAILED" in err, err[-3000:]
    assert "MACHINE_BUSY" not in json.dumps(doc) and b"MACHINE_BUSY" not in (channel_data or b""), doc["overall"]
    assert "too busy to judge the timing; again" not in err  # no retry: the failed check decided the case
