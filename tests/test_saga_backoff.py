"""The reaper backs off on a stuck saga: one retry after 1 s, 2 s, 4 s ... up to a cap, not every pass."""
from __future__ import annotations

import os
import time

from kz_daemon.core.backoff import Backoff, compute_backoff
from kz_daemon.ops.service import SAGA_RETRY_FIRST_S, SAGA_RETRY_MAX_S, Zoo
from kz_events.status import Status
from tests.helpers.daemon import AXPY_ID, axpy_result, drop_queued_axpy
from tests.test_storage_full import (
    fill_disk,
    poll,
    repo_on_small_disk,
    small_disk as small_disk,  # noqa: F401 (the fixture)
)


class Clock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_compute_backoff_doubles_from_the_first_wait_up_to_the_cap():
    assert [compute_backoff(n, 1.0, 60.0) for n in range(9)] == [0, 1, 2, 4, 8, 16, 32, 60, 60]
    assert compute_backoff(10_000, 0.5, 300.0) == 300.0  # no overflow however long it failed


def test_a_stuck_key_is_tried_ever_more_rarely_over_ten_minutes():
    """A loop that wakes every 0.2 s for ten minutes tries a key that always fails 10 times, not 3,000."""
    clock = Clock()
    schedule = Backoff(SAGA_RETRY_FIRST_S, SAGA_RETRY_MAX_S, clock)
    attempts, other = [], 0
    for tick in range(3000):
        clock.now = 1000.0 + tick * 0.2
        if schedule.due("stuck"):
            attempts.append(round(clock.now - 1000.0, 1))
            schedule.failed("stuck")
        if schedule.due("fine"):  # one that succeeds is tried at every pass
            other += 1
            schedule.forget("fine")
    # 0, then 1, 2, 4 ... 256 s after the previous try, then every 300 s
    assert attempts == [0.0, 1.0, 3.0, 7.0, 15.0, 31.0, 63.0, 127.0, 255.0, 511.0]
    assert other == 3000 and schedule.failures("stuck") == 10 and schedule.failures("fine") == 0
    schedule.keep_only({"fine"})
    assert schedule.failures("stuck") == 0 and schedule.due("stuck")


def test_the_reaper_retries_a_stalled_saga_on_the_schedule_and_finishes_it(tmp_path, small_disk):  # noqa: F811
    config = repo_on_small_disk(tmp_path, small_disk, 0.05)  # the reaper wakes 20 times a second
    zoo = Zoo(config)
    zoo.start()
    clock = Clock()
    zoo.saga_retry.clock = clock
    try:
        sub_uuid = drop_queued_axpy(zoo, AXPY_ID, "p")
        claim = zoo.claim("r", "cpu", 5)
        filler = small_disk / "filler"
        fill_disk(filler)
        view = zoo.report_result(sub_uuid, "r", claim.lease_id, axpy_result(AXPY_ID), b"", {}, None)
        assert view.status == Status.ACCEPTING, view.reasons
        assert poll(lambda: zoo.saga_retry.failures(sub_uuid) == 1, 10)  # the reaper's first retry
        time.sleep(1.0)  # twenty passes of the reaper: none is due before the clock moves
        assert zoo.saga_retry.failures(sub_uuid) == 1
        clock.now += 1.0
        assert poll(lambda: zoo.saga_retry.failures(sub_uuid) == 2, 10)
        clock.now += 1.9  # the next wait is 2 s
        time.sleep(0.5)
        assert zoo.saga_retry.failures(sub_uuid) == 2
        os.unlink(filler)
        clock.now += 0.1
        assert poll(lambda: zoo.store.submission(sub_uuid).status == Status.ACCEPTED, 10)
        assert zoo.saga_retry.failures(sub_uuid) == 0  # forgotten once finished
    finally:
        zoo.stop()
