"""Rejected uploads are kept within bounds: the newest tarballs by count, bytes and age, their
reason.json longer; only logged submissions are touched, and the event log never."""
from __future__ import annotations

import os
import time
import uuid as uuidlib

import pytest

from kz_daemon.ops.runtime import init_state_dir
from kz_daemon.ops.service import Zoo
from tests.helpers.daemon import EXAMPLES, drop_into_inbox, wait_for
from tests.helpers.submissions import every

DAY = 86400.0


def _config(tmp_path, extra=""):
    state = tmp_path / "kz"
    state.mkdir(exist_ok=True)
    (state / "kz.yaml").write_text("intake:\n  rescan_interval_s: 0.2\n"
                                   "retention:\n  rejected_keep: 2\n  rejected_days: 30\n"
                                   "  rejected_reason_days: 365\n" + extra)
    return init_state_dir(state, seed_from=EXAMPLES)


def _reject(zoo, count):
    """Drop ``count`` corrupt tarballs; their uuids once all are rejected, oldest first."""
    before = set(every(zoo.store))
    for i in range(count):
        drop_into_inbox(zoo.config.paths.spool, f"bad{i}.tar.gz", b"not a tarball %d" % i)
    new = wait_for(lambda: (set(every(zoo.store)) - before) if
                   len(set(every(zoo.store)) - before) == count else None)
    for u in new:
        assert zoo.wait_intake(u, 30).status == "rejected"
    return sorted(new)


def _age(folder, days):
    t = time.time() - days * DAY
    os.utime(folder / "reason.json", (t, t))


@pytest.fixture
def zoo(tmp_path):
    z = Zoo(_config(tmp_path))
    z.start()
    yield z
    z.stop()


def test_the_newest_tarballs_stay_and_the_reasons_outlive_the_rest(zoo):
    uuids = _reject(zoo, 4)
    rejected = zoo.config.spool_rejected
    for rank, u in enumerate(uuids):  # uuids[0] the oldest
        _age(rejected / u, (len(uuids) - rank) / 24)
    seq = zoo.store.state.seq
    zoo.sweep_retention()
    assert [(rejected / u / "package.tar.gz").exists() for u in uuids] == [False, False, True, True]
    assert all((rejected / u / "reason.json").exists() for u in uuids)
    _age(rejected / uuids[0], 400)  # past rejected_reason_days: the whole folder goes
    _age(rejected / uuids[3], 31)   # past rejected_days: its tarball goes although it is within the count
    zoo.sweep_retention()
    assert not (rejected / uuids[0]).exists()
    assert not (rejected / uuids[3] / "package.tar.gz").exists()
    assert (rejected / uuids[3] / "reason.json").exists()
    assert (rejected / uuids[2] / "package.tar.gz").exists()
    assert zoo.store.state.seq == seq, "retention emitted or pruned events"
    assert set(uuids) <= set(every(zoo.store))
    assert not [n for n in os.listdir(rejected) if n.startswith(".gc-")]


def test_a_rejection_not_yet_logged_is_left_alone(zoo):
    stray = zoo.config.spool_rejected / str(uuidlib.uuid4())
    stray.mkdir()
    (stray / "package.tar.gz").write_bytes(b"x" * 10)
    (stray / "reason.json").write_text("{}")
    _age(stray, 1000)
    zoo.sweep_retention()
    assert (stray / "package.tar.gz").exists()


def test_the_byte_bound_and_the_sweep_at_start(tmp_path):
    config = _config(tmp_path)
    z = Zoo(config)
    z.start()
    try:
        uuids = _reject(z, 3)
    finally:
        z.stop()
    sizes = [(config.spool_rejected / u / "package.tar.gz").stat().st_size for u in uuids]
    for rank, u in enumerate(uuids):
        _age(config.spool_rejected / u, (len(uuids) - rank) / 24)
    # room for the newest tarball only: the next start sweeps the other two away
    config = _config(tmp_path, f"  rejected_max_bytes: {sizes[-1]}\n")
    z = Zoo(config)
    z.start()
    try:
        wait_for(lambda: not (config.spool_rejected / uuids[1] / "package.tar.gz").exists())
        assert not (config.spool_rejected / uuids[0] / "package.tar.gz").exists()
        assert (config.spool_rejected / uuids[2] / "package.tar.gz").exists()
    finally:
        z.stop()
