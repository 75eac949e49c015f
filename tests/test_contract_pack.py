"""``kz pack`` and pack_package: deterministic archives, bench_result left out, invalid packages refused."""
from __future__ import annotations

import hashlib
import os
import shutil
import tarfile

from kz_daemon.cli import main
from kz_runner.contract.pack import pack_kernel_id, pack_package
from kz_runner.contract.validate import validate_tarball
from tests.helpers.contract_fixtures import DEFAULT_ID, NEWCOMER, NEWCOMER_ID, copy_newcomer, mark_repo, write_package


def sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_same_package_same_sha_whatever_the_mtimes_and_modes(tmp_path):
    pkg = copy_newcomer(tmp_path / "a")
    first = pack_package(pkg, tmp_path / "one.tar.gz")
    assert first.path is not None, [p.render() for p in first.report.problems]
    for path in pkg.rglob("*"):
        os.utime(path, (1_000_000, 1_000_000 + hash(path.name) % 1000))
    os.chmod(pkg / "src" / "ref_mha.py", 0o664)
    second = pack_package(pkg, tmp_path / "two.tar.gz")
    moved = tmp_path / "elsewhere" / NEWCOMER_ID
    shutil.copytree(pkg, moved)
    third = pack_package(moved, tmp_path / "three.tar.gz")
    assert first.sha256 == second.sha256 == third.sha256 == sha(tmp_path / "one.tar.gz")
    (pkg / "src" / "ref_mha.py").write_text("# changed\n")
    assert pack_package(pkg, tmp_path / "four.tar.gz").sha256 != first.sha256


def test_archive_layout(tmp_path):
    pkg = copy_newcomer(tmp_path)
    (pkg / "src" / "__pycache__").mkdir()
    (pkg / "src" / "__pycache__" / "ref_mha.cpython-311.pyc").write_bytes(b"\0")
    (pkg / "src" / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(pkg / "src" / "run.sh", 0o775)
    result = pack_package(pkg, tmp_path / "p.tar.gz")
    with tarfile.open(result.path) as tf:
        members = tf.getmembers()
    names = [m.name for m in members]
    assert names[0] == NEWCOMER_ID
    assert names == [NEWCOMER_ID] + sorted(names[1:])
    assert f"{NEWCOMER_ID}/.kernel_package/bench_result.yaml" not in names
    assert not any("__pycache__" in n for n in names)
    assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 and m.uname == "" and m.gname == "" for m in members)
    modes = {m.name.rsplit("/", 1)[-1]: m.mode for m in members}
    assert modes["run.sh"] == 0o755 and modes["ref_mha.py"] == 0o644 and modes["src"] == 0o755
    raw = open(result.path, "rb").read()
    assert raw[4:8] == b"\0\0\0\0" and raw[3] & 0x08 == 0  # gzip mtime 0, no FNAME field
    assert validate_tarball(result.path, result.path.name, kernel_id=NEWCOMER_ID).valid


def test_kernel_id_sources(tmp_path):
    repo = mark_repo(tmp_path / "repo")
    pkg = write_package(repo)
    assert pack_kernel_id(pkg, "x/y") == ("x/y", "argument")
    assert pack_kernel_id(pkg)[0] == DEFAULT_ID  # from bench_result.yaml
    (pkg / ".kernel_package" / "bench_result.yaml").unlink()
    kernel_id, source = pack_kernel_id(pkg)
    assert kernel_id == DEFAULT_ID and source.startswith("path under")
    # without bench_result.yaml it still packs (the file is never packed anyway)
    assert pack_package(pkg, tmp_path / "p.tar.gz").path is not None


def test_refuses_invalid_package_and_writes_nothing(tmp_path, capsys):
    pkg = write_package(mark_repo(tmp_path / "repo"))
    (pkg / "src" / "axpy.py").unlink()
    out = tmp_path / "p.tar.gz"
    assert main(["pack", str(pkg), "-o", str(out)]) == 1
    assert not out.exists()
    assert "REFERENCE_SOURCE_MISSING" in capsys.readouterr().err


def test_refuses_links(tmp_path):
    pkg = write_package(mark_repo(tmp_path / "repo"))
    (pkg / "src" / "l.py").symlink_to("axpy.py")
    result = pack_package(pkg, tmp_path / "p.tar.gz")
    assert result.path is None and [p.code for p in result.report.errors] == ["PACKAGE_SYMLINK"]


def test_cli_prints_path_and_sha(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["pack", str(NEWCOMER)]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    expected = tmp_path / (NEWCOMER_ID.replace("/", "__") + ".tar.gz")
    assert line.startswith(expected.name) and f"sha256={sha(expected)}" in line
    assert main(["pack", "--json", str(NEWCOMER), "-o", "x.tar.gz"]) == 0
    assert '"sha256": "' + sha(expected) in capsys.readouterr().out


def test_cli_usage_errors(tmp_path, capsys):
    assert main(["pack", str(tmp_path / "nope")]) == 2
    pkg = write_package(tmp_path, "loose")
    (pkg / ".kernel_package" / "bench_result.yaml").unlink()
    assert main(["pack", str(pkg)]) == 2
    assert "--kernel-id" in capsys.readouterr().err
    assert main(["pack", str(NEWCOMER), "-o", str(tmp_path / "x.zip")]) == 2
