"""queue.confirm.disagreement: two runs within each other's noise agree, whatever the fixed agreement."""
from __future__ import annotations

from kz_daemon.queue.confirm import committed_choice, disagreement

METAS = [{"test_case_id": "n4k", "primary_metric": "latency_us",
          "metrics": [{"name": "latency_us", "unit": "us", "direction": "lower_better"}]}]


def case(value, lo=None, hi=None):
    return {"test_case_id": "n4k", "correctness": "passed", "primary_metric": "latency_us", "value": value,
            "lo": lo, "hi": hi}


def test_runs_29_percent_apart_whose_intervals_overlap_agree():
    # an honest CPU case on a loaded 2-core host: 13.6 us, then 17.6 us with an interval reaching down to 7.9
    assert disagreement([case(13.64, 12.1, 15.2)], [case(17.59, 7.93, 20.44)], METAS, 0.25) == []


def test_runs_apart_beyond_the_agreement_and_each_others_noise_disagree():
    problems = disagreement([case(13.64, 13.0, 14.2)], [case(17.59, 17.0, 18.3)], METAS, 0.25)
    assert len(problems) == 1 and "0.29 apart" in problems[0], problems


def test_without_intervals_the_fixed_agreement_decides():
    assert disagreement([case(10.0)], [case(12.0)], METAS, 0.25) == []
    assert disagreement([case(10.0)], [case(13.0)], METAS, 0.25) != []


def test_a_ratio_within_the_measured_rounds_agrees_and_one_outside_does_not():
    recorded = {"n4k": 20.0}  # the reference's record: the first run's 13.64 implies 0.682
    near = {"n4k": {"value": 0.9, "lo": 0.62, "hi": 1.1, "rounds": 2}}
    far = {"n4k": {"value": 0.95, "lo": 0.93, "hi": 0.97, "rounds": 2}}
    first = [case(13.64, 13.0, 14.2)]
    assert disagreement(first, [case(14.0)], METAS, 0.1, near, recorded) == []
    problems = disagreement(first, [case(14.0)], METAS, 0.1, far, recorded)
    assert len(problems) == 1 and "reference" in problems[0], problems


def test_a_confirmation_faster_than_the_first_run_agrees_and_the_slower_first_run_is_committed():
    # fresh kz up, loaded 2-core host: an unchanged copy of the CPU softmax, 4360 us then 1355 us
    first, second = [case(4360.2, 3900.0, 5400.0)], [case(1354.7, 1300.0, 1420.0)]
    assert disagreement(first, second, METAS, 0.25) == []
    assert committed_choice(first, second, METAS) == "first"
    # the other way round (a first run three times faster than its confirmation) is still refused
    problems = disagreement(second, first, METAS, 0.25)
    assert len(problems) == 1 and "2.22 apart" in problems[0], problems


def test_a_ratio_better_in_the_confirmation_agrees_in_either_metric_direction():
    recorded = {"n4k": 1000.0}  # the first run's 4360 us implies 4.36x the reference's time
    assert disagreement([case(4360.0)], [case(1400.0)], METAS, 0.1, {"n4k": {"value": 1.3}}, recorded) == []
    assert disagreement([case(4360.0)], [case(1400.0)], METAS, 0.1, {"n4k": {"value": 5.0}}, recorded)
    gbps = [{"test_case_id": "n4k", "primary_metric": "gbps",
             "metrics": [{"name": "gbps", "unit": "GB/s", "direction": "higher_better"}]}]
    assert disagreement([case(10.0)], [case(30.0)], gbps, 0.25) == []
    assert disagreement([case(30.0)], [case(10.0)], gbps, 0.25)
