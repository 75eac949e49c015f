"""Intake's I/O per file: the outcome documents, their folders and the folders' parents are
fsynced by the batch's flush, before the batch's events (never after); an outcome a crash
cut short is decided again; a spooled file is read in one pass over the tarball, its
desc.yaml parsed once and its harness files not at all when their bytes were checked before."""
from __future__ import annotations

import ast
import io
from pathlib import Path

import pytest
import yaml

from kz_daemon.intake import admit
from kz_daemon.ops.runtime import init_state_dir
from kz_daemon.ops.service import Zoo
from kz_runner.contract import tarball as tarball_module, validate as validate_module
from tests.helpers.daemon import AXPY_ID, EXAMPLES, axpy_tarball, drop_into_inbox


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


def test_outcome_documents_are_fsynced_by_the_flush_before_the_events(tmp_path, monkeypatch):
    """No decision fsyncs its own JSON: the batch's flush fsyncs every outcome document and its
    folder, then the parents, then appends the events."""
    config = init_state_dir(tmp_path / "kz", seed_from=EXAMPLES)
    zoo = Zoo(config)
    try:
        for i in range(3):
            drop_into_inbox(config.paths.spool, f"ok{i}.tar.gz",
                            axpy_tarball(mutate=lambda f, i=i: f.__setitem__("src/n.txt", str(i).encode())))
        drop_into_inbox(config.paths.spool, "bad.tar.gz", b"not a tarball")
        trace: list[str] = []
        fsync_path, emit, record = admit.durable.fsync_path, zoo.store.emit, zoo.intake._record
        monkeypatch.setattr(admit.durable, "fsync_path",
                            lambda path: (trace.append(f"fsync {Path(path).name}"), fsync_path(path))[1])
        monkeypatch.setattr(zoo.store, "emit", lambda *events: (trace.append("emit"), emit(*events))[1])
        monkeypatch.setattr(zoo.intake, "_record", lambda *a: (trace.append("decided"), record(*a))[1])
        assert zoo.intake.scan_once() == 4
        assert trace == ["decided"] * 4 + ["fsync submission.json"] * 3 + ["fsync reason.json", "emit"]
    finally:
        zoo.store.close()


def test_an_outcome_cut_short_by_a_crash_is_decided_again(tmp_path):
    """A crash after a decision's files were written but before the batch's fsync can leave an
    outcome folder whose JSON is empty: no event names it, so the tarball goes back to work/ and
    the next scan decides it."""
    config = init_state_dir(tmp_path / "kz", seed_from=EXAMPLES)
    zoo = Zoo(config)
    try:
        drop_into_inbox(config.paths.spool, "ok.tar.gz", axpy_tarball())
        claimed = zoo.intake.dirs
        taken = admit.spool.claim(claimed, claimed.inbox / "ok.tar.gz", lambda _u: False, lambda: "2026-01-01T00:00:00Z")
        assert taken is not None
        folder = Path(config.paths.pending) / taken.uuid
        folder.mkdir(parents=True)
        (folder / "submission.json").write_bytes(b"")  # written, never fsynced: the crash lost its bytes
        taken.tarball.replace(folder / "package.tar.gz")
        assert zoo.intake.recover() == 0
        assert not folder.exists() and taken.tarball.exists()
        assert zoo.intake.scan_once() == 1
        sub = zoo.store.state.submissions[taken.uuid]
        assert sub.status == "queued" and (folder / "package.tar.gz").exists()
    finally:
        zoo.store.close()


@pytest.mark.parametrize("kernel_id", [AXPY_ID, "cpu/Elementwise/Axpy/fp32/another_impl"],
                         ids=["existing-kernel", "new-kernel"])
def test_a_spooled_package_is_read_once_and_its_desc_and_benchmark_parsed_once(tmp_path, monkeypatch, kernel_id):
    """One pass over the tarball, one YAML parse of desc.yaml, one ast parse of benchmark.py per intake,
    and none of benchmark.py for a second submission with the same harness bytes.

    The validation, the locked harness, the frozen check at HEAD and the static rules all
    read the one package record; an existing kernel's HEAD desc.yaml has the submitted
    bytes, so its parse is shared too; the harness files' checks are kept by content.
    """
    config = init_state_dir(tmp_path / "kz", seed_from=EXAMPLES)
    zoo = Zoo(config)
    monkeypatch.setattr(validate_module, "HARNESS_CHECKS", validate_module.HarnessChecks())
    try:
        data = axpy_tarball(kernel_id)
        members = tarball_module.scan_tarball(io.BytesIO(data), capture=lambda _n: True).captured
        desc = members[f"{kernel_id}/.kernel_package/desc.yaml"].decode()
        benchmark = members[f"{kernel_id}/.kernel_package/benchmark.py"].decode()
        drop_into_inbox(config.paths.spool, "ok.tar.gz", data)
        passes, yaml_texts, python_texts = [], [], []
        iterate, yaml_load, ast_parse = tarball_module._iterate, yaml.load, ast.parse

        def counted_iterate(source, *args, **kwargs):
            passes.append(source)
            return iterate(source, *args, **kwargs)

        def counted_yaml(stream, *args, **kwargs):
            yaml_texts.append(stream.decode() if isinstance(stream, bytes) else stream)
            return yaml_load(stream, *args, **kwargs)

        def counted_parse(source, *args, **kwargs):
            python_texts.append(source.decode() if isinstance(source, bytes) else source)
            return ast_parse(source, *args, **kwargs)

        monkeypatch.setattr(tarball_module, "_iterate", counted_iterate)
        monkeypatch.setattr(yaml, "load", counted_yaml)
        monkeypatch.setattr(ast, "parse", counted_parse)
        assert zoo.intake.scan_once() == 1
        assert zoo.store.state.status_counts["queued"] == 1
        assert len(passes) == 1
        assert yaml_texts.count(desc) == 1
        assert python_texts.count(benchmark) == 1
        # the same harness again (another source): its checks are kept, benchmark.py is not parsed
        drop_into_inbox(config.paths.spool, "again.tar.gz",
                        axpy_tarball(kernel_id, mutate=lambda f: f.__setitem__("src/n.txt", b"2")))
        assert zoo.intake.scan_once() == 1
        assert zoo.store.state.status_counts["queued"] == 2
        assert python_texts.count(benchmark) == 1 and validate_module.HARNESS_CHECKS.hits == 2
    finally:
        zoo.store.close()
