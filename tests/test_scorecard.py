"""Scorecard rewrite rules: one test per rule."""
from __future__ import annotations

import doctest

import jsonschema
import pytest

import kz_daemon.core.scorecard as sc
from kz_daemon.core.scorecard import dump, load, seed_scorecard, stamp, update_scorecard
from kz_runner.contract.layout import PENDING_COMMIT as PENDING, SEED_SHA as SENTINEL

KID = "cpu/Elementwise/add/fp32/ref"
T0, T1 = "2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z"
METAS = [
    {"test_case_id": "small", "primary_metric": "ms",
     "metrics": [{"name": "ms", "unit": "ms", "direction": "lower_better"},
                 {"name": "gbps", "unit": "GB/s", "direction": "higher_better"}]},
    {"test_case_id": "large", "primary_metric": "ms",
     "metrics": [{"name": "ms", "unit": "ms", "direction": "lower_better"}]},
]


def run(small_ms, small_gbps, large_ms, correctness="passed", extra=None):
    small = [{"name": "ms", "value": small_ms}, {"name": "gbps", "value": small_gbps}]
    if extra:
        small.append(extra)
    return {"cases": [
        {"test_case_id": "large", "correctness": correctness, "metrics": [{"name": "ms", "value": large_ms}]},
        {"test_case_id": "small", "correctness": correctness, "metrics": small},
    ]}


def schema():
    import kz_schemas

    return kz_schemas.load("bench_result")


def test_doctest():
    assert doctest.testmod(sc).failed == 0


def test_seed_has_sentinels_and_is_schema_valid():
    seed = seed_scorecard(KID, METAS)
    jsonschema.validate(seed, schema())
    assert [c["test_case_id"] for c in seed["cases"]] == ["small", "large"]
    assert seed["cases"][0]["metrics_best"]["gbps"]["commit_sha"] == SENTINEL


def test_first_accept_overwrites_sentinel_even_if_worse():
    card = update_scorecard(seed_scorecard(KID, METAS), KID, METAS, run(5.0, 1.0, 9.0), "alice", T0)
    best = card["cases"][0]["metrics_best"]
    assert best["ms"] == {"value": 5.0, "submitter": "alice", "commit_sha": PENDING, "recorded_at": T0}
    assert best["gbps"]["value"] == 1.0  # sentinel records never compete


def test_any_all_zero_commit_sha_is_a_seed_and_never_stands_as_a_best_of_zero():
    # the sentinel's one definition (layout.is_seed_sha) counts every all-zero sha; the
    # scorecard must not let a longer one stand as a real best of 0 that nothing beats
    seed = seed_scorecard(KID, METAS)
    for case in seed["cases"]:
        for rec in [*case["metrics_best"].values(), *case["metrics_current"].values()]:
            rec["commit_sha"] = "0" * 40
    card = update_scorecard(seed, KID, METAS, run(5.0, 1.0, 9.0), "alice", T0)
    assert card["cases"][0]["metrics_best"]["ms"]["value"] == 5.0
    assert card["cases"][1]["metrics_best"]["ms"]["value"] == 9.0


def test_cases_follow_metas_order():
    card = update_scorecard(None, KID, METAS, run(1, 1, 1), "a", T0)
    assert [c["test_case_id"] for c in card["cases"]] == ["small", "large"]


def test_best_only_where_beaten_in_declared_direction():
    first = stamp(update_scorecard(None, KID, METAS, run(2.0, 10.0, 5.0), "alice", T0), "a" * 40)
    second = update_scorecard(first, KID, METAS, run(3.0, 20.0, 4.0), "bob", T1)
    small, large = second["cases"]
    assert small["metrics_best"]["ms"]["submitter"] == "alice"   # 3.0 is worse (lower_better)
    assert small["metrics_best"]["ms"]["commit_sha"] == "a" * 40
    assert small["metrics_best"]["gbps"]["submitter"] == "bob"   # 20 beats 10 (higher_better)
    assert large["metrics_best"]["ms"]["value"] == 4.0           # 4 beats 5
    assert small["metrics_current"]["ms"] == {"value": 3.0, "submitter": "bob",
                                              "commit_sha": PENDING, "recorded_at": T1}


def test_tie_keeps_the_old_best():
    first = stamp(update_scorecard(None, KID, METAS, run(2.0, 10.0, 5.0), "alice", T0), "a" * 40)
    second = update_scorecard(first, KID, METAS, run(2.0, 10.0, 5.0), "bob", T1)
    assert second["cases"][0]["metrics_best"]["ms"]["submitter"] == "alice"


def test_correctness_current_maps_skipped_to_unknown():
    assert update_scorecard(None, KID, METAS, run(1, 1, 1, "skipped"), "a", T0)["cases"][0][
        "correctness_current"] == "unknown"
    assert update_scorecard(None, KID, METAS, run(1, 1, 1, "failed"), "a", T0)["cases"][1][
        "correctness_current"] == "failed"


def test_cases_dropped_from_metas_disappear_and_new_ones_appear():
    old = {"schema_version": "1.0.0", "kernel_id": KID, "cases": [
        {"test_case_id": "gone", "metrics_best": {}, "metrics_current": {}, "correctness_current": "passed"}]}
    card = update_scorecard(old, KID, METAS, run(1, 1, 1), "a", T0)
    assert [c["test_case_id"] for c in card["cases"]] == ["small", "large"]


def test_extra_metrics_in_current_not_best_and_undeclared_real_best_kept():
    old = stamp(update_scorecard(None, KID, METAS, run(2, 2, 2), "a", T0), "b" * 40)
    old["cases"][0]["metrics_best"]["retired"] = {"value": 1, "submitter": "x", "commit_sha": "c" * 40,
                                                  "recorded_at": T0}
    old["cases"][0]["metrics_best"]["retired_seed"] = {"value": 0, "submitter": "seed",
                                                       "commit_sha": SENTINEL, "recorded_at": T0}
    card = update_scorecard(old, KID, METAS, run(1, 1, 1, extra={"name": "extra", "value": 7}), "b", T1)
    small = card["cases"][0]
    assert list(small["metrics_current"]) == ["ms", "gbps", "extra"]
    assert "extra" not in small["metrics_best"]
    assert small["metrics_best"]["retired"]["value"] == 1
    assert "retired_seed" not in small["metrics_best"]


def test_stamp_replaces_all_pending_and_validates():
    card = update_scorecard(seed_scorecard(KID, METAS), KID, METAS, run(1, 2, 3), "a", T0)
    assert sc.pending_in(card)
    stamped = stamp(card, "0123456789abcdef0123456789abcdef01234567")
    assert not sc.pending_in(stamped)
    assert sc.pending_in(card)  # input untouched
    jsonschema.validate(stamped, schema())


def test_dump_load_round_trip_is_stable():
    card = stamp(update_scorecard(None, KID, METAS, run(1.25, 2, 3), "a", T0), "d" * 40)
    assert load(dump(card)) == card
    assert dump(card) == dump(load(dump(card)))


def test_unknown_direction_is_a_bug():
    with pytest.raises(ValueError):
        sc.beats(1, 2, "sideways")


def test_the_harness_goes_into_every_record_the_run_writes():
    card = update_scorecard(seed_scorecard(KID, METAS), KID, METAS, run(5.0, 1.0, 9.0), "a", T0, "abc123abc123")
    assert {r["harness"] for c in card["cases"] for k in ("metrics_best", "metrics_current")
            for r in c[k].values()} == {"abc123abc123"}
    jsonschema.validate(stamp(card, "d" * 40), schema())
    # a slower run under a new harness: the old best (and its harness) stays, current moves on
    later = update_scorecard(card, KID, METAS, run(6.0, 0.5, 9.5), "b", T1, "def456def456")
    small = later["cases"][0]
    assert small["metrics_best"]["ms"]["harness"] == "abc123abc123"
    assert small["metrics_current"]["ms"]["harness"] == "def456def456"
    assert "harness" not in update_scorecard(None, KID, METAS, run(1, 1, 1), "a", T0)["cases"][0]["metrics_best"]["ms"]


def test_older_harness_marks_only_a_recorded_difference():
    rec = {"value": 1, "harness": "abc123abc123"}
    assert sc.older_harness(rec, "def" + "0" * 37)
    assert not sc.older_harness(rec, "abc123abc123" + "0" * 28)
    assert not sc.older_harness({"value": 1}, "def" + "0" * 37)  # seeds and older records: unmarked
    assert not sc.older_harness(rec, None)


# -- the primary metric's best moves only beyond the noise ----------------------------------------

def noisy(ms, lo, hi, n=100):
    """A run whose ``small`` case measured ``ms`` with the 95 % interval ``[lo, hi]``."""
    doc = run(ms, 1.0, 9.0)
    doc["cases"][1]["metrics"][0]["spread"] = {"n": n, "lo": lo, "hi": hi}
    return doc


def _small_best(card):
    return card["cases"][0]["metrics_best"]["ms"]


def test_records_keep_the_runs_spread():
    card = update_scorecard(seed_scorecard(KID, METAS), KID, METAS, noisy(5.0, 4.9, 5.2), "alice", T0)
    assert _small_best(card)["spread"] == {"n": 100, "lo": 4.9, "hi": 5.2}
    assert card["cases"][0]["metrics_current"]["ms"]["spread"] == {"n": 100, "lo": 4.9, "hi": 5.2}
    assert "spread" not in card["cases"][0]["metrics_best"]["gbps"]  # the run reported none for it
    jsonschema.validate(stamp(card, "a" * 40), schema())


def test_a_faster_run_within_the_noise_does_not_take_the_best():
    first = update_scorecard(seed_scorecard(KID, METAS), KID, METAS, noisy(5.0, 4.9, 5.2), "alice", T0)
    within = update_scorecard(first, KID, METAS, noisy(4.95, 4.8, 5.0), "bob", T1)  # 4.8..5.0 meets 4.9..5.2
    assert _small_best(within)["submitter"] == "alice" and _small_best(within)["value"] == 5.0
    assert within["cases"][0]["metrics_current"]["ms"]["submitter"] == "bob"  # current always moves


def test_a_faster_run_beyond_the_noise_takes_the_best():
    first = update_scorecard(seed_scorecard(KID, METAS), KID, METAS, noisy(5.0, 4.9, 5.2), "alice", T0)
    beyond = update_scorecard(first, KID, METAS, noisy(4.5, 4.4, 4.85), "bob", T1)
    assert _small_best(beyond)["submitter"] == "bob" and _small_best(beyond)["spread"]["hi"] == 4.85


def test_without_a_spread_on_either_side_the_best_moves_on_any_strict_improvement():
    plain = update_scorecard(seed_scorecard(KID, METAS), KID, METAS, run(5.0, 1.0, 9.0), "alice", T0)
    assert _small_best(update_scorecard(plain, KID, METAS, noisy(4.99, 4.0, 6.0), "bob", T1))["submitter"] == "bob"
    spread = update_scorecard(seed_scorecard(KID, METAS), KID, METAS, noisy(5.0, 4.0, 6.0), "alice", T0)
    assert _small_best(update_scorecard(spread, KID, METAS, run(4.99, 1.0, 9.0), "bob", T1))["submitter"] == "bob"


def test_a_malformed_spread_only_widens_the_interval():
    from kz_daemon.core.noise import spread_of

    assert spread_of({"n": 3, "lo": 2.0, "hi": 1.0}, 1.5) is None  # lo above hi
    assert spread_of({"n": 0, "lo": 1.0, "hi": 2.0}, 1.5) is None
    assert spread_of({"n": True, "lo": 1.0, "hi": 2.0}, 1.5) is None
    assert spread_of({"n": 4, "lo": 2.0, "hi": 3.0}, 1.0) == {"n": 4, "lo": 1.0, "hi": 3.0}  # holds its value


def test_revocation_replays_records_with_the_same_noise_rule():
    from kz_daemon.core.scorecard import recompute_best

    a = stamp(update_scorecard(seed_scorecard(KID, METAS), KID, METAS, noisy(5.0, 4.9, 5.2), "a", T0), "a" * 40)
    b = stamp(update_scorecard(a, KID, METAS, noisy(4.95, 4.8, 5.0), "b", T1), "b" * 40)  # within a's noise
    head = stamp(update_scorecard(b, KID, METAS, noisy(3.0, 2.9, 3.1), "c", T1), "c" * 40)
    out = recompute_best(head, METAS, seed_scorecard(KID, METAS), [a, b])  # c revoked
    assert _small_best(out)["commit_sha"] == "a" * 40
