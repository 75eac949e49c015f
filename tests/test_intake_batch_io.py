"""Intake's I/O per file: the outcome folders' parents are fsynced once per batch, before the
batch's events (never after), and the harness files are read in one pass over the tarball."""
from __future__ import annotations

from pathlib import Path

from kz_daemon.intake import admit
from kz_daemon.ops.runtime import init_state_dir
from kz_daemon.ops.service import Zoo
from kz_runner.contract import tarball as tarball_module
from tests.helpers.daemon import EXAMPLES, axpy_tarball, drop_into_inbox


def test_the_parents_are_fsynced_once_per_batch_before_its_events(tmp_path, monkeypatch):
    config = init_state_dir(tmp_path / "kz", seed_from=EXAMPLES)
    zoo = Zoo(config)  # not started: this thread scans
    try:
        for i in range(3):
            drop_into_inbox(config.paths.spool, f"ok{i}.tar.gz",
                            axpy_tarball(mutate=lambda f, i=i: f.__setitem__("src/n.txt", str(i).encode())))
        drop_into_inbox(config.paths.spool, "bad.tar.gz", b"not a tarball")
        trace: list[tuple[str, object]] = []
        fsync_dir, emit = admit.durable.fsync_dir, zoo.store.emit
        parents = {Path(config.paths.pending).resolve(), Path(zoo.intake.dirs.rejected).resolve()}

        def traced_fsync_dir(path):
            if Path(path).resolve() in parents:
                trace.append(("fsync", Path(path).resolve()))
            fsync_dir(path)

        def traced_emit(*events):
            trace.append(("emit", len(events)))
            return emit(*events)

        monkeypatch.setattr(admit.durable, "fsync_dir", traced_fsync_dir)
        monkeypatch.setattr(zoo.store, "emit", traced_emit)
        assert zoo.intake.scan_once() == 4
        assert sorted(zoo.store.state.status_counts[s] for s in ("queued", "rejected")) == [1, 3]
        # one batch: each parent once, both before the batch's one append (3 + 3 + 3 + 2 events)
        assert [kind for kind, _ in trace] == ["fsync", "fsync", "emit"]
        assert {what for kind, what in trace if kind == "fsync"} == parents
        assert trace[-1] == ("emit", 11)
    finally:
        zoo.store.close()


def test_the_harness_files_are_read_in_one_pass(tmp_path, monkeypatch):
    config = init_state_dir(tmp_path / "kz", seed_from=EXAMPLES)
    zoo = Zoo(config)
    try:
        drop_into_inbox(config.paths.spool, "ok.tar.gz", axpy_tarball())
        captures: list[set] = []
        scan = tarball_module.scan_tarball

        def counted(source, limits=tarball_module.Limits(), capture=(), capture_bytes=tarball_module.MiB):
            captures.append(set(capture) if not callable(capture) else {"<predicate>"})
            return scan(source, limits, capture, capture_bytes)

        monkeypatch.setattr(admit, "scan_tarball", counted)
        assert zoo.intake.scan_once() == 1
        assert zoo.store.state.status_counts["queued"] == 1
        harness = [c for c in captures if any(name.endswith("/benchmark.py") for name in c)]
        assert len(harness) == 1 and len(harness[0]) == 3  # desc.yaml, build_test_env.py, benchmark.py at once
    finally:
        zoo.store.close()
