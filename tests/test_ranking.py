"""Operator rankings that know their noise: intervals, speed-ups, geometric-mean scores, shared ranks."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

from kz_daemon.board.ranking import geomean, rank_all, rank_operator, reference_of, shared_ranks, speedup_interval
from kz_daemon.core.noise import Interval, better_beyond_noise, interval_of, overlaps

OP = "cpu/Reduction/Softmax/fp32"


def record(value, lo=None, hi=None, sha="a" * 40, n=100):
    rec = {"value": value, "submitter": "s", "commit_sha": sha, "recorded_at": "2026-12-01T00:00:00Z",
           "seed": sha == "0000000"}
    if lo is not None:
        rec["spread"] = {"n": n, "lo": lo, "hi": hi}
    return rec


def entry(name, cases, tags=(), direction="lower_better"):
    return {"kernel_id": f"{OP}/{name}", "name": name, "tags": list(tags),
            "category": dict(zip(("arch", "op_class", "sub_class", "quant"), OP.split("/"))),
            "cases": [{"test_case_id": cid, "primary_metric": "latency_us", "unit": "us", "direction": direction,
                       "best": best, "current": best, "correctness_current": "passed"}
                      for cid, best in cases.items()]}


# -- intervals ------------------------------------------------------------------------------------

def test_interval_of_a_record_with_and_without_spread():
    assert interval_of(record(2.0, 1.5, 2.5)) == Interval(2.0, 1.5, 2.5, 100)
    assert interval_of(record(2.0)).exact
    assert interval_of({"value": "x"}) is None and interval_of(None) is None


def test_better_beyond_noise_needs_disjoint_intervals_in_the_direction():
    old = Interval(10.0, 9.0, 11.0, 50)
    assert not better_beyond_noise(Interval(9.5, 8.5, 9.0, 50), old, "lower_better")  # touching: not beyond
    assert better_beyond_noise(Interval(8.0, 7.5, 8.9, 50), old, "lower_better")
    assert not better_beyond_noise(Interval(8.0, 7.5, 8.9, 50), old, "higher_better")
    assert better_beyond_noise(Interval(12.0, 11.5, 13.0, 50), old, "higher_better")
    with pytest.raises(ValueError):
        better_beyond_noise(old, old, "sideways")


def test_speedup_of_a_latency_inverts_the_interval_and_of_a_rate_scales_it():
    assert speedup_interval(Interval(5.0, 4.0, 10.0), 10.0, "lower_better") == Interval(2.0, 1.0, 2.5)
    assert speedup_interval(Interval(5.0, 4.0, 10.0), 10.0, "higher_better") == Interval(0.5, 0.4, 1.0)


def test_geomean_of_intervals_end_by_end():
    out = geomean([Interval(2.0, 1.0, 4.0, 10), Interval(8.0, 4.0, 16.0, 30)])
    assert [round(x, 9) for x in (out.value, out.lo, out.hi)] == [4.0, 2.0, 8.0] and out.n == 10


# -- ranks ----------------------------------------------------------------------------------------

def test_overlapping_scores_share_a_rank_and_the_next_rank_skips():
    ranks = shared_ranks([("a", Interval(3.0, 2.8, 3.2)), ("b", Interval(2.9, 2.7, 3.1)),
                          ("c", Interval(2.0, 1.9, 2.1)), ("d", Interval(1.0, 1.0, 1.0))])
    assert ranks == [("a", 1, True), ("b", 1, True), ("c", 3, False), ("d", 4, False)]


def test_overlap_is_judged_against_the_groups_first_kernel():
    # b overlaps a; c overlaps b but not a: c opens its own group
    ranks = shared_ranks([("a", Interval(3.0, 2.5, 3.5)), ("b", Interval(2.4, 2.0, 2.6)),
                          ("c", Interval(1.9, 1.8, 2.1))])
    assert ranks == [("a", 1, True), ("b", 1, True), ("c", 3, False)]


intervals = st.builds(lambda v, lo, hi: Interval(v, v * lo, v * hi),
                      st.floats(0.01, 100.0), st.floats(0.5, 1.0), st.floats(1.0, 2.0))


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text("abcdef", min_size=1, max_size=3), intervals, min_size=1, max_size=12))
def test_ranks_are_competition_ranks_that_never_separate_overlapping_neighbours(scores):
    ranks = shared_ranks(list(scores.items()))
    by_key = {k: (r, a) for k, r, a in ranks}
    order = [k for k, _r, _a in ranks]
    assert ranks[0][1] == 1
    assert [r for _k, r, _a in ranks] == sorted(r for _k, r, _a in ranks)  # best first
    for position, (key, rank, _approx) in enumerate(ranks):
        assert rank <= position + 1  # a shared rank is the group's first position
        if rank == position + 1 and position:
            leader = next(k for k, r, _a in ranks if r == ranks[position - 1][1])
            assert not overlaps(scores[key], scores[leader])  # a new group starts only beyond the noise
    for rank in {r for _k, r, _a in ranks}:
        members = [k for k in order if by_key[k][0] == rank]
        assert all(by_key[k][1] == (len(members) > 1) for k in members)  # ≈ exactly when shared
    # the input order changes nothing
    assert shared_ranks(list(reversed(list(scores.items())))) == ranks


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0.01, 100.0), min_size=1, max_size=10, unique=True))
def test_exact_scores_rank_one_to_n(values):
    ranks = shared_ranks([(f"k{i}", Interval(v, v, v)) for i, v in enumerate(values)])
    assert [r for _k, r, _a in ranks] == list(range(1, len(values) + 1))
    assert not any(a for _k, _r, a in ranks)


@settings(max_examples=100, deadline=None)
@given(st.lists(intervals, min_size=1, max_size=6), st.floats(0.1, 10.0))
def test_a_common_factor_per_case_changes_no_rank(per_case, factor):
    """The reference's value is a common factor of a case: the score changes, the order does not."""
    a = geomean(per_case)
    b = geomean([i.scaled(factor) for i in per_case])
    assert math.isclose(b.value, a.value * factor, rel_tol=1e-9)
    assert a.lo <= a.value <= a.hi


# -- an operator ---------------------------------------------------------------------------------

def test_the_reference_is_tagged_then_named_then_the_first_measured():
    tagged = entry("fast", {"c": record(1.0)}, tags=("reference",))
    named = entry("numpy_ref", {"c": record(2.0)})
    other = entry("a_other", {"c": record(3.0)})
    assert reference_of([named, tagged, other]) == (tagged["kernel_id"], False)
    assert reference_of([other, named]) == (named["kernel_id"], False)
    unmeasured = entry("a_first", {"c": record(0, sha="0000000")})
    assert reference_of([other, unmeasured]) == (other["kernel_id"], True)
    assert reference_of([unmeasured]) == (None, False)


def test_operator_score_is_the_geomean_speedup_against_the_reference():
    ref = entry("numpy_ref", {"a": record(10.0, 9.5, 10.5), "b": record(100.0, 95.0, 105.0)})
    fast = entry("fast", {"a": record(5.0, 4.9, 5.1), "b": record(25.0, 24.0, 26.0)})
    same = entry("same", {"a": record(10.1, 9.6, 10.6), "b": record(99.0, 94.0, 104.0)})
    partial = entry("partial", {"a": record(1.0, 0.9, 1.1), "b": record(0, sha="0000000")})
    board = rank_operator(OP, [ref, fast, same, partial])
    assert board.reference == ref["kernel_id"] and not board.reference_default
    assert board.case_ids == ["a", "b"] and board.scored_cases == ["a", "b"]
    rows = {k.kernel_id.rsplit("/", 1)[1]: k for k in board.kernels}
    assert math.isclose(rows["fast"].score.value, math.sqrt(2.0 * 4.0))
    assert rows["fast"].rank == 1 and not rows["fast"].approx
    assert rows["numpy_ref"].rank == rows["same"].rank == 2 and rows["same"].approx  # within the noise: ≈
    assert rows["partial"].rank is None and rows["partial"].missing == ("b",)
    assert [k.kernel_id.rsplit("/", 1)[1] for k in board.kernels][:1] == ["fast"]
    assert board.kernels[-1].kernel_id.endswith("partial")


def test_a_rate_metric_ranks_the_higher_value_first():
    ref = entry("numpy_ref", {"a": record(10.0)}, direction="higher_better")
    fast = entry("fast", {"a": record(40.0)}, direction="higher_better")
    board = rank_operator(OP, [ref, fast])
    assert [k.kernel_id.rsplit("/", 1)[1] for k in board.kernels] == ["fast", "numpy_ref"]
    assert math.isclose(board.kernels[0].score.value, 4.0)


def test_rank_all_groups_entries_by_operator():
    other_op = dict(entry("x", {"a": record(1.0)}), kernel_id="sm_90/Reduction/Softmax/fp16/x",
                    category={"arch": "sm_90", "op_class": "Reduction", "sub_class": "Softmax", "quant": "fp16"})
    boards = rank_all([entry("numpy_ref", {"a": record(1.0)}), other_op])
    assert list(boards) == [OP, "sm_90/Reduction/Softmax/fp16"]


# -- speed of light --------------------------------------------------------------------------------

AXPY_IO = [{"name": "a", "kind": "in", "dtype": "fp32", "shape": []},
           {"name": "x", "kind": "in", "dtype": "fp32", "shape": ["N"]},
           {"name": "y", "kind": "in", "dtype": "fp32", "shape": ["N"]},
           {"name": "out", "kind": "out", "dtype": "fp32", "shape": ["N"]}]


def test_speed_of_light_of_a_latency_is_bytes_over_time_against_the_memory_it_fits_in():
    from kz_daemon.board.roofline import speed_of_light
    from kz_runner.contract.rules.floor import DEFAULT_CEILINGS

    nbytes = 4 + 3 * 4 * 1_048_576  # a, x, y read once, out written once
    sol = speed_of_light(Interval(10.0, 8.0, 12.5), "us", "lower_better", {"n": 1_048_576}, AXPY_IO, "sm_90")
    assert sol["kind"] == "latency" and sol["bytes"] == nbytes and sol["memory"] == "L2"  # 12 MiB fit in 60 MiB
    assert math.isclose(sol["achieved_bytes_per_s"], nbytes / 10e-6)
    peak = DEFAULT_CEILINGS["sm_90"].l2_bytes_per_s
    assert sol["pct_of_peak"] == round(100 * nbytes / 10e-6 / peak, 3)
    low, high = sol["pct_interval"]
    assert low == round(100 * nbytes / 12.5e-6 / peak, 3) and high == round(100 * nbytes / 8e-6 / peak, 3)
    big = speed_of_light(1000.0, "us", "lower_better", {"n": 64 * 1_048_576}, AXPY_IO, "sm_90")
    assert big["memory"] == "HBM" and big["peak_bytes_per_s"] == DEFAULT_CEILINGS["sm_90"].hbm_bytes_per_s


def test_speed_of_light_of_a_bandwidth_and_a_compute_rate():
    from kz_daemon.board.roofline import speed_of_light
    from kz_runner.contract.rules.floor import DEFAULT_CEILINGS

    bw = speed_of_light(480.0, "GB/s", "higher_better", {"n": 1 << 28}, AXPY_IO, "sm_90")
    assert bw["kind"] == "bandwidth" and bw["pct_of_peak"] == 10.0
    flops = speed_of_light(99.0, "TFLOPS", "higher_better", {"n": 4}, AXPY_IO, "sm_90")
    assert flops["kind"] == "compute" and flops["peak_flops"] == DEFAULT_CEILINGS["sm_90"].flops["fp32"]
    assert flops["pct_of_peak"] == round(100 * 99e12 / DEFAULT_CEILINGS["sm_90"].flops["fp32"], 3)


def test_no_speed_of_light_without_a_floor():
    from kz_daemon.board.roofline import speed_of_light

    assert speed_of_light(10.0, "us", "lower_better", {"m": 4}, AXPY_IO, "sm_90") is None  # N does not resolve
    assert speed_of_light(10.0, "us", "lower_better", {"n": 4}, AXPY_IO, "sm_99") is None  # no ceiling
    assert speed_of_light(10.0, "furlongs", "lower_better", {"n": 4}, AXPY_IO, "sm_90") is None
    assert speed_of_light(None, "us", "lower_better", {"n": 4}, AXPY_IO, "sm_90") is None


# -- what an accept changed -------------------------------------------------------------------------

METAS = [{"test_case_id": c, "primary_metric": "latency_us",
          "metrics": [{"name": "latency_us", "unit": "us", "direction": "lower_better"}]} for c in ("a", "b")]


def card(best, current, sha_best="b" * 40, sha_cur="c" * 40):
    def rec(v, sha):
        return {"value": v, "submitter": "s", "commit_sha": sha, "recorded_at": "t"}
    return {"cases": [{"test_case_id": c, "metrics_best": {"latency_us": rec(best[i], sha_best)},
                       "metrics_current": {"latency_us": rec(current[i], sha_cur)}} for i, c in enumerate("ab")]}


def test_case_deltas_say_which_best_moved_and_by_how_much():
    from kz_daemon.board.outcome import case_deltas, overall

    before = card((10.0, 100.0), (10.0, 100.0), sha_best="a" * 40, sha_cur="a" * 40)
    after = card((8.0, 100.0), (8.0, 101.0), sha_best="n" * 40, sha_cur="n" * 40)
    after["cases"][1]["metrics_best"]["latency_us"]["commit_sha"] = "a" * 40  # b: within the noise, best kept
    deltas = case_deltas(before, after, METAS)
    assert [(d["test_case_id"], d["new_best"], d["previous_best"], d["value"], d["delta_pct"]) for d in deltas] == [
        ("a", True, 10.0, 8.0, -20.0), ("b", False, 100.0, 101.0, 1.0)]
    assert math.isclose(deltas[0]["speedup"], 1.25)
    summary = overall(deltas)
    assert summary["new_best"] and summary["cases_improved"] == 1
    assert math.isclose(summary["speedup"], math.sqrt(1.25 * 100 / 101))


def test_a_first_record_has_no_previous_best():
    from kz_daemon.board.outcome import case_deltas, overall

    seed = card((0, 0), (0, 0), sha_best="0000000", sha_cur="0000000")
    deltas = case_deltas(seed, card((5.0, 50.0), (5.0, 50.0), "n" * 40, "n" * 40), METAS)
    assert all(d["new_best"] and d["previous_best"] is None and d["delta_pct"] is None for d in deltas)
    assert overall(deltas) == {"new_best": True, "cases_improved": 2, "speedup": None, "delta_pct": None}


def test_accept_outcome_ranks_the_kernel_before_and_after():
    from kz_daemon.board.outcome import accept_outcome

    ref = entry("numpy_ref", {"a": record(10.0), "b": record(100.0)})
    other = entry("other", {"a": record(5.0), "b": record(50.0)})          # 2x
    mine_after = entry("mine", {"a": record(2.5, sha="n" * 40), "b": record(25.0, sha="n" * 40)})  # 4x
    before = card((20.0, 200.0), (20.0, 200.0), "o" * 40, "o" * 40)       # 0.5x: last
    after = card((2.5, 25.0), (2.5, 25.0), "n" * 40, "n" * 40)
    out = accept_outcome(mine_after["kernel_id"], before, after, METAS, [ref, other, mine_after])
    assert (out["rank_before"], out["rank_after"]) == (3, 1) and out["new_best"]
    assert out["operator"] == OP and [c["delta_pct"] for c in out["cases"]] == [-87.5, -87.5]
    new_kernel = accept_outcome(mine_after["kernel_id"], None, after, METAS, [ref, other, mine_after])
    assert (new_kernel["rank_before"], new_kernel["rank_after"]) == (None, 1)


# -- a harness nobody reviewed ----------------------------------------------------------------------

def unreviewed(e):
    return dict(e, harness="unreviewed")


def test_an_unreviewed_kernel_is_listed_with_its_figures_but_never_ranked_nor_the_reference():
    ref = entry("numpy_ref", {"a": record(10.0), "b": record(100.0)})
    fast = unreviewed(entry("fast", {"a": record(2.0), "b": record(20.0)}))  # 5x, but nobody reviewed its harness
    other = entry("other", {"a": record(5.0), "b": record(50.0)})
    board = rank_operator(OP, [ref, fast, other])
    rows = {k.kernel_id.rsplit("/", 1)[1]: k for k in board.kernels}
    assert (rows["fast"].rank, rows["fast"].score, rows["fast"].unreviewed) == (None, None, True)
    assert rows["fast"].cases["a"].best.value == 2.0 and math.isclose(rows["fast"].cases["a"].speedup.value, 5.0)
    assert (rows["other"].rank, rows["numpy_ref"].rank) == (1, 2)
    assert [k.kernel_id.rsplit("/", 1)[1] for k in board.kernels] == ["other", "numpy_ref", "fast"]
    # an unreviewed kernel is never the reference, tagged, named or first measured
    tagged = unreviewed(entry("a_tagged", {"a": record(1.0)}, tags=("reference",)))
    assert reference_of([tagged, ref]) == (ref["kernel_id"], False)
    assert reference_of([unreviewed(ref)]) == (None, False)
    # approving it (the mark gone) ranks it first, from the same figures
    assert rank_operator(OP, [ref, dict(fast, harness="reviewed"), other]).kernels[0].kernel_id == fast["kernel_id"]


def test_an_unreviewed_kernels_accept_is_no_new_best_and_has_no_rank():
    from kz_daemon.board.outcome import accept_outcome, under_review

    ref = entry("numpy_ref", {"a": record(10.0), "b": record(100.0)})
    mine = unreviewed(entry("mine", {"a": record(2.5, sha="n" * 40), "b": record(25.0, sha="n" * 40)}))
    after = card((2.5, 25.0), (2.5, 25.0), "n" * 40, "n" * 40)
    out = accept_outcome(mine["kernel_id"], None, after, METAS, [ref, mine])
    assert (out["harness"], out["new_best"], out["cases_improved"], out["rank_after"]) == ("unreviewed", False, 0, None)
    assert [c["best"] for c in out["cases"]] == [2.5, 25.0] and not any(c["new_best"] for c in out["cases"])
    # a reviewed kernel's accept does not rank behind an unreviewed one
    other = entry("other", {"a": record(5.0, sha="n" * 40), "b": record(50.0, sha="n" * 40)})
    out = accept_outcome(other["kernel_id"], None, after, METAS, [ref, mine, other])
    assert out["rank_after"] == 1 and "harness" not in out
    recorded = accept_outcome(mine["kernel_id"], None, after, METAS, [ref, dict(mine, harness="reviewed")])
    assert recorded["new_best"] and recorded["rank_after"] == 1
    assert under_review(recorded) == dict(out_of(recorded), harness="unreviewed")


def out_of(recorded):
    return dict(recorded, new_best=False, cases_improved=0, rank_after=None, rank_after_approx=False,
                cases=[dict(c, new_best=False) for c in recorded["cases"]])


def test_a_named_reference_holding_only_its_seed_placeholder_is_passed_over_until_measured():
    """A fresh zoo's example (numpy_ref, seed placeholder) scores nobody: the first measured kernel is the
    reference, and it ranks; once the named reference is measured it is the reference again."""
    seed = entry("numpy_ref", {"n4k": record(1.0, sha="0000000")}, tags=["reference"])
    mine = entry("my_impl", {"n4k": record(7.4, 7.2, 8.3)})
    assert reference_of([seed, mine]) == (mine["kernel_id"], True)
    assert rank_operator(OP, [seed, mine]).get(mine["kernel_id"]).rank == 1
    measured = entry("numpy_ref", {"n4k": record(15.0, 14.0, 16.0)}, tags=["reference"])
    assert reference_of([measured, mine]) == (measured["kernel_id"], False)
