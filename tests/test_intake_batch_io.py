"""Intake's I/O per file: the outcome folders' parents are fsynced once per batch, before the
batch's events (never after), and a spooled file is read in one pass over the tarball, its
desc.yaml and benchmark.py parsed once."""
from __future__ import annotations

import ast
import io
from pathlib import Path

import pytest
import yaml

from kz_daemon.intake import admit
from kz_daemon.ops.runtime import init_state_dir
from kz_daemon.ops.service import Zoo
from kz_runner.contract import tarball as tarball_module
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


@pytest.mark.parametrize("kernel_id", [AXPY_ID, "cpu/Elementwise/Axpy/fp32/another_impl"],
                         ids=["existing-kernel", "new-kernel"])
def test_a_spooled_package_is_read_once_and_its_desc_and_benchmark_parsed_once(tmp_path, monkeypatch, kernel_id):
    """One pass over the tarball, one YAML parse of desc.yaml, one ast parse of benchmark.py per intake.

    The validation, the locked harness, the frozen check at HEAD and the static rules all
    read the one package record; an existing kernel's HEAD desc.yaml has the submitted
    bytes, so its parse is shared too.
    """
    config = init_state_dir(tmp_path / "kz", seed_from=EXAMPLES)
    zoo = Zoo(config)
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
    finally:
        zoo.store.close()
