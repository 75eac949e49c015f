"""One set of accept-latency buckets: the histogram ``/metrics`` computes from submissions and
the one the history projection keeps as it goes have the same bounds and the same counts."""
from __future__ import annotations

from kz_daemon.api import metrics
from kz_events.log import history
from kz_events.log.reading import replay_finished
from kz_events.log.store import Store
from kz_events.read.workload import build_history


def test_metrics_and_the_projection_share_one_definition_of_the_buckets():
    assert metrics.LATENCY_BUCKETS is history.ACCEPT_LATENCY_BOUNDS


def test_the_projection_histogram_equals_the_one_computed_from_the_records(tmp_path):
    build_history(tmp_path, 300, seed=3)
    state, finished = replay_finished(tmp_path)
    computed = metrics.accept_latency({**finished, **state.submissions})
    with Store.open(tmp_path, fsync=False) as store:
        kept = store.accept_latency()
    assert computed["count"] > 20 and len({n for n in computed["buckets"].values()}) > 2  # several buckets used
    assert kept["buckets"] == computed["buckets"] and kept["count"] == computed["count"]
    assert abs(kept["sum"] - computed["sum"]) < 1e-6 * max(1.0, computed["sum"])
