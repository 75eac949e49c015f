"""The guide's own commands run verbatim: ``python -m kernel_zoo.cli.validate_package`` and ``indexer_now``."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile

from tests.helpers.contract_fixtures import ROOT

EXAMPLE_ID = "cpu/Elementwise/Axpy/fp32/numpy_ref"


def run(args: list[str], cwd, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120)


def kz(args: list[str], cwd) -> subprocess.CompletedProcess:
    return run(["-m", "kz_daemon.cli", *args], cwd)


def test_validate_package_is_kz_validate(tmp_path):
    work = tmp_path / "clean"
    work.mkdir()
    pkg = ROOT / "examples" / EXAMPLE_ID
    guide = run(["-m", "kernel_zoo.cli.validate_package", str(pkg)], work)
    assert guide.returncode == 0, guide.stderr
    assert guide.stdout == kz(["validate", str(pkg)], work).stdout
    assert f"VALID: {EXAMPLE_ID}" in guide.stdout
    archive = work / "p.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(pkg, arcname=EXAMPLE_ID, filter=lambda i: None if i.name.endswith("bench_result.yaml") else i)
    assert run(["-m", "kernel_zoo.cli.validate_package", str(archive)], work).returncode == 0
    broken = tmp_path / "repo" / EXAMPLE_ID
    shutil.copytree(pkg, broken)
    (broken / ".kernel_package" / "benchmark.py").unlink()
    bad = run(["-m", "kernel_zoo.cli.validate_package", str(broken), "--kernel-id", EXAMPLE_ID], work)
    assert bad.returncode == 1 and "FILE_MISSING" in bad.stdout
    assert run(["-m", "kernel_zoo.cli.validate_package", str(work / "nope")], work).returncode == 2


def test_indexer_now_honours_the_guide_environment(tmp_path):
    work = tmp_path / "clean"
    work.mkdir()
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "examples", repo)
    index = tmp_path / "i.json"
    done = run(["-m", "kernel_zoo.cli.indexer_now"], work, XDG_CACHE_HOME=str(tmp_path / "cache"),
               KERNEL_ZOO_KERNEL_REPO_PATH=str(repo), KERNEL_ZOO_INDEX_PATH=str(index))
    assert done.returncode == 0, done.stderr
    doc = json.loads(index.read_text())
    ids = [k["kernel_id"] for k in doc["kernels"]]
    assert EXAMPLE_ID in ids and all(k["valid"] for k in doc["kernels"])
    assert not (work / "index.json").exists()
    assert run(["-m", "kernel_zoo.cli.indexer_now"], work,
               KERNEL_ZOO_KERNEL_REPO_PATH=str(tmp_path / "missing"), KERNEL_ZOO_INDEX_PATH=str(index)).returncode == 2
