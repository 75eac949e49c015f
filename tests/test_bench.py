"""kz_runner.bench on the CPU: statistics, adaptive repetitions, correctness numbers, scorecard, emit, Harness."""
from __future__ import annotations

import io
import json
import math
import subprocess
import sys
import textwrap

import jsonschema
import numpy as np
import pytest

import kz_schemas
from kz_runner import bench
from kz_runner.bench.timing import STOP_BUDGET, STOP_MAX_REPS, STOP_TARGET


class ScriptedClock:
    """A clock that returns prepared per-call times (ms), so the stop rules are tested exactly."""

    name = "scripted"
    flush_bytes = 0

    def __init__(self, times):
        self.times = list(times)
        self.calls = 0
        self.args_seen = []

    def sync(self):
        pass

    def batch(self, fn, arg_sets, start, count):
        out = []
        for i in range(count):
            args = arg_sets[(start + i) % len(arg_sets)]
            fn(*args)
            self.args_seen.append(args)
            out.append(self.times[self.calls % len(self.times)])
            self.calls += 1
        return out


def test_summarize_matches_numpy():
    values = [1.0, 2.0, 3.0, 4.0, 10.0]
    s = bench.summarize(values)
    assert s.n == 5 and s.median == 3.0 and s.min == 1.0 and s.max == 10.0
    assert s.mean == pytest.approx(np.mean(values))
    assert s.stdev == pytest.approx(np.std(values, ddof=1))
    assert s.cv == pytest.approx(np.std(values, ddof=1) / np.mean(values))
    assert s.rse == pytest.approx(s.cv / math.sqrt(5))
    assert s.p10 == pytest.approx(np.percentile(values, 10))
    assert s.p90 == pytest.approx(np.percentile(values, 90))


def test_constant_times_stop_on_target_after_min_reps():
    clock = ScriptedClock([1.0])
    t = bench.time_fn(lambda: None, clock=clock, min_reps=12, max_reps=1000, target_rse=0.005, warmup=2)
    assert t.stop_reason == STOP_TARGET
    # the first batch is max(min_reps, ~50 ms of calls): 50 calls of 1 ms, then the target holds
    assert t.stats.n == 50 and t.median_ms == 1.0 and t.stats.rse == 0.0
    t = bench.time_fn(lambda: None, clock=ScriptedClock([1.0]), min_reps=120, target_rse=0.005, warmup=2)
    assert t.stop_reason == STOP_TARGET and t.stats.n == 120


def test_noisy_times_run_until_rse_under_target():
    # alternating 1 and 2 ms: cv ~ 0.33, so rse <= 1 % needs n >= (0.33/0.01)^2 ~ 1110
    clock = ScriptedClock([1.0, 2.0])
    t = bench.time_fn(lambda: None, clock=clock, min_reps=10, max_reps=100000, target_rse=0.01, budget_s=60)
    assert t.stop_reason == STOP_TARGET
    assert t.stats.rse <= 0.01
    assert t.stats.n > 1000
    assert bench.summarize([1.0, 2.0] * (t.stats.n // 2)).rse > 0.0099  # it did not stop much later than needed


def test_max_reps_caps_a_noisy_run():
    clock = ScriptedClock([1.0, 5.0])
    t = bench.time_fn(lambda: None, clock=clock, min_reps=10, max_reps=50, target_rse=1e-6, budget_s=60)
    assert t.stop_reason == STOP_MAX_REPS and t.stats.n == 50


def test_budget_stops_the_loop():
    clock = ScriptedClock([1.0, 5.0])
    t = bench.time_fn(lambda: None, clock=clock, min_reps=10, max_reps=10**9, target_rse=1e-9, budget_s=1e-9)
    assert t.stop_reason == STOP_BUDGET
    assert t.stats.n >= 10


def test_rotating_inputs_are_all_used_in_turn():
    sets = bench.copies([np.arange(4.0)], 3)
    assert len(sets) == 3 and sets[0][0] is not sets[1][0]
    np.testing.assert_array_equal(sets[2][0], sets[0][0])
    clock = ScriptedClock([1.0])
    bench.time_fn(lambda a: a.sum(), sets, clock=clock, min_reps=10, warmup=1)
    used = {id(args[0]) for args in clock.args_seen}
    assert used == {id(s[0]) for s in sets}


def test_cpu_clock_times_real_calls():
    calls = []
    t = bench.time_fn(lambda x: calls.append(x), [(1,), (2,)], device="cpu", min_reps=10, max_reps=40, budget_s=5)
    assert t.device == "cpu" and t.l2_flush_bytes == 0 and t.rotations == 2
    assert 10 <= t.stats.n <= 40
    assert len(calls) == t.stats.n + t.warmup_calls
    assert t.stats.min > 0 and t.median_us == pytest.approx(t.median_ms * 1000)
    json.dumps(t.to_json(), allow_nan=False)


def test_rotation_count_covers_twice_the_l2():
    assert bench.rotation_count(10 * 2**20, l2_bytes=60 * 2**20) == 8  # clamped
    assert bench.rotation_count(50 * 2**20, l2_bytes=60 * 2**20) == 3
    assert bench.rotation_count(500 * 2**20, l2_bytes=60 * 2**20) == 2  # minimum


def test_check_reports_errors_and_mismatches():
    exp = np.array([1.0, 2.0, 100.0, 0.0])
    out = np.array([1.0, 2.01, 100.05, 1e-4])
    c = bench.check(out, exp, atol=1e-3, rtol=1e-3)
    assert c.max_abs_err == pytest.approx(0.05)
    assert c.max_rel_err == pytest.approx(1e-4 / 1e-12)
    # 2.01: |d| 0.01 > 1e-3 + 2e-3; 100.05: 0.05 <= 1e-3 + 0.1; 1e-4 <= 1e-3
    assert c.mismatch_count == 1 and not c.passed and c.checked == 4
    assert bench.check(exp, exp, 0, 0).passed


def test_check_counts_nonfinite_and_keeps_numbers_finite():
    c = bench.check(np.array([np.nan, np.inf, 1.0]), np.array([1.0, 1.0, 1.0]), 1e-3, 1e-3)
    assert not c.passed and c.mismatch_count == 2 and c.nonfinite_count == 2
    assert math.isfinite(c.max_abs_err) and math.isfinite(c.max_rel_err)
    json.dumps(c.to_detail(), allow_nan=False)


def test_check_shape_mismatch_fails_with_error():
    c = bench.check(np.zeros(3), np.zeros(4), 1, 1)
    assert not c.passed and "shape" in c.error and c.to_detail()["error"] == c.error


SCORECARD = """
schema_version: "1.0.0"
kernel_id: cpu/Elementwise/Axpy/fp32/x
cases:
  - test_case_id: a
    metrics_best:
      latency_us: {value: 10.0, submitter: alice, commit_sha: "abc1234", recorded_at: "2026-01-01T00:00:00Z"}
      gbps: {value: 0.0, submitter: seed, commit_sha: "0000000", recorded_at: "2026-01-01T00:00:00Z"}
    metrics_current:
      latency_us: {value: 12.0, submitter: bob, commit_sha: "def5678", recorded_at: "2026-01-02T00:00:00Z"}
    correctness_current: passed
  - test_case_id: b
    metrics_best:
      latency_us: {value: 5.0, submitter: seed, commit_sha: "0000000", recorded_at: "2026-01-01T00:00:00Z"}
    metrics_current: {}
    correctness_current: unknown
"""


def test_scorecard_reads_best_and_current_ignoring_the_seed(tmp_path):
    path = tmp_path / "bench_result.yaml"
    path.write_text(SCORECARD)
    card = bench.Scorecard.load(path)
    assert card.kernel_id == "cpu/Elementwise/Axpy/fp32/x"
    assert card.best("a", "latency_us") == 10.0
    assert card.current("a", "latency_us") == 12.0
    assert card.best("a", "gbps") is None  # seed sentinel
    assert card.best("b", "latency_us") is None  # seed sentinel
    assert card.best("zzz", "latency_us") is None
    assert bench.Scorecard.load(tmp_path / "missing.yaml").best("a", "latency_us") is None
    assert bench.is_sentinel("0000000") and not bench.is_sentinel("abc1234")


def test_regression_tolerance_lower_better():
    assert bench.regression_check(10.4, 10.0, "lower_better", 0.05).ok
    slow = bench.regression_check(10.6, 10.0, "lower_better", 0.05)
    assert not slow.ok and slow.rel_change == pytest.approx(0.06) and "exceeds" in slow.reason
    assert bench.regression_check(5.0, 10.0, "lower_better", 0.0).ok  # faster is always fine


def test_regression_tolerance_higher_better():
    assert bench.regression_check(96.0, 100.0, "higher_better", 0.05).ok
    low = bench.regression_check(94.0, 100.0, "higher_better", 0.05)
    assert not low.ok and low.worse_by == pytest.approx(0.06)
    assert bench.regression_check(150.0, 100.0, "higher_better", 0.0).ok


def test_regression_without_reference_accepts():
    r = bench.regression_check(1.0, None, "lower_better", 0.05)
    assert r.ok and r.rel_change is None
    with pytest.raises(ValueError):
        bench.regression_check(1.0, 1.0, "sideways", 0.05)


def _cases():
    return [
        bench.case_result("a", correctness="passed", accept=True, metrics={"latency_us": 1.5},
                          correctness_detail={"max_abs_err": 0.0}),
        bench.case_result("b", correctness="passed", accept=True, metrics=[{"name": "latency_us", "value": 2}]),
    ]


def test_emit_writes_one_schema_valid_document(monkeypatch):
    monkeypatch.setenv("KZ_RUNNER_ID", "runner-7")
    stream = io.StringIO()
    doc = bench.emit("cpu/a/b/c/k", _cases(), arch="cpu", stream=stream)
    text = stream.getvalue()
    assert text.endswith("\n") and text.count("\n") == 1
    parsed = json.loads(text)
    assert parsed == doc
    jsonschema.validate(parsed, kz_schemas.load("benchmark_output"))
    assert parsed["runner_id"] == "runner-7" and parsed["overall"] == {
        "accept": True, "accept_reason": "all 2 cases accepted", "build_ok": True}
    assert parsed["ran_at"].endswith("Z")


def test_emit_overall_is_and_of_cases_and_build():
    cases = _cases()
    cases[1] = bench.case_result("b", correctness="passed", accept=False, metrics={})
    assert not bench.build_document("cpu/A/B/fp32/x", cases, arch="cpu")["overall"]["accept"]
    assert not bench.build_document("cpu/A/B/fp32/x", _cases(), arch="cpu", build_ok=False)["overall"]["accept"]
    failed = bench.case_result("c", correctness="failed", accept=True, metrics={})
    assert failed["accept"] is False  # failed correctness can never be accepted


def test_emit_refuses_nan_and_inf():
    bad = _cases()
    bad[0]["metrics"][0]["value"] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        bench.emit("k/x", bad, arch="cpu", stream=io.StringIO())
    bad[0]["metrics"][0]["value"] = 1.0
    bad[0]["correctness_detail"] = {"max_abs_err": float("inf")}
    with pytest.raises(ValueError, match="correctness_detail"):
        bench.emit("k/x", bad, arch="cpu", stream=io.StringIO())


def test_emit_refuses_a_failed_case_marked_accepted():
    cases = _cases()
    cases[0]["correctness"] = "failed"
    with pytest.raises(ValueError, match="correctness=failed"):
        bench.build_document("cpu/A/B/fp32/x", cases, arch="cpu")


def test_build_manifest_is_deterministic(tmp_path):
    for run in ("one", "two"):
        work = tmp_path / run
        (work / "inputs").mkdir(parents=True)
        np.save(work / "inputs" / "c1_x.npy", np.arange(5))
        bench.write_build_manifest(work, seed=1, test_cases={"c1": {"n": 5}})
    one = (tmp_path / "one" / "build_manifest.json").read_bytes()
    assert one == (tmp_path / "two" / "build_manifest.json").read_bytes()
    manifest = json.loads(one)
    assert list(manifest["test_cases"]["c1"]["files"]) == ["inputs/c1_x.npy"]
    assert len(manifest["files"]["inputs/c1_x.npy"]) == 64


META = {"test_case_id": "c1", "params": {}, "primary_metric": "latency_us",
        "metrics": [{"name": "latency_us", "unit": "us", "direction": "lower_better"}],
        "tolerance": {"correctness_atol": 1e-6, "correctness_rtol": 1e-6}}


def _harness(tmp_path, scorecard=None, tolerance=0.05, metas=None):
    pkg = tmp_path / "pkg" / ".kernel_package"
    pkg.mkdir(parents=True, exist_ok=True)
    work = tmp_path / "work"
    (work / "inputs").mkdir(parents=True, exist_ok=True)
    np.save(work / "inputs" / "c1_x.npy", np.arange(3.0))
    out = io.StringIO()
    h = bench.Harness(work, pkg / "benchmark.py", metas or [META], regression_tolerance=tolerance, device="cpu",
                      kernel_id="cpu/a/b/c/k", scorecard=scorecard or bench.Scorecard(), out_stream=out,
                      log_stream=io.StringIO(), min_reps=5, max_reps=20, budget_s=0.5)
    return h, out


def test_harness_accepts_a_passing_case(tmp_path):
    h, out = _harness(tmp_path)
    with h.case(META) as c:
        x = c.input("x")
        c.check(x * 1.0, np.arange(3.0))
        c.metric("latency_us", c.time(lambda: x.sum()).median_us)
    assert h.finish() == 0
    doc = json.loads(out.getvalue())
    assert doc["overall"]["accept"] and doc["arch"] == "cpu"
    assert doc["cases"][0]["correctness_detail"]["mismatch_count"] == 0


def test_harness_rejects_regression_against_best(tmp_path):
    card = bench.Scorecard(best_values={"c1": {"latency_us": 10.0}})
    h, out = _harness(tmp_path, scorecard=card, tolerance=0.05)
    with h.case(META) as c:
        c.check(np.ones(2), np.ones(2))
        c.metric("latency_us", 11.0)
    h.finish()
    case = json.loads(out.getvalue())["cases"][0]
    assert case["correctness"] == "passed" and case["accept"] is False
    assert "exceeds the 5% regression tolerance" in case["accept_reason"]


def test_harness_turns_an_exception_into_a_failed_case(tmp_path):
    meta2 = dict(META, test_case_id="c2")
    h, out = _harness(tmp_path, metas=[META, meta2])
    with h.case(META) as c:
        raise RuntimeError("kernel exploded")
    with h.case(meta2) as c:
        c.check(np.ones(1), np.ones(1))
        c.metric("latency_us", 1.0)
    h.finish()
    doc = json.loads(out.getvalue())
    jsonschema.validate(doc, kz_schemas.load("benchmark_output"))
    first, second = doc["cases"]
    assert first["correctness"] == "failed" and not first["accept"] and "kernel exploded" in first["error"]
    assert second["accept"] and not doc["overall"]["accept"]


def test_harness_reports_unrun_cases_and_unchecked_cases(tmp_path):
    meta2 = dict(META, test_case_id="c2")
    h, out = _harness(tmp_path, metas=[META, meta2])
    with h.case(META) as c:
        c.metric("latency_us", 1.0)  # no correctness check
    h.finish()
    doc = json.loads(out.getvalue())
    assert [c["test_case_id"] for c in doc["cases"]] == ["c1", "c2"]
    assert "did not run the correctness check" in doc["cases"][0]["error"]
    assert doc["cases"][1]["error"] == "case was not run"


def test_harness_drops_nonfinite_metrics(tmp_path):
    h, out = _harness(tmp_path)
    with h.case(META) as c:
        c.check(np.ones(1), np.ones(1))
        c.metric("latency_us", float("inf"))
    h.finish()
    case = json.loads(out.getvalue())["cases"][0]
    assert case["metrics"] == [] and not case["accept"] and "not finite" in case["error"]


def test_stdout_guard_keeps_stray_prints_off_stdout(tmp_path):
    (tmp_path / "work").mkdir()
    pkg = tmp_path / "pkg" / ".kernel_package"
    pkg.mkdir(parents=True)
    script = pkg / "benchmark.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys
        import numpy as np
        from kz_runner import bench
        META = {META!r}
        h = bench.Harness.from_argv(sys.argv, __file__, [META], regression_tolerance=0.05, device="cpu",
                                    kernel_id="cpu/a/b/c/k", min_reps=5, budget_s=0.2)
        with h.case(META) as c:
            print("a stray print from the implementation")
            os.write(1, b"and one from native code\\n")
            c.check(np.ones(1), np.ones(1))
            c.metric("latency_us", 1.0)
        raise SystemExit(h.finish())
    """))
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "work")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)  # exactly one document
    assert doc["overall"]["accept"]
    assert "a stray print" in done.stderr and "native code" in done.stderr


def test_harness_usage_error_exits_2(tmp_path):
    with pytest.raises(SystemExit) as exc:
        bench.Harness.from_argv(["benchmark.py"], tmp_path / "x.py", [META], regression_tolerance=0.05)
    assert exc.value.code == 2


@pytest.mark.gpu
def test_gpu_clock_uses_events_and_flushes_twice_the_l2():
    import cupy as cp

    x = cp.arange(1 << 20, dtype=cp.float32)
    t = bench.time_fn(lambda a: a * 2, bench.copies([x], 2), device="gpu", min_reps=10, budget_s=0.5)
    assert t.device == "gpu" and t.l2_flush_bytes == 2 * bench.l2_cache_bytes(cp) > 0
    assert t.stats.n >= 10 and t.stats.median > 0
    assert bench.detect_arch().startswith(("sm_", "gfx"))


INTS = np.random.default_rng(3).integers(-1000, 1000, 4096)


def _sort_case(tmp_path, fn, x0=INTS, **time_args):
    """A case whose op (a sort) gives the same result for every order of its input."""
    h, out = _harness(tmp_path)
    np.save(tmp_path / "work" / "inputs" / "c1_x.npy", x0)
    with h.case(META) as c:
        x = c.input("x")
        c.metric("latency_us", c.time(fn, (x,), expected=np.sort(x0), **time_args).median_us)
    h.finish()
    return json.loads(out.getvalue())


def _kept_first_result():
    kept = []

    def sort(x):  # computes once, then returns what the first call got
        if not kept:
            kept.append(np.sort(x))
        return kept[0].copy()
    return sort


@pytest.mark.parametrize("fn", [np.sort, _kept_first_result()], ids=["honest", "kept_first_result"])
def test_trials_that_cannot_change_the_result_are_weak_trials(tmp_path, fn):
    """Integers are only moved, and a sort of moved integers is the base one: a kept result would pass."""
    doc = _sort_case(tmp_path, fn, reference=np.sort)
    assert doc["overall"]["accept"] is False
    assert doc["overall"]["accept_reason"].startswith("WEAK_TRIALS"), doc["overall"]["accept_reason"]
    assert "vary=" in doc["overall"]["accept_reason"]


def _sort_passes_and_a_kept_result_is_stale(tmp_path, **case_args):
    honest = _sort_case(tmp_path / "honest", np.sort, reference=np.sort, **case_args)
    assert honest["overall"]["accept"] is True, honest["overall"]
    kept = _sort_case(tmp_path / "kept", _kept_first_result(), reference=np.sort, **case_args)
    assert kept["overall"]["accept"] is False
    assert kept["overall"]["accept_reason"].startswith("STALE_OUTPUT"), kept["overall"]["accept_reason"]


def test_a_vary_that_changes_the_result_lets_the_honest_sort_pass_and_catches_a_kept_result(tmp_path):
    def vary(rng, inputs):  # new values each call: a sort's result then changes too
        (x,) = inputs
        return (x + rng.randrange(1, 1000),)

    _sort_passes_and_a_kept_result_is_stale(tmp_path, vary=vary)


def test_float_inputs_need_no_vary_since_their_values_change_too(tmp_path):
    """Each float is scaled by its own factor per call, so even a sort's result changes."""
    _sort_passes_and_a_kept_result_is_stale(tmp_path, x0=np.random.default_rng(3).standard_normal(4096))


def test_a_checked_timing_without_a_reference_is_weak_trials(tmp_path):
    """expected= alone gives every call the base inputs: a result kept from the first call passes."""
    doc = _sort_case(tmp_path, _kept_first_result())
    assert doc["overall"]["accept"] is False
    assert doc["overall"]["accept_reason"].startswith("WEAK_TRIALS"), doc["overall"]["accept_reason"]
    assert "no reference=" in doc["overall"]["accept_reason"]


# -- the spread: a confidence interval of the median, carried to the primary metric ----------------

def test_median_interval_is_order_statistics_and_the_range_for_few_samples():
    from kz_runner.bench.timing import median_interval

    assert median_interval([3.0, 1.0, 2.0][:1]) == (3.0, 3.0)
    assert median_interval(sorted([5.0, 1.0, 4.0, 2.0, 3.0])) == (1.0, 5.0)  # fewer than 6: min..max
    values = [float(v) for v in range(100)]
    assert median_interval(values) == (39.0, 60.0)  # ranks 40 and 61 of 100: the binomial 95 % interval
    lo, hi = median_interval([float(v) for v in range(1000)])
    assert (lo, hi) == (468.0, 531.0)


def test_summary_and_timing_lines_carry_the_interval_of_the_median():
    stats = bench.summarize([2.0, 1.0, 4.0, 3.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0])
    assert stats.median_lo <= stats.median <= stats.median_hi
    assert (stats.median_lo, stats.median_hi) == (1.0, 10.0)


def test_the_primary_metric_carries_the_timings_spread_in_its_unit(tmp_path):
    meta = dict(META, metrics=[{"name": "latency_us", "unit": "us", "direction": "lower_better"},
                               {"name": "gbps", "unit": "GB/s", "direction": "higher_better"}])
    h, out = _harness(tmp_path, metas=[meta])
    with h.case(meta) as c:
        x = c.input("x")
        c.check(x * 1.0, np.arange(3.0))
        t = c.time(lambda: x.sum())
        c.metric("latency_us", t.median_us)
        c.metric("gbps", 24 / t.median_s / 1e9)
    h.finish()
    doc = json.loads(out.getvalue())
    jsonschema.validate(doc, kz_schemas.load("benchmark_output"))
    latency, gbps = doc["cases"][0]["metrics"]
    spread = latency["spread"]
    assert spread["n"] == t.stats.n and spread["lo"] <= latency["value"] <= spread["hi"]
    assert math.isclose(spread["lo"], t.stats.median_lo * 1e3) and math.isclose(spread["hi"], t.stats.median_hi * 1e3)
    assert "spread" not in gbps  # only the primary metric: the one the leaderboard ranks


def test_a_rate_gets_the_inverse_interval_and_an_untimed_metric_none():
    from kz_runner.bench.harness import metric_spread
    from kz_runner.bench.timing import Stats, Timing

    stats = Stats(n=50, median=2.0, mean=2.0, stdev=0.1, cv=0.05, rse=0.01, min=1.5, max=3.0, p10=1.8, p90=2.2,
                  median_lo=1.6, median_hi=2.5)
    timing = Timing(stats, "cpu", "budget", 0.01, 3, 4, 0, 1.0)
    assert metric_spread(10.0, timing, "lower_better") == {"n": 50, "lo": 8.0, "hi": 12.5}
    assert metric_spread(100.0, timing, "higher_better") == {"n": 50, "lo": 80.0, "hi": 125.0}


def test_a_metric_recorded_without_a_timing_has_no_spread(tmp_path):
    h, out = _harness(tmp_path)
    with h.case(META) as c:
        c.check(np.ones(2), np.ones(2))
        c.metric("latency_us", 11.0)
    h.finish()
    assert "spread" not in json.loads(out.getvalue())["cases"][0]["metrics"][0]
