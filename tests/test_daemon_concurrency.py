"""Concurrent runners: intake, claims and accepts from many threads stay consistent."""
from __future__ import annotations

import threading

from kz_daemon.ops.repo_audit import audit_state_dir
from kz_daemon.ops.runtime import init_state_dir
from kz_daemon.ops.service import Zoo
from tests.helpers.daemon import EXAMPLES, axpy_result, axpy_tarball, drop_into_inbox, wait_for
from tests.helpers.submissions import every

KIDS = [f"cpu/Elementwise/Axpy/fp32/impl{i}" for i in range(6)]


def test_parallel_accepts_serialize_cleanly(tmp_path):
    zoo = Zoo(init_state_dir(tmp_path / "kz", seed_from=EXAMPLES))
    zoo.start()
    try:
        base = zoo.git.head()
        for i, kid in enumerate(KIDS):
            drop_into_inbox(zoo.config.paths.spool, f"p{i}.tar.gz", axpy_tarball(kid))
        wait_for(lambda: zoo.store.state.status_counts.get("queued", 0) == len(KIDS))
        claims, errors = [], []

        def runner(name):
            try:
                c = zoo.claim(name, "cpu", 5)
                claims.append(c)
                zoo.runner_package(c.uuid, name)
                zoo.report_result(c.uuid, name, c.lease_id, axpy_result(c.kernel_id), b"", {}, None)
            except Exception as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=runner, args=(f"r{i}",)) for i in range(len(KIDS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == []
        assert len({c.uuid for c in claims}) == len(KIDS)
        assert all(s.status == "accepted" for s in every(zoo.store).values())
        steps = [c.trailers["Kz-Step"] for c in zoo.git.log(stop=base)]
        assert steps == ["scorecard", "source"] * len(KIDS)  # pairs never interleave
        wait_for(lambda: zoo.store.state.index_head == zoo.git.head())
        assert {k["kernel_id"] for k in zoo.index()["kernels"]} >= set(KIDS)
    finally:
        zoo.stop()
    assert [f for f in audit_state_dir(zoo.config.state_dir) if f.severity == "error"] == []
