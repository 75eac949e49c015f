"""The one deterministic tar.gz writer: fixed metadata, sorted members, stable bytes for pack and runner."""
from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

from kz_daemon.config.settings import DaemonLimits
from kz_daemon.queue.leases import build_runner_tarball
from kz_runner.contract.pack import build_tarball
from kz_runner.contract.targz import deterministic_targz

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

ENTRIES = {
    "k": ("dir", 0o700, b""),
    "k/run.sh": ("file", 0o775, b"#!/bin/sh\n"),
    "k/a.py": ("file", 0o600, b"x = 1\n"),
    "k/src": ("dir", 0o755, b""),
}


def test_bytes_are_pinned():
    # these bytes were produced by both former writers (kz pack's and the runner tarball's);
    # a change here changes every package's archive hash
    data = deterministic_targz(ENTRIES)
    assert hashlib.sha256(data).hexdigest() == "895cc39f00e8eb2e120827a664abe112a6c7635f680d68f7d30552d9009980bc"


def test_metadata_is_fixed_and_members_sorted():
    data = deterministic_targz(dict(reversed(list(ENTRIES.items()))))
    assert data == deterministic_targz(ENTRIES)
    header = data[:10]
    assert header[3] == 0 and header[4:8] == b"\0\0\0\0"  # no FNAME flag, mtime 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        infos = tar.getmembers()
        assert [i.name for i in infos] == sorted(ENTRIES)
        assert {i.name: i.mode for i in infos} == {"k": 0o755, "k/a.py": 0o644, "k/run.sh": 0o755, "k/src": 0o755}
        assert all(i.mtime == 0 and i.uid == 0 and i.gid == 0 and i.uname == "" and i.gname == "" for i in infos)
        assert tar.extractfile("k/run.sh").read() == b"#!/bin/sh\n"


def test_runner_tarball_of_a_pack_is_the_pack_plus_the_scorecard(tmp_path):
    pkg = EXAMPLES / "cpu" / "Elementwise" / "Axpy" / "fp32" / "numpy_ref"
    kid = "cpu/Elementwise/Axpy/fp32/numpy_ref"
    packed, _files = build_tarball(pkg, kid)
    path = tmp_path / "p.tar.gz"
    path.write_bytes(packed)
    runner = build_runner_tarball(path, kid, b"kernel_id: x\n", DaemonLimits())
    with tarfile.open(fileobj=io.BytesIO(packed), mode="r:gz") as tar:
        entries = {i.name: ("dir" if i.isdir() else "file", i.mode,
                            b"" if i.isdir() else tar.extractfile(i).read()) for i in tar.getmembers()}
    assert deterministic_targz(entries) == packed
    entries[f"{kid}/.kernel_package/bench_result.yaml"] = ("file", 0o644, b"kernel_id: x\n")
    assert deterministic_targz(entries) == runner
